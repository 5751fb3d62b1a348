"""GLM-4.7-Flash (Z.ai; ``glm4_moe_lite``): DeepSeek-V3's multi-head latent attention (``DeepseekV3Attention``,
MLA, arXiv 2405.04434) on every layer with GLM-4.5's experts (``Glm4MoeMoE``).

* attention: MLA with ``q_lora_rank`` (or a plain ``q_proj`` when null), ``kv_lora_rank``, the
  ``qk_nope_head_dim`` + ``qk_rope_head_dim`` query/key heads and ``v_head_dim`` values, RoPE on the
  ``qk_rope_head_dim`` channels (interleaved pairs under ``rope_interleave``, true by default): deepseek_v3.py's
  ``mla``; the latent norms' eps is 1e-6 (``Glm4MoeLiteRMSNorm``'s default), not ``rms_norm_eps``;
* channel per ``mlp_layer_types`` (transformers' default: the first layer dense, the rest sparse): a SwiGLU MLP of
  ``intermediate_size``, or ``n_routed_experts`` experts of ``moe_intermediate_size`` chosen by sigmoid scores plus
  the routing bias (``e_score_correction_bias``) among ``topk_group`` of ``n_group`` groups, weights renormalised
  (``norm_topk_prob``) and times ``routed_scaling_factor`` (1.8), beside ``n_shared_experts`` shared experts;
* untied embeddings; MTP layers stored after the decoder's are ignored.

Parameters per layer: MLA's (see ``storelab.stores.mla``), the MLP's 3*D*I or the experts' E*3*D*I + E*D router
+ E bias + the shared 3*D*I*S; the state is MLA's latent and rotary key per token. Names: transformers'
``Glm4MoeLiteForCausalLM``, deepseek_v3.py's.
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Decl, Fields, rope_of
from storelab.checkpoint.families.deepseek_v3 import mla, mla_table

__all__ = ["FAMILY"]


def lite_mla(t: Fields, i: int, kind: str, decl: Decl, D: int, eps: float):
    if rope_of(t).partial != 1.0:  # transformers rotates head_dim (= qk_rope_head_dim) x the factor
        key = "rope_parameters.partial_rotary_factor" if t.has("rope_parameters") else "partial_rotary_factor"
        raise t._err(key, "must be 1 (storelab's MLA rotates all qk_rope_head_dim channels)")
    # the latent norms (q_a_layernorm, kv_a_layernorm) keep RMSNorm's default eps, 1e-6, whatever rms_norm_eps says
    return dataclasses.replace(mla(t, i, kind, decl, D, eps), norm_eps=1e-6)


DECL = Decl(name="glm4_moe_lite", model_types=("glm4_moe_lite",), title="GLM-4.7-Flash (checkpoint)", router="sigmoid",
            router_bias=True, eps=1e-5, token=lite_mla, token_table=mla_table, mtp=True,
            types=lambda t, n: [_reader.FULL] * n, stores=("mla", "ffn", "moe", "residual"))


def _defaults(hf: dict) -> dict:
    """``mlp_layer_types`` as ``Glm4MoeLiteConfig`` fills it when the file names none: the first layer dense."""
    t = _reader.text_fields(hf)
    if t.has("mlp_layer_types"):
        return hf
    n = t.int("num_hidden_layers", minimum=1)
    return dict(hf, mlp_layer_types=["dense"] + ["sparse"] * (n - 1))


FAMILY = Family(stores=DECL.stores, name=DECL.name, model_types=DECL.model_types,
                to_config=lambda hf: _reader.to_config(DECL, _defaults(hf)),
                table=lambda hf, cfg, names: _reader.table(DECL, _defaults(hf), cfg, names),
                ignored=lambda hf: _reader._ignored(DECL, hf), runs=lambda hf: _reader.runs(DECL, hf))
