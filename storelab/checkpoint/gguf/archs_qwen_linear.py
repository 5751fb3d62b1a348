"""GGUF architectures of the Gated DeltaNet hybrids: ``qwen3next`` (Qwen3-Next), ``qwen35`` (Qwen3.5 /
3.6 dense) and ``qwen35moe`` (Qwen3.5 MoE), read back into transformers' ``qwen3_next``,
``qwen3_5_text`` and ``qwen3_5_moe_text`` configs and tensors.

What llama.cpp's converter does (``conversion/qwen.py``: ``Qwen3NextModel``,
``_LinearAttentionVReorderBase``, ``Qwen3_5TextModel``, ``Qwen3_5MoeTextModel``, ``_QwenMtpMixin``;
``Qwen2MoeModel`` for the experts) and how each step is undone here:

* metadata: ``ssm.conv_kernel`` = ``linear_conv_kernel_dim``, ``ssm.state_size`` = ``linear_key_head_dim``,
  ``ssm.group_count`` = ``linear_num_key_heads``, ``ssm.time_step_rank`` = ``linear_num_value_heads``,
  ``ssm.inner_size`` = value head size x value heads, ``rope.dimension_count`` = head_dim x
  ``partial_rotary_factor``; the layer pattern as ``attention.recurrent_layers`` (one bool per layer, from
  ``layer_types``) or ``full_attention_interval``; ``block_count`` counts the MTP layers too
  (``nextn_predict_layers`` of them, at the end): transformers' ``num_hidden_layers`` is the difference, and
  the MTP layers' tensors are named ``mtp.layers.{k}...`` (ignored by the families, as transformers does);
* every RMSNorm weight but the Gated DeltaNet output norm is stored as 1 + w (transformers' Qwen3-Next
  norms compute (1 + w) x): w = stored - 1;
* ``A_log`` is stored as ``ssm_a`` = -exp(A_log): A_log = log(-ssm_a); ``dt_bias`` as ``ssm_dt.bias``;
  the convolution ``[C, 1, W]`` squeezed to ``[C, W]``;
* Qwen3-Next's ``in_proj_qkvz`` (per key head: q, k, then that head's value and gate rows) is split into
  ``attn_qkv`` (all q, all k, all v) and ``attn_gate`` (all z), re-interleaved here; ``in_proj_ba`` is kept
  as ``ssm_ba``;
* Qwen3.5 with fewer key than value heads: the value heads are reordered from grouped by key head
  ([G0 v0..v(r-1), G1 v0..]) to tiled ([G0 v0, G1 v0, ..., G0 v1, ...]) in the v rows of ``attn_qkv``,
  ``attn_gate``, ``ssm_beta``, ``ssm_alpha``, ``ssm_a``, ``ssm_dt``, the conv's v channels and the columns of
  ``ssm_out``; undone by the inverse permutation (``_untile``);
* experts: transformers' ``gate_up_proj`` [E, 2I, D] is split into ``ffn_gate_exps`` and ``ffn_up_exps``
  (or fused ``ffn_gate_up_exps``), ``down_proj`` kept.
"""

from __future__ import annotations

import torch
from gguf.constants import MODEL_TENSOR as T
from torch import Tensor

from storelab.checkpoint.gguf.arch import LAYER, Arch, Meta, common_config, g, minus_one, rule

__all__ = ["ARCHS", "qwen3next_config", "qwen35_config"]


def _layer_types(m: Meta, n: int) -> list[str]:
    """``layer_types`` from ``attention.recurrent_layers`` (llama.cpp's ``add_recurrent_layers``), else from
    ``full_attention_interval`` (every k-th layer full, as transformers fills it in)."""
    if m.has("attention.recurrent_layers"):
        flags = m.raw("attention.recurrent_layers")
        if not isinstance(flags, list) or len(flags) < n:
            raise m._err("attention.recurrent_layers", f"a list of at least {n} bools (one per layer)", flags)
        return ["linear_attention" if f else "full_attention" for f in flags[:n]]
    every = m.int("full_attention_interval", 4, minimum=1)
    return ["linear_attention" if (i + 1) % every else "full_attention" for i in range(n)]


def _linear_fields(m: Meta, hf: dict) -> dict:
    HV = m.int("ssm.time_step_rank", minimum=1)
    inner = m.int("ssm.inner_size", minimum=1)
    if inner % HV:
        raise m._err("ssm.inner_size", f"a multiple of ssm.time_step_rank ({HV})", inner)
    n = hf["num_hidden_layers"]
    rot = m.int("rope.dimension_count", hf["head_dim"], minimum=1)
    return {"linear_conv_kernel_dim": m.int("ssm.conv_kernel", minimum=1),
            "linear_key_head_dim": m.int("ssm.state_size", minimum=1),
            "linear_num_key_heads": m.int("ssm.group_count", minimum=1),
            "linear_num_value_heads": HV, "linear_value_head_dim": inner // HV,
            "layer_types": _layer_types(m, n), "hidden_act": "silu", "attention_bias": False,
            "partial_rotary_factor": rot / hf["head_dim"]}


def _base(m: Meta) -> dict:
    hf = common_config(m)
    mtp = m.int("nextn_predict_layers", 0)
    if mtp >= hf["num_hidden_layers"]:
        raise m._err("nextn_predict_layers", f"fewer than block_count ({hf['num_hidden_layers']})", mtp)
    hf["num_hidden_layers"] -= mtp
    hf["mtp_num_hidden_layers"] = mtp
    hf.update(_linear_fields(m, hf))
    theta, partial = hf.pop("rope_theta"), hf.pop("partial_rotary_factor")
    if "rope_scaling" in hf:
        raise m._err("rope.scaling.type", "none (Qwen3-Next / Qwen3.5 GGUFs carry no rope scaling storelab maps)",
                     hf["rope_scaling"]["rope_type"])
    hf["rope_parameters"] = {"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": partial}
    return hf


def _moe(m: Meta, hf: dict) -> None:
    hf.update(num_experts=m.int("expert_count", minimum=1), num_experts_per_tok=m.int("expert_used_count", minimum=1),
              moe_intermediate_size=m.int("expert_feed_forward_length", minimum=1),
              shared_expert_intermediate_size=m.int("expert_shared_feed_forward_length", 0),
              norm_topk_prob=True,      # llama.cpp's qwen3next / qwen35moe graphs always renormalise (src/models/)
              decoder_sparse_step=1, mlp_only_layers=[])


def qwen3next_config(m: Meta) -> dict:
    """Qwen3-Next: transformers ``qwen3_next`` fields from the metadata."""
    hf = _base(m)
    _moe(m, hf)
    hf["full_attention_interval"] = m.int("full_attention_interval", 4, minimum=1)
    return hf


def qwen35_config(m: Meta) -> dict:
    """Qwen3.5 dense: transformers ``qwen3_5_text`` fields (``rope.dimension_sections``: the MRoPE sections)."""
    hf = _base(m)
    sections = m.raw("rope.dimension_sections", [11, 11, 10, 0])
    hf["rope_parameters"].update(mrope_section=list(sections[:3]), mrope_interleaved=True)
    return hf


def qwen35moe_config(m: Meta) -> dict:
    hf = qwen35_config(m)
    _moe(m, hf)
    hf.pop("intermediate_size", None)
    return hf


# ---- tensors ------------------------------------------------------------------------------------------


def _log_neg(a: Tensor) -> Tensor:
    """``ssm_a`` = -exp(A_log) -> A_log."""
    return torch.log(-a)


def _unsqueeze_conv(w: Tensor) -> Tensor:
    """[C, W] -> transformers' conv1d weight [C, 1, W]."""
    return w.unsqueeze(1)


def _qkvz(H: int, K: int, rV: int):
    """``attn_qkv`` (all q, all k, all v rows) and ``attn_gate`` (all z) -> ``in_proj_qkvz`` with, per key
    head, its q, k, v and z rows (conversion/qwen.py ``Qwen3NextModel.modify_tensors``)."""

    def fn(qkv: Tensor, z: Tensor) -> Tensor:
        D = qkv.shape[-1]
        q, k, v = qkv[:H * K], qkv[H * K:2 * H * K], qkv[2 * H * K:]
        parts = [q.reshape(H, K, D), k.reshape(H, K, D), v.reshape(H, rV, D), z.reshape(H, rV, D)]
        return torch.cat(parts, dim=1).reshape(-1, D)

    return fn


def _untile(H: int, r: int, d: int, dim: int = 0):
    """Undo ``_LinearAttentionVReorderBase._reorder_v_heads``: along ``dim``, value heads stored tiled
    (r, H, d) go back to grouped by key head (H, r, d)."""

    def fn(w: Tensor) -> Tensor:
        if r == 1:
            return w
        dim_ = dim % w.dim()
        shape = list(w.shape)
        w = w.reshape(*shape[:dim_], r, H, d, *shape[dim_ + 1:])
        return w.transpose(dim_, dim_ + 1).reshape(shape)

    return fn


def _untile_qkv(H: int, K: int, r: int, V: int):
    v_fix = _untile(H, r, V)

    def fn(w: Tensor) -> Tensor:
        return torch.cat([w[:2 * H * K], v_fix(w[2 * H * K:])], dim=0)

    return fn


def _then(*fns):
    def fn(w: Tensor) -> Tensor:
        for f in fns:
            w = f(w)
        return w

    return fn


def _common_rules() -> list:
    """Embedding, head, norms (1 + w) and the gated attention layers."""
    L = LAYER
    rules = [rule("model.embed_tokens.weight", g(T.TOKEN_EMBD)), rule("lm_head.weight", g(T.OUTPUT)),
             rule("model.norm.weight", g(T.OUTPUT_NORM), fn=minus_one, what="1 + w stored"),
             rule(f"{L}.input_layernorm.weight", g(T.ATTN_NORM), fn=minus_one, what="1 + w stored"),
             rule(f"{L}.post_attention_layernorm.weight", g(T.ATTN_POST_NORM), fn=minus_one, what="1 + w stored"),
             rule(f"{L}.self_attn.q_norm.weight", g(T.ATTN_Q_NORM), fn=minus_one, what="1 + w stored"),
             rule(f"{L}.self_attn.k_norm.weight", g(T.ATTN_K_NORM), fn=minus_one, what="1 + w stored")]
    for p, kind in (("q_proj", T.ATTN_Q), ("k_proj", T.ATTN_K), ("v_proj", T.ATTN_V), ("o_proj", T.ATTN_OUT)):
        rules.append(rule(f"{L}.self_attn.{p}.weight", g(kind)))
    return rules


def _moe_rules() -> list:
    L = LAYER
    return [rule(f"{L}.mlp.gate.weight", g(T.FFN_GATE_INP)),
            rule(f"{L}.mlp.experts.gate_up_proj", g(T.FFN_GATE_UP_EXP)),
            rule(f"{L}.mlp.experts.gate_up_proj", g(T.FFN_GATE_EXP), g(T.FFN_UP_EXP),
                 fn=lambda a, b: torch.cat([a, b], dim=1), what="gate and up experts stacked"),
            rule(f"{L}.mlp.experts.down_proj", g(T.FFN_DOWN_EXP)),
            rule(f"{L}.mlp.shared_expert.gate_proj.weight", g(T.FFN_GATE_SHEXP)),
            rule(f"{L}.mlp.shared_expert.up_proj.weight", g(T.FFN_UP_SHEXP)),
            rule(f"{L}.mlp.shared_expert.down_proj.weight", g(T.FFN_DOWN_SHEXP)),
            rule(f"{L}.mlp.shared_expert_gate.weight", g(T.FFN_GATE_INP_SHEXP))]


def _dense_rules() -> list:
    L = LAYER
    return [rule(f"{L}.mlp.{p}.weight", g(kind))
            for p, kind in (("gate_proj", T.FFN_GATE), ("up_proj", T.FFN_UP), ("down_proj", T.FFN_DOWN))]


def _heads(hf: dict) -> tuple[int, int, int, int]:
    H, HV = hf["linear_num_key_heads"], hf["linear_num_value_heads"]
    return H, hf["linear_key_head_dim"], HV // H, hf["linear_value_head_dim"]


def qwen3next_rules(hf: dict) -> list:
    H, K, r, V = _heads(hf)
    a = f"{LAYER}.linear_attn"
    rules = _common_rules() + _moe_rules() + [
        rule(f"{a}.in_proj_qkvz.weight", g(T.ATTN_QKV), g(T.ATTN_GATE), fn=_qkvz(H, K, r * V),
             what="q, k, v, z re-interleaved per key head"),
        rule(f"{a}.in_proj_ba.weight", g(T.SSM_BETA_ALPHA)),
        rule(f"{a}.conv1d.weight", g(T.SSM_CONV1D), fn=_unsqueeze_conv, what="[C, W] -> [C, 1, W]"),
        rule(f"{a}.A_log", g(T.SSM_A, ""), fn=_log_neg, what="A_log = log(-ssm_a)"),
        rule(f"{a}.dt_bias", g(T.SSM_DT, ".bias")),
        rule(f"{a}.norm.weight", g(T.SSM_NORM)),
        rule(f"{a}.out_proj.weight", g(T.SSM_OUT))]
    return rules + _mtp_rules(hf)


def _qwen35_linear(hf: dict) -> list:
    H, K, r, V = _heads(hf)
    a = f"{LAYER}.linear_attn"
    nv = "value heads tiled -> grouped by key head"

    def conv(w: Tensor) -> Tensor:
        return _unsqueeze_conv(torch.cat([w[:2 * H * K], _untile(H, r, V)(w[2 * H * K:])], dim=0))

    return [rule(f"{a}.in_proj_qkv.weight", g(T.ATTN_QKV), fn=_untile_qkv(H, K, r, V), what=nv),
            rule(f"{a}.in_proj_z.weight", g(T.ATTN_GATE), fn=_untile(H, r, V), what=nv),
            rule(f"{a}.in_proj_b.weight", g(T.SSM_BETA), fn=_untile(H, r, 1), what=nv),
            rule(f"{a}.in_proj_a.weight", g(T.SSM_ALPHA), fn=_untile(H, r, 1), what=nv),
            rule(f"{a}.conv1d.weight", g(T.SSM_CONV1D), fn=conv, what=f"{nv}; [C, W] -> [C, 1, W]"),
            rule(f"{a}.A_log", g(T.SSM_A, ""), fn=_then(_untile(H, r, 1), _log_neg), what=f"{nv}; log(-ssm_a)"),
            rule(f"{a}.dt_bias", g(T.SSM_DT, ".bias"), fn=_untile(H, r, 1), what=nv),
            rule(f"{a}.norm.weight", g(T.SSM_NORM)),
            rule(f"{a}.out_proj.weight", g(T.SSM_OUT), fn=_untile(H, r, V, dim=1), what=f"columns: {nv}")]


def qwen35_rules(hf: dict) -> list:
    return _common_rules() + _dense_rules() + _qwen35_linear(hf) + _mtp_rules(hf)


def qwen35moe_rules(hf: dict) -> list:
    return _common_rules() + _moe_rules() + _qwen35_linear(hf) + _mtp_rules(hf)


def _mtp_rules(hf: dict) -> list:
    """The MTP layers llama.cpp appends after the decoder (``_QwenMtpMixin``): every tensor of block n + k
    is named ``mtp.layers.{k}.<its GGUF name>`` as it is, which no family reads (``^mtp\\.`` is ignored)."""
    n, k_count = hf["num_hidden_layers"], hf.get("mtp_num_hidden_layers", 0)
    if not k_count:
        return []
    from gguf.constants import MODEL_ARCH, MODEL_TENSORS, TENSOR_NAMES
    kinds = {t for a in (MODEL_ARCH.QWEN3NEXT, MODEL_ARCH.QWEN35, MODEL_ARCH.QWEN35MOE) for t in MODEL_TENSORS[a]}
    kinds |= {T.NEXTN_EH_PROJ, T.NEXTN_ENORM, T.NEXTN_HNORM, T.NEXTN_SHARED_HEAD_NORM, T.NEXTN_SHARED_HEAD_HEAD,
              T.NEXTN_EMBED_TOKENS}
    out = []
    for k in range(k_count):
        for kind in kinds:
            name = TENSOR_NAMES[kind]
            if "{bid}" not in name:
                continue
            for suffix in (".weight", ".bias", ""):
                gname = name.format(bid=n + k) + suffix
                out.append(rule(f"mtp.layers.{k}.{gname}", gname))
    return out


ARCHS = (
    Arch("qwen3next", "qwen3_next", qwen3next_config, qwen3next_rules,
         doc="Qwen3-Next: Gated DeltaNet + gated attention, MoE with a gated shared expert"),
    Arch("qwen35", "qwen3_5_text", qwen35_config, qwen35_rules,
         doc="Qwen3.5 / 3.6 dense: Gated DeltaNet + gated attention, SwiGLU MLP"),
    Arch("qwen35moe", "qwen3_5_moe_text", qwen35moe_config, qwen35moe_rules,
         doc="Qwen3.5 MoE: Gated DeltaNet + gated attention, MoE with a gated shared expert"),
)
