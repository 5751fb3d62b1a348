"""GGUF files (llama.cpp, Ollama, LM Studio) read as storelab checkpoints.

``storelab.checkpoint.load(path)``, ``loader.plan(path)``, ``read_model_config(path)`` and
``config_only.read_hf_config(path)`` take a ``.gguf`` file (or any shard of a split one,
``name-00001-of-00003.gguf``) as they take a Hugging Face folder. A GGUF becomes

1. a transformers-style config dict (``model_type`` and the fields transformers' config.json
   has), made from the GGUF metadata by its architecture's ``config`` function, so the
   families in ``storelab/checkpoint/families`` read it unchanged; ``dtype`` is float32 (the
   weights are quantized blocks beside F32 norms, dequantized to fp32; ``load(..., dtype=)``
   narrows them; ``general.file_type`` is kept under ``hf["gguf"]`` and not used);
2. a ``GGUFShards`` (a ``Shards``): the GGUF's tensors under transformers' names and shapes,
   dequantized on read with ``gguf.quants.dequantize`` into fp32 in transformers' layout,
   llama.cpp's conversions undone (q/k row permutation, Gemma's 1 + w norms, 3-D experts, split
   or fused tensors).

Header-only work (``read_model_config``, ``gguf_stored_bytes``, ``plan(..., device="meta")``)
reads no tensor byte (``header.py``, tens of milliseconds at any size), with one declared exception: an
architecture's ``config_tensors``, small tensors whose values its config needs (llama's
``rope_freqs.weight``, Llama 3's RoPE scaling as 64 factors: ``rope_freqs.py``), read through
``Meta.values`` (at most 64 KiB, only the names declared).

## The contract: adding an architecture

One ``Arch`` (``arch.py``) in the ``ARCHS`` tuple of a module of this package whose name is in
``registry._MODULES`` (``archs.py`` holds the plain decoders; a new file for a new group):

    Arch(arch="qwen3moe",            # general.architecture, as gguf-py's MODEL_ARCH_NAMES spells it
         model_type="qwen3_moe",     # the transformers model_type its config becomes (a family reads it)
         config=fn(meta) -> dict,    # transformers config fields from the metadata (Meta: typed getters,
                                     #   "expert_count" means "{arch}.expert_count"; errors name file and key;
                                     #   common_config(meta) gives the fields every decoder has)
         rules=fn(hf) -> [Rule],     # given that config, each transformers tensor from GGUF tensors
         ignored=(regex, ...),       # GGUF tensors read by nothing on purpose
         config_tensors=(name, ...)) # small tensors ``config`` reads the values of (``meta.values(name)``)

    rule(hf_name, *gguf_names, fn=None, what="")
        hf_name, gguf_names: templates, "{bid}" = layer index (expanded for num_hidden_layers);
        GGUF names from gguf-py's constants: g(MODEL_TENSOR.ATTN_Q) == "blk.{bid}.attn_q.weight",
        g(MODEL_TENSOR.ATTN_Q, ".bias"); fn(*pieces) -> transformers' tensor (fp32, torch order,
        also run on meta tensors for the shapes); ``what`` says the transform in error messages.
        A rule whose GGUF tensors are all absent is skipped (optional biases, a tied head); one with
        some absent is an error naming the missing tensor; the first complete rule for an hf name wins.
        Every GGUF tensor must be read by a rule or match ``ignored``, or loading names it.

Helpers: ``unpermute(n_head)`` (llama's q/k), ``minus_one`` (Gemma's norms), ``cat_rows`` (experts'
gate and up), ``rope_scaling(meta)``. An architecture not in ``GGUF_ARCHS`` is refused with a
CheckpointError naming ``general.architecture`` and listing the known ones.

Files: ``header.py`` (the format, split shards, ``is_gguf``), ``arch.py`` (the declarations),
``registry.py`` (``GGUF_ARCHS``, ``read_gguf_config``), ``tensors.py`` (``GGUFShards``,
``gguf_stored_bytes``), ``dequant.py`` (one tensor's bytes -> fp32), ``rope_freqs.py`` (Llama 3's
scaling from its factors), ``archs.py`` (llama, qwen2, qwen2moe, qwen3, qwen3moe, gemma2, gemma3,
lfm2, gpt-oss, mamba).
"""

from storelab.checkpoint.gguf.arch import Arch, Meta, Rule, common_config, g, minus_one, rope_scaling, rule, unpermute
from storelab.checkpoint.gguf.header import is_gguf, read_header
from storelab.checkpoint.gguf.registry import GGUF_ARCHS, read_gguf_config
from storelab.checkpoint.gguf.tensors import DEQUANTIZED, GGUFShards, gguf_stored_bytes

__all__ = ["GGUF_ARCHS", "Arch", "Rule", "Meta", "rule", "g", "unpermute", "minus_one", "common_config",
           "rope_scaling", "is_gguf", "read_header", "read_gguf_config", "GGUFShards", "gguf_stored_bytes",
           "DEQUANTIZED"]
