"""GGUF architectures of the MLA and sigmoid-routed MoE lines: ``deepseek2`` (DeepSeek-V2 / V3 / R1, Kimi K2),
``glm4moe`` (GLM-4.5 / 4.6 / 4.7) and ``minimax-m2``, read back into transformers' ``deepseek_v2`` /
``deepseek_v3``, ``glm4_moe`` and ``minimax_m2``.

What llama.cpp's converter does (``conversion/deepseek.py`` ``DeepseekV2Model``, ``conversion/glm.py``
``Glm4MoeModel``, ``conversion/minimax.py`` ``MiniMaxM2Model``; ``conversion/base.py``
``TextModel.set_gguf_parameters``) and how it is undone:

* ``deepseek2`` writes MLA as MQA: ``attention.head_count_kv`` = 1, ``attention.key_length`` = kv_lora_rank +
  qk_rope_head_dim and ``value_length`` = kv_lora_rank; the per-head sizes are ``attention.key_length_mla``
  (nope + rope) and ``value_length_mla`` (v); ``rope.dimension_count`` = qk_rope_head_dim. Older files
  without the ``_mla`` keys hold the per-head sizes in ``key_length`` / ``value_length`` and an unsplit
  ``attn_kv_b``. transformers' ``num_key_value_heads`` is the query heads (MLA decompresses to MHA).
* ``kv_b_proj`` [H (nope + v), kv_lora] is split per head into ``attn_k_b`` [H, kv_lora, nope] (transposed)
  and ``attn_v_b`` [H, v, kv_lora]; joined back here.
* V2 or V3: the converter writes ``expert_gating_func`` from config.json's ``scoring_func`` (V3 and its
  descendants say sigmoid); without it llama.cpp takes softmax (V2). Sigmoid -> ``deepseek_v3``
  (``topk_method`` noaux_tc); softmax -> ``deepseek_v2`` with ``group_limited_greedy`` when
  ``expert_group_count`` > 1, else ``greedy`` (the two published V2 settings; llama.cpp keeps no
  ``topk_method``). YaRN's ``mscale_all_dim`` is written as ``rope.scaling.yarn_log_multiplier`` =
  0.1 mscale_all_dim; ``mscale`` is not written, and llama.cpp's graph takes it equal to ``mscale_all_dim``
  (as every published V3 config has it), so it is read back so.
* Experts: stacked per layer (``ffn_{gate,up,down}_exps``), gate and up joined back into transformers'
  ``gate_up_proj``; MiniMax-M2's ``w1`` / ``w3`` / ``w2`` likewise. ``e_score_correction_bias`` is
  ``exp_probs_b.bias``.
* MTP layers (``nextn_predict_layers``, appended after the decoder) keep their block's GGUF names under
  ``model.layers.{n + k}.``, which these families ignore (layers past ``num_hidden_layers``).
"""

from __future__ import annotations

import torch
from gguf.constants import MODEL_ARCH, MODEL_TENSOR as T, MODEL_TENSORS, TENSOR_NAMES
from torch import Tensor

from storelab.checkpoint.gguf.arch import LAYER, Arch, Meta, common_config, g, rule

__all__ = ["ARCHS"]


def _drop_mtp(m: Meta, hf: dict) -> dict:
    mtp = m.int("nextn_predict_layers", 0)
    if mtp >= hf["num_hidden_layers"]:
        raise m._err("nextn_predict_layers", f"fewer than block_count ({hf['num_hidden_layers']})", mtp)
    hf["num_hidden_layers"] -= mtp
    hf["num_nextn_predict_layers"] = mtp
    return hf


def mtp_rules(hf: dict, arch: MODEL_ARCH) -> list:
    """The MTP blocks' tensors under ``model.layers.{n + k}.<GGUF name after the block>`` (read by nothing)."""
    n, count = hf["num_hidden_layers"], hf.get("num_nextn_predict_layers", 0)
    out = []
    for b in range(n, n + count):
        for kind in MODEL_TENSORS[arch]:
            name = TENSOR_NAMES[kind]
            if "{bid}" in name:
                for sfx in (".weight", ".bias", ""):
                    gname = name.format(bid=b) + sfx
                    out.append(rule(f"model.layers.{b}.{gname.split('.', 2)[2]}", gname))
    return out


def _moe_fields(m: Meta, hf: dict) -> None:
    hf.update(n_routed_experts=m.int("expert_count", minimum=1), num_experts_per_tok=m.int("expert_used_count", minimum=1),
              moe_intermediate_size=m.int("expert_feed_forward_length", minimum=1),
              n_shared_experts=m.int("expert_shared_count", 0), first_k_dense_replace=m.int("leading_dense_block_count", 0),
              routed_scaling_factor=m.float("expert_weights_scale", 1.0),
              norm_topk_prob=bool(m.raw("expert_weights_norm", False)),
              n_group=m.int("expert_group_count", 1, minimum=1), topk_group=m.int("expert_group_used_count", 1, minimum=1))


def _gating(m: Meta, default: str) -> str:
    """``expert_gating_func`` (gguf-py ExpertGatingFuncType: 1 softmax, 2 sigmoid)."""
    v = m.int("expert_gating_func", {"softmax": 1, "sigmoid": 2}[default])
    if v not in (1, 2):
        raise m._err("expert_gating_func", "1 (softmax) or 2 (sigmoid)", v)
    return "softmax" if v == 1 else "sigmoid"


# ---- deepseek2 ---------------------------------------------------------------------------------------------

def deepseek2_config(m: Meta) -> dict:
    hf = _drop_mtp(m, common_config(m))
    H = hf["num_attention_heads"]
    rope = m.int("rope.dimension_count", minimum=1)
    if m.has("attention.key_length_mla"):
        qk, v = m.int("attention.key_length_mla", minimum=1), m.int("attention.value_length_mla", minimum=1)
    else:
        qk, v = m.int("attention.key_length", minimum=1), m.int("attention.value_length", minimum=1)
    hf.pop("head_dim", None)
    hf.update(num_key_value_heads=H, kv_lora_rank=m.int("attention.kv_lora_rank", minimum=1),
              q_lora_rank=m.int("attention.q_lora_rank", minimum=1) if m.has("attention.q_lora_rank") else None,
              qk_rope_head_dim=rope, qk_nope_head_dim=qk - rope, v_head_dim=v, head_dim=rope, hidden_act="silu")
    _moe_fields(m, hf)
    sigmoid = _gating(m, "softmax") == "sigmoid"
    hf["scoring_func"] = "sigmoid" if sigmoid else "softmax"
    hf["model_type"] = "deepseek_v3" if sigmoid else "deepseek_v2"
    hf["topk_method"] = "noaux_tc" if sigmoid else ("group_limited_greedy" if hf["n_group"] > 1 else "greedy")
    if "rope_scaling" in hf:
        rs = hf["rope_scaling"]
        if rs["rope_type"] != "yarn":
            raise m._err("rope.scaling.type", "yarn or none (DeepSeek's published rope)", rs["rope_type"])
        mscale = m.float("rope.scaling.yarn_log_multiplier", 0.0) / 0.1
        rs.update(mscale=mscale, mscale_all_dim=mscale)
        for key, gk in (("beta_fast", "rope.scaling.yarn_beta_fast"), ("beta_slow", "rope.scaling.yarn_beta_slow")):
            if m.has(gk):
                rs[key] = m.float(gk)
        hf["rope_parameters"] = dict(rs, rope_theta=hf["rope_theta"])
    return hf


def _kv_b(H: int):
    """``attn_k_b`` [H, kv_lora, nope] and ``attn_v_b`` [H, v, kv_lora] -> ``kv_b_proj`` [H (nope + v), kv_lora]."""

    def fn(k_b: Tensor, v_b: Tensor) -> Tensor:
        return torch.cat([k_b.transpose(1, 2), v_b], dim=1).reshape(-1, k_b.shape[1])

    return fn


def _experts_rules(x: str) -> list:
    """transformers' 3-D experts at ``x`` from the stacked GGUF ones (or llama.cpp's fused gate-up)."""
    return [rule(f"{x}.gate_up_proj", g(T.FFN_GATE_UP_EXP)),
            rule(f"{x}.gate_up_proj", g(T.FFN_GATE_EXP), g(T.FFN_UP_EXP), fn=lambda a, b: torch.cat([a, b], dim=1),
                 what="gate and up experts stacked"),
            rule(f"{x}.down_proj", g(T.FFN_DOWN_EXP))]


def _mlp_rules(mlp: str) -> list:
    out = [rule(f"{mlp}.gate.weight", g(T.FFN_GATE_INP)),
           rule(f"{mlp}.gate.e_score_correction_bias", g(T.FFN_EXP_PROBS_B, ".bias"))]
    out += _experts_rules(f"{mlp}.experts")
    for p, dense, shared in (("gate_proj", T.FFN_GATE, T.FFN_GATE_SHEXP), ("up_proj", T.FFN_UP, T.FFN_UP_SHEXP),
                             ("down_proj", T.FFN_DOWN, T.FFN_DOWN_SHEXP)):
        out += [rule(f"{mlp}.{p}.weight", g(dense)), rule(f"{mlp}.shared_experts.{p}.weight", g(shared))]
    return out


def _base_rules() -> list:
    L = LAYER
    return [rule("model.embed_tokens.weight", g(T.TOKEN_EMBD)), rule("lm_head.weight", g(T.OUTPUT)),
            rule("model.norm.weight", g(T.OUTPUT_NORM)), rule(f"{L}.input_layernorm.weight", g(T.ATTN_NORM)),
            rule(f"{L}.post_attention_layernorm.weight", g(T.FFN_NORM)),
            rule(f"{L}.post_attention_layernorm.weight", g(T.ATTN_POST_NORM))]


def deepseek2_rules(hf: dict) -> list:
    a = f"{LAYER}.self_attn"
    rules = _base_rules() + _mlp_rules(f"{LAYER}.mlp") + [
        rule(f"{a}.q_proj.weight", g(T.ATTN_Q)), rule(f"{a}.q_a_proj.weight", g(T.ATTN_Q_A)),
        rule(f"{a}.q_a_layernorm.weight", g(T.ATTN_Q_A_NORM)), rule(f"{a}.q_b_proj.weight", g(T.ATTN_Q_B)),
        rule(f"{a}.kv_a_proj_with_mqa.weight", g(T.ATTN_KV_A_MQA)),
        rule(f"{a}.kv_a_layernorm.weight", g(T.ATTN_KV_A_NORM)),
        rule(f"{a}.kv_b_proj.weight", g(T.ATTN_KV_B)),
        rule(f"{a}.kv_b_proj.weight", g(T.ATTN_K_B), g(T.ATTN_V_B), fn=_kv_b(hf["num_attention_heads"]),
             what="k_b transposed back and joined with v_b per head"),
        rule(f"{a}.o_proj.weight", g(T.ATTN_OUT))]
    return rules + mtp_rules(hf, MODEL_ARCH.DEEPSEEK2)


# ---- glm4moe -----------------------------------------------------------------------------------------------

def glm4moe_config(m: Meta) -> dict:
    hf = _drop_mtp(m, common_config(m))
    _moe_fields(m, hf)
    if _gating(m, "sigmoid") != "sigmoid":
        raise m._err("expert_gating_func", "2 (sigmoid: GLM-4.5's router)", m.raw("expert_gating_func"))
    rot = m.int("rope.dimension_count", hf["head_dim"] // 2, minimum=1)
    hf.update(partial_rotary_factor=rot / hf["head_dim"], hidden_act="silu",
              use_qk_norm="blk.0.attn_q_norm.weight" in m.shapes, attention_bias="blk.0.attn_q.bias" in m.shapes)
    hf["rope_parameters"] = {"rope_type": "default", "rope_theta": hf.pop("rope_theta"),
                             "partial_rotary_factor": hf.pop("partial_rotary_factor")}
    if "rope_scaling" in hf:
        raise m._err("rope.scaling.type", "none (GLM-4.5's published rope)", hf["rope_scaling"]["rope_type"])
    return hf


def _attn_rules(a: str) -> list:
    out = [rule(f"{a}.q_norm.weight", g(T.ATTN_Q_NORM)), rule(f"{a}.k_norm.weight", g(T.ATTN_K_NORM))]
    for p, kind in (("q_proj", T.ATTN_Q), ("k_proj", T.ATTN_K), ("v_proj", T.ATTN_V), ("o_proj", T.ATTN_OUT)):
        out += [rule(f"{a}.{p}.weight", g(kind)), rule(f"{a}.{p}.bias", g(kind, ".bias"))]
    return out


def glm4moe_rules(hf: dict) -> list:
    return (_base_rules() + _mlp_rules(f"{LAYER}.mlp") + _attn_rules(f"{LAYER}.self_attn")
            + mtp_rules(hf, MODEL_ARCH.GLM4_MOE))


# ---- minimax-m2 --------------------------------------------------------------------------------------------

def minimax_m2_config(m: Meta) -> dict:
    hf = _drop_mtp(m, common_config(m))
    if _gating(m, "sigmoid") != "sigmoid":
        raise m._err("expert_gating_func", "2 (sigmoid: MiniMax-M2's router)", m.raw("expert_gating_func"))
    rot = m.int("rope.dimension_count", minimum=1)
    hf.update(num_local_experts=m.int("expert_count", minimum=1), num_experts_per_tok=m.int("expert_used_count", minimum=1),
              intermediate_size=m.int("expert_feed_forward_length", minimum=1), rotary_dim=rot, hidden_act="silu",
              scoring_func="sigmoid", use_qk_norm="blk.0.attn_q_norm.weight" in m.shapes)
    hf["rope_parameters"] = {"rope_type": "default", "rope_theta": hf.pop("rope_theta"),
                             "partial_rotary_factor": rot / hf["head_dim"]}
    if "rope_scaling" in hf:
        raise m._err("rope.scaling.type", "none (MiniMax-M2's published rope)", hf["rope_scaling"]["rope_type"])
    return hf


def minimax_m2_rules(hf: dict) -> list:
    x = f"{LAYER}.block_sparse_moe"
    return (_base_rules() + _attn_rules(f"{LAYER}.self_attn") + _experts_rules(f"{x}.experts")
            + [rule(f"{x}.gate.weight", g(T.FFN_GATE_INP)),
               rule(f"{x}.e_score_correction_bias", g(T.FFN_EXP_PROBS_B, ".bias"))]
            + mtp_rules(hf, MODEL_ARCH.MINIMAXM2))


ARCHS = (
    Arch("deepseek2", "deepseek_v3", deepseek2_config, deepseek2_rules,
         doc="DeepSeek-V2 / V3 (MLA, MoE); model_type deepseek_v2 when the router is softmax"),
    Arch("glm4moe", "glm4_moe", glm4moe_config, glm4moe_rules, doc="GLM-4.5 / 4.6 / 4.7 MoE"),
    Arch("minimax-m2", "minimax_m2", minimax_m2_config, minimax_m2_rules, doc="MiniMax-M2 MoE"),
)
