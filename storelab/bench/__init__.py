"""``storelab bench``: ours and a peer in the same process, reported as ratios.

Absolute times on a shared machine are noisy; every figure here is paired with a
measurement taken in the same run (the peer's time, or the machine's own fp32
matrix-product rate), and the ratio is what a reader should compare.

* ``timing``  - interleaved rounds (``compare``), the matmul yardstick;
* ``kernels`` - chunked Gated DeltaNet and KDA against transformers' functions, FLOPs counted;
* ``decode``  - one token's step through each store at 1,024 and 65,536 tokens of context;
* ``prefill`` - the tiny zoo models' chunked prefill: peak memory (the tensors' and the
  process's) against the accounting, tokens per second against transformers' tiny model
  of the same family;
* ``train``   - training under autograd: the delta ops' forward + backward against transformers'
  (FLOPs counted, the matmul rate beside them), the tiny zoo models' training steps against
  the prefill bench's peers, and a training step's peak memory at two lengths; not part of ``all``;
* ``gpu``     - ``python -m storelab.bench.gpu``: the prepared device check of the fla dispatch
  (our chunked rules against fla's Triton kernels, and prefill on CUDA); not part of ``all``.
"""
