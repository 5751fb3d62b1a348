"""Youtu-LLM (Tencent Youtu, 2025; ``youtu``): DeepSeek-V3's multi-head latent attention in a dense Llama decoder
(transformers 5.23's ``YoutuForCausalLM``).

* attention: MLA (DeepSeek-V2, arXiv 2405.04434; ``deepseek_v3.py``'s reader): queries through ``q_lora_rank``
  (or one ``q_proj``), keys and values from a ``kv_lora_rank`` latent plus one shared rotated key of
  ``qk_rope_head_dim``, RoPE on interleaved pairs (``rope_interleave``, default true);
* channel: a SwiGLU MLP of ``intermediate_size`` on every layer (no experts);
* pre-norm RMSNorms; tied embeddings by default.

Parameters per layer: MLA's projections and its two latent norms, the MLP's 3*D*I, two d_model norms; the state
is the latent and the rotated key per token. Names: transformers' ``DeepseekV3Attention`` and ``mlp.*``.
"""

from __future__ import annotations

from storelab.checkpoint.families._reader import FULL, Decl, family
from storelab.checkpoint.families.deepseek_v3 import mla, mla_table

FAMILY = family(Decl(name="youtu", model_types=("youtu",), title="Youtu-LLM (checkpoint)", token=mla,
                     token_table=mla_table, tied=True, types=lambda t, n: [FULL] * n,
                     stores=("mla", "ffn", "residual")))
