"""Mixtral (Mistral AI, arXiv 2401.04088): Mistral's attention, eight experts of ``intermediate_size``
each, two chosen per token by a softmax router renormalised over the two. Published checkpoints name
the experts ``block_sparse_moe.experts.{e}.w1 / w3 / w2``; transformers v5 writes them as 3-D
``mlp.experts.gate_up_proj`` / ``down_proj``: the shared table reads either.
"""

from storelab.checkpoint.families._reader import Decl, family

FAMILY = family(Decl(name="mixtral", model_types=("mixtral",), title="Mixtral (checkpoint)", eps=1e-5))
