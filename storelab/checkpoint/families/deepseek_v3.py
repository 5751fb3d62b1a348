"""DeepSeek-V3 / R1 / V3.1 (arXiv 2412.19437) and the Kimi K2 line (Moonshot; ``kimi_k2``, and Kimi K2.5's
``kimi_k25`` wrapper with the text model under ``text_config``): multi-head latent attention (MLA,
DeepSeek-V2, arXiv 2405.04434) on every layer, ``first_k_dense_replace`` dense layers, then experts
chosen by sigmoid scores plus the routing bias (``topk_method`` "noaux_tc") among the ``topk_group``
best of ``n_group`` groups, ``n_shared_experts`` shared experts, ``routed_scaling_factor``.

MLA's tensors keep transformers' ``DeepseekV3Attention`` names (``q_a_proj``, ``q_a_layernorm``,
``q_b_proj`` or ``q_proj``, ``kv_a_proj_with_mqa``, ``kv_a_layernorm``, ``kv_b_proj``, ``o_proj``); the
experts ``mlp.experts.{e}.gate_proj/up_proj/down_proj`` (or 3-D), the router ``mlp.gate.weight`` and
its ``e_score_correction_bias``. The MTP layer stored after the last decoder layer is ignored; FP8
block-quantized weights are dequantized by the loader. YaRN (V3's ``rope_scaling``) is read for
accounting; running needs plain RoPE (``Family.runs``).
"""

from storelab.checkpoint.families._common import mla_entries
import math

from storelab.checkpoint.families._reader import RUNS_ROPE, Decl, family, rope_of


def mla(t, i, kind, decl, D, eps):
    from storelab.stores.mla import MLAConfig

    if t.bool("attention_bias", default=False):
        raise t._err("attention_bias", "true is not supported (storelab's MLA projections have no biases)")
    rp = rope_of(t)
    nope, rope = t.int("qk_nope_head_dim"), t.int("qk_rope_head_dim")
    scale = None
    if rp.scaling is not None and rp.scaling.get("mscale_all_dim"):  # YaRN: the logits' scale times mscale^2
        m = 0.1 * rp.scaling["mscale_all_dim"] * math.log(rp.scaling["factor"]) + 1.0 if rp.scaling["factor"] > 1 else 1.0
        scale = (nope + rope) ** -0.5 * m * m
    return MLAConfig(d_model=D, n_heads=t.int("num_attention_heads", minimum=1),
                     kv_lora_rank=t.int("kv_lora_rank", minimum=1), qk_nope_head_dim=nope, qk_rope_head_dim=rope,
                     v_head_dim=t.int("v_head_dim", minimum=1), q_lora_rank=t.int("q_lora_rank", default=None, minimum=1),
                     rope_theta=rp.theta, rope_scaling=rp.scaling if rp.kind in RUNS_ROPE[1:] else None,
                     softmax_scale=scale, rope_interleaved=t.bool("rope_interleave", default=True), norm_eps=eps)


def mla_table(tab, o, a, tok, names):
    mla_entries(tab, o, a, tok)


FAMILY = family(Decl(stores=("mla", "ffn", "moe", "residual"),
                     name="deepseek_v3", model_types=("deepseek_v3", "kimi_k2", "kimi_k25"),
                     title="DeepSeek-V3 / Kimi K2 (checkpoint)", router="sigmoid", router_bias=True, token=mla, token_table=mla_table,
                     mtp=True))
