"""Llama (Meta, arXiv 2302.13971; Llama 3, arXiv 2407.21783) and the plain decoders written in its
vocabulary: full attention with GQA and RoPE, a SwiGLU MLP, pre-norm RMSNorms. Everything is read by
the shared reader (``_reader.py``); Mistral adds a sliding window on every layer when
``sliding_window`` is set. Tensor names are transformers' (``model.layers.i.self_attn.q_proj`` ...).
"""

from storelab.checkpoint.families._reader import Decl, family

FAMILY = family(Decl(name="llama", model_types=("llama", "mistral", "ministral"),
                     title="Llama-style decoder (checkpoint)", eps=1e-6))
