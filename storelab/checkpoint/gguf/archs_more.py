"""GGUF architectures of four more hybrid and MoE lines: ``jamba`` (Jamba), ``kimi-linear`` (Kimi Linear),
``glm-dsa`` (GLM-5: MLA + DSA lightning indexer) and ``mimo2`` (MiMo-V2-Flash), read back into transformers'
``jamba``, ``kimi_linear``, ``glm_moe_dsa`` and ``mimo_v2_flash``.

What llama.cpp's converter does (``conversion/jamba.py`` ``JambaModel``, ``conversion/kimi_linear.py``
``KimiLinearModel``, ``conversion/glm.py`` ``GlmMoeDsaModel`` (a ``DeepseekV2Model``), ``conversion/mimo.py``
``MimoV2Model``; ``conversion/base.py`` ``TextModel.set_gguf_parameters``), what its graph reads
(``src/models/{jamba,kimi-linear,glm-dsa,mimo2}.cpp``) and how it is undone here:

* ``jamba``: ``attention.head_count_kv`` per layer (0 on a Mamba layer); Mamba as ``ssm_*`` (``ssm_a`` =
  -exp(A_log), the conv ``[C, 1, W]`` squeezed, dt/B/C norms as ``ssm_{dt,b,c}_norm``); experts stacked.
  The converter writes neither period: the attention layers are the blocks holding ``attn_q`` and the
  expert layers those holding ``ffn_gate_inp``; the smallest ``(period, offset)`` that reproduces each
  pattern is transformers' ``attn_layer_*`` / ``expert_layer_*`` (any pair that reproduces it builds the
  same layers); a pattern no pair reproduces is refused. Router softmax, top-k weights not renormalised
  (llama.cpp's graph and transformers' alike). No RoPE, so q and k are not permuted.
* ``kimi-linear``: MLA written as MQA (``head_count_kv`` 1 on MLA layers, 0 on KDA layers; ``kv_b_proj``
  split into ``attn_k_b`` / ``attn_v_b``, joined back with deepseek2's helper); KDA: ``kda.head_dim``, q/k/v
  convs ``[C, 1, W]`` stored as ``(1, C, 1, W)``, ``ssm_a`` = -exp(A_log) ``[1, 1, H, 1]``, ``dt_bias`` as
  ``ssm_dt.bias``, ``b_proj`` as ``ssm_beta``, ``o_norm`` as ``ssm_norm``; the KDA head count from
  ``attn_q``'s rows / ``kda.head_dim`` (no key holds it). Experts w1/w3/w2 stacked; the graph renormalises
  the top-k weights always (``moe_renormalize`` true) and takes the gating function from the file
  (sigmoid required).
* ``glm-dsa``: deepseek2's MLA (read by ``archs_moe.deepseek2_config``) plus the indexer:
  ``attention.indexer.{head_count,key_length,top_k}``, per-layer ``attention.indexer.types`` (true = a
  layer running its own indexer); without that key llama.cpp takes every layer full for files with
  ``context_length`` < 1048576 (GLM-5 / 5.1) and GLM-5.2's published pattern otherwise, and so is it read.
  Indexer tensors ``indexer.{attn_q_b,attn_k,k_norm,proj}`` are ``wq_b``, ``wk``, ``k_norm``, ``weights_proj``
  as they are (both RoPEs interleaved, nothing permuted).
* ``mimo2``: ``attention.head_count_kv`` per layer (the window layers' count, 2x the full layers' in
  transformers' ``MiMoV2FlashConfig``), ``attention.sliding_window`` (tokens seen including the query, as
  transformers' ``sliding_window`` counts them), ``attention.sliding_window_pattern`` (1 = window layer),
  ``attention.value_length`` (v_head_dim), ``rope.freq_base`` / ``rope.freq_base_swa`` (absent: the full
  layers' base), ``rope.dimension_count`` = int(head_dim x partial_rotary_factor), ``attention.value_scale``
  (absent: 1.0; llama.cpp scales the attention output after ``wo``, transformers the values: the same
  product), sinks as ``attn_sinks.weight``; the graph routes by sigmoid with renormalised top-k weights and
  never scales the experts (``routed_scaling_factor`` 1.0, as published; an ``expert_weights_scale`` other
  than 1 is refused).
"""

from __future__ import annotations

import torch
from gguf.constants import MODEL_ARCH, MODEL_TENSOR as T

from storelab.checkpoint.gguf.arch import LAYER, Arch, Meta, common_config, g, rule
from storelab.checkpoint.gguf.archs_moe import (_base_rules, _experts_rules, _gating, _kv_b, _mlp_rules,
                                                deepseek2_config, mtp_rules)
from storelab.checkpoint.shards import CheckpointError

__all__ = ["ARCHS"]


def _holds(m: Meta, n: int, kind: T) -> list[bool]:
    """Per block, whether the file holds that block's tensor of this kind (``.weight``)."""
    return [g(kind).format(bid=i) in m.shapes for i in range(n)]


def _period(m: Meta, pattern: list[bool], what: str) -> tuple[int, int]:
    """The smallest (period, offset), offset < period, with ``i % period == offset`` exactly where ``pattern``."""
    n = len(pattern)
    for p in range(1, n + 1):
        for o in range(p):
            if [i % p == o for i in range(n)] == pattern:
                return p, o
    raise CheckpointError(f"{m.path}: the {what} layers {[i for i, x in enumerate(pattern) if x]} of {n} follow no "
                          f"(period, offset) rule, which transformers' jamba config needs (general.architecture "
                          f"{m.arch!r})")


# ---- jamba ---------------------------------------------------------------------------------------------------

def jamba_config(m: Meta) -> dict:
    hf = common_config(m)
    n, D = hf["num_hidden_layers"], hf["hidden_size"]
    hf.pop("head_dim", None)
    hf.pop("rope_theta", None)
    inner = m.int("ssm.inner_size", minimum=1)
    if inner % D:
        raise m._err("ssm.inner_size", f"a multiple of embedding_length ({D}) for transformers' mamba_expand", inner)
    attn = _holds(m, n, T.ATTN_Q)
    if not any(attn):
        raise CheckpointError(f"{m.path}: no block holds attention tensors (attn_q): transformers' jamba needs "
                              f"one (general.architecture {m.arch!r})")
    E = m.int("expert_count", minimum=1)
    moe = _holds(m, n, T.FFN_GATE_INP)
    ap, ao = _period(m, attn, "attention")
    ep, eo = _period(m, moe, "expert") if E > 1 else (1, 0)
    hf.update(attn_layer_period=ap, attn_layer_offset=ao, expert_layer_period=ep, expert_layer_offset=eo,
              num_experts=E, num_experts_per_tok=m.int("expert_used_count", minimum=1), hidden_act="silu",
              mamba_d_state=m.int("ssm.state_size", minimum=1), mamba_d_conv=m.int("ssm.conv_kernel", minimum=1),
              mamba_expand=inner // D, mamba_dt_rank=m.int("ssm.time_step_rank", minimum=1),
              mamba_conv_bias=any(f"blk.{i}.ssm_conv1d.bias" in m.shapes for i in range(n)),
              mamba_proj_bias=any(f"blk.{i}.ssm_in.bias" in m.shapes for i in range(n)))
    return hf


def jamba_rules(hf: dict) -> list:
    L, x, f = LAYER, f"{LAYER}.mamba", f"{LAYER}.feed_forward"
    rules = [rule("model.embed_tokens.weight", g(T.TOKEN_EMBD)), rule("lm_head.weight", g(T.OUTPUT)),
             rule("model.final_layernorm.weight", g(T.OUTPUT_NORM)),
             rule(f"{L}.input_layernorm.weight", g(T.ATTN_NORM)), rule(f"{L}.pre_ff_layernorm.weight", g(T.FFN_NORM)),
             rule(f"{x}.conv1d.weight", g(T.SSM_CONV1D), fn=lambda w: w.unsqueeze(1), what="[C, W] -> [C, 1, W]"),
             rule(f"{x}.conv1d.bias", g(T.SSM_CONV1D, ".bias")),
             rule(f"{x}.A_log", g(T.SSM_A, ""), fn=lambda a: torch.log(-a), what="-exp(A_log) -> A_log"),
             rule(f"{x}.D", g(T.SSM_D, "")), rule(f"{x}.x_proj.weight", g(T.SSM_X)),
             rule(f"{x}.dt_layernorm.weight", g(T.SSM_DT_NORM)), rule(f"{x}.b_layernorm.weight", g(T.SSM_B_NORM)),
             rule(f"{x}.c_layernorm.weight", g(T.SSM_C_NORM)),
             rule(f"{f}.router.weight", g(T.FFN_GATE_INP))]
    for sfx in (".weight", ".bias"):
        rules += [rule(f"{x}.in_proj{sfx}", g(T.SSM_IN, sfx)), rule(f"{x}.out_proj{sfx}", g(T.SSM_OUT, sfx)),
                  rule(f"{x}.dt_proj{sfx}", g(T.SSM_DT, sfx))]
    for p, kind in (("q_proj", T.ATTN_Q), ("k_proj", T.ATTN_K), ("v_proj", T.ATTN_V), ("o_proj", T.ATTN_OUT)):
        rules.append(rule(f"{L}.self_attn.{p}.weight", g(kind)))
    for p, kind in (("gate_proj", T.FFN_GATE), ("up_proj", T.FFN_UP), ("down_proj", T.FFN_DOWN)):
        rules.append(rule(f"{f}.{p}.weight", g(kind)))
    return rules + _experts_rules(f"{f}.experts")


# ---- kimi-linear ---------------------------------------------------------------------------------------------

def _mla_fields(m: Meta, hf: dict) -> None:
    """MLA's per-head sizes as transformers names them (``key_length_mla`` = nope + rope, ``value_length_mla``)."""
    rope = m.int("rope.dimension_count", minimum=1)
    qk = m.int("attention.key_length_mla", minimum=rope + 1)
    hf.update(kv_lora_rank=m.int("attention.kv_lora_rank", minimum=1),
              q_lora_rank=m.int("attention.q_lora_rank", minimum=1) if m.has("attention.q_lora_rank") else None,
              qk_rope_head_dim=rope, qk_nope_head_dim=qk - rope,
              v_head_dim=m.int("attention.value_length_mla", minimum=1))


def kimi_linear_config(m: Meta) -> dict:
    hf = common_config(m)
    n = hf["num_hidden_layers"]
    for k in ("head_dim", "rope_theta", "rope_scaling"):
        hf.pop(k, None)
    if not m.has("expert_gating_func") or _gating(m, "sigmoid") != "sigmoid":   # llama.cpp requires the key
        raise m._err("expert_gating_func", "2 (sigmoid: Kimi Linear's router)", m.raw("expert_gating_func", None))
    for key in ("moe_latent_size", "attn_res_block_size", "hidden_activation"):
        if m.has(key):
            raise m._err(key, "absent (Kimi K3's latent experts, AttnRes and activations are read from its "
                         "config.json, not from a kimi-linear GGUF)", m.raw(key))
    mla = _holds(m, n, T.ATTN_KV_A_MQA)
    kda = _holds(m, n, T.SSM_F_A)
    for i in range(n):
        if mla[i] == kda[i]:
            raise CheckpointError(f"{m.path}: block {i} holds {'both' if mla[i] else 'neither'} MLA (attn_kv_a_mqa) "
                                  f"and KDA (ssm_f_a) tensors (general.architecture {m.arch!r})")
    K = m.int("kda.head_dim", minimum=1)
    H_kda = H = hf["num_attention_heads"]
    if any(kda):
        rows = m.tensor_shape(g(T.ATTN_Q).format(bid=kda.index(True)))[0]
        if rows % K:
            raise m._err("kda.head_dim", f"a divisor of the KDA q_proj rows ({rows})", K)
        H_kda = rows // K
    _mla_fields(m, hf)
    moe = _holds(m, n, T.FFN_GATE_INP)
    hf.update(num_key_value_heads=H, layer_types=["full_attention" if x else "linear_attention" for x in mla],
              mlp_layer_types=["sparse" if x else "dense" for x in moe], linear_head_dim=K, linear_num_heads=H_kda,
              linear_conv_kernel_dim=m.int("ssm.conv_kernel", minimum=1), hidden_act="silu",
              num_experts=m.int("expert_count", minimum=1), num_experts_per_token=m.int("expert_used_count", minimum=1),
              moe_intermediate_size=m.int("expert_feed_forward_length", minimum=1),
              num_shared_experts=m.int("expert_shared_count", 0), moe_renormalize=True,
              routed_scaling_factor=m.float("expert_weights_scale", 1.0),
              first_k_dense_replace=moe.index(True) if any(moe) else n,
              model_max_length=hf.pop("max_position_embeddings"), attention_bias=False)
    return hf


def _conv(w: torch.Tensor) -> torch.Tensor:
    return w.reshape(-1, 1, w.shape[-1])


def kimi_linear_rules(hf: dict) -> list:
    a = f"{LAYER}.self_attn"
    rules = _base_rules() + _mlp_rules(f"{LAYER}.block_sparse_moe")
    for p, kind in (("q", T.SSM_CONV1D_Q), ("k", T.SSM_CONV1D_K), ("v", T.SSM_CONV1D_V)):
        rules.append(rule(f"{a}.{p}_conv1d.weight", g(kind), fn=_conv, what="(1, C, 1, W) -> [C, 1, W]"))
    rules += [rule(f"{a}.A_log", g(T.SSM_A, ""), fn=lambda x: torch.log(-x).reshape(1, 1, -1, 1),
                   what="-exp(A_log) -> A_log [1, 1, H, 1]"),
              rule(f"{a}.dt_bias", g(T.SSM_DT, ".bias")),
              rule(f"{a}.f_a_proj.weight", g(T.SSM_F_A)), rule(f"{a}.f_b_proj.weight", g(T.SSM_F_B)),
              rule(f"{a}.b_proj.weight", g(T.SSM_BETA)), rule(f"{a}.g_a_proj.weight", g(T.SSM_G_A)),
              rule(f"{a}.g_b_proj.weight", g(T.SSM_G_B)), rule(f"{a}.o_norm.weight", g(T.SSM_NORM)),
              rule(f"{a}.q_proj.weight", g(T.ATTN_Q)), rule(f"{a}.k_proj.weight", g(T.ATTN_K)),
              rule(f"{a}.v_proj.weight", g(T.ATTN_V)), rule(f"{a}.o_proj.weight", g(T.ATTN_OUT))]
    return rules + _mla_rules(a, hf["num_attention_heads"])


def _mla_rules(a: str, H: int) -> list:
    """MLA's compressed projections (``DeepseekV3Attention`` names), ``kv_b_proj`` joined from k_b and v_b."""
    return [rule(f"{a}.q_a_proj.weight", g(T.ATTN_Q_A)), rule(f"{a}.q_a_layernorm.weight", g(T.ATTN_Q_A_NORM)),
            rule(f"{a}.q_b_proj.weight", g(T.ATTN_Q_B)), rule(f"{a}.kv_a_proj_with_mqa.weight", g(T.ATTN_KV_A_MQA)),
            rule(f"{a}.kv_a_layernorm.weight", g(T.ATTN_KV_A_NORM)), rule(f"{a}.kv_b_proj.weight", g(T.ATTN_KV_B)),
            rule(f"{a}.kv_b_proj.weight", g(T.ATTN_K_B), g(T.ATTN_V_B), fn=_kv_b(H),
                 what="k_b transposed back and joined with v_b per head")]


# ---- glm-dsa -------------------------------------------------------------------------------------------------

def _glm52_full(i: int) -> bool:
    """GLM-5.2's published indexer pattern (llama.cpp ``GLM_5_2_DEFAULT_INDEXER_TYPES``): 1, 1, then 1, 0, 0, 0."""
    return i < 2 or (i - 2) % 4 == 0


def glm_dsa_config(m: Meta) -> dict:
    hf = deepseek2_config(m)
    if hf["scoring_func"] != "sigmoid":
        raise m._err("expert_gating_func", "2 (sigmoid: GLM-5's router)", m.raw("expert_gating_func", None))
    if hf["q_lora_rank"] is None:
        raise m._err("attention.q_lora_rank", "present (GLM-5's indexer reads the query latent)", None)
    n = hf["num_hidden_layers"]
    if m.has("attention.indexer.types"):
        full = m.raw("attention.indexer.types")
        if not isinstance(full, list) or len(full) < n or any(not isinstance(x, (bool, int)) for x in full):
            raise m._err("attention.indexer.types", f"a list of {n} booleans (one per layer)", full)
        full = [bool(x) for x in full[:n]]
    else:
        full = [True] * n if m.int("context_length", 0) < 1048576 else [_glm52_full(i) for i in range(n)]
    if not full[0]:
        raise m._err("attention.indexer.types", "true on layer 0 (a shared layer reuses an earlier full one)", full)
    for k in ("model_type", "topk_method", "scoring_func"):
        hf.pop(k, None)
    theta = hf.pop("rope_theta")
    if "rope_scaling" in hf:
        raise m._err("rope.scaling.type", "none (GLM-5's published rope)", hf["rope_scaling"]["rope_type"])
    moe = _holds(m, n, T.FFN_GATE_INP)
    hf.update(model_type="glm_moe_dsa", rope_parameters={"rope_type": "default", "rope_theta": theta},
              index_n_heads=m.int("attention.indexer.head_count", minimum=1),
              index_head_dim=m.int("attention.indexer.key_length", minimum=1),
              index_topk=m.int("attention.indexer.top_k", minimum=1),
              indexer_types=["full" if x else "shared" for x in full],
              mlp_layer_types=["sparse" if x else "dense" for x in moe], attention_bias=False)
    return hf


def glm_dsa_rules(hf: dict) -> list:
    a, x = f"{LAYER}.self_attn", f"{LAYER}.self_attn.indexer"
    return (_base_rules() + _mlp_rules(f"{LAYER}.mlp") + _mla_rules(a, hf["num_attention_heads"])
            + [rule(f"{a}.q_proj.weight", g(T.ATTN_Q)), rule(f"{a}.o_proj.weight", g(T.ATTN_OUT)),
               rule(f"{x}.wq_b.weight", g(T.INDEXER_ATTN_Q_B)), rule(f"{x}.wk.weight", g(T.INDEXER_ATTN_K)),
               rule(f"{x}.k_norm.weight", g(T.INDEXER_K_NORM)), rule(f"{x}.k_norm.bias", g(T.INDEXER_K_NORM, ".bias")),
               rule(f"{x}.weights_proj.weight", g(T.INDEXER_PROJ))]
            + mtp_rules(hf, MODEL_ARCH.GLM_DSA))


# ---- mimo2 ---------------------------------------------------------------------------------------------------

def mimo2_config(m: Meta) -> dict:
    hf = common_config(m)
    n, K = hf["num_hidden_layers"], hf["head_dim"]
    kv = m.ints("attention.head_count_kv", n)
    swa = m.raw("attention.sliding_window_pattern")
    if not isinstance(swa, list) or len(swa) != n or any(not isinstance(x, (bool, int)) for x in swa):
        raise m._err("attention.sliding_window_pattern", f"a list of {n} flags (1: a window layer)", swa)
    swa = [bool(x) for x in swa]
    full_kv = {kv[i] for i in range(n) if not swa[i]} or {kv[swa.index(True)] // 2}
    swa_kv = {kv[i] for i in range(n) if swa[i]}
    if len(full_kv) != 1 or any(x != 2 * min(full_kv) for x in swa_kv):
        raise m._err("attention.head_count_kv", "one count on the full layers and twice it on the window layers "
                     "(transformers' MiMoV2FlashConfig)", kv)
    for i in range(n):
        if not swa[i] and g(T.ATTN_SINKS).format(bid=i) in m.shapes:
            raise CheckpointError(f"{m.path}: tensor 'blk.{i}.attn_sinks.weight': sinks on a full-attention layer "
                                  f"are not transformers' mimo_v2_flash (general.architecture {m.arch!r})")
    if "rope_scaling" in hf:
        raise m._err("rope.scaling.type", "none (MiMo-V2-Flash's published rope)", hf["rope_scaling"]["rope_type"])
    rot = m.int("rope.dimension_count", minimum=1)
    partial = rot / K
    if int(K * partial) != rot:
        raise m._err("rope.dimension_count", f"a width int(head_dim * factor) gives back (head_dim {K})", rot)
    theta = hf.pop("rope_theta")
    moe = _holds(m, n, T.FFN_GATE_INP)
    hf.update(num_key_value_heads=min(full_kv), v_head_dim=m.int("attention.value_length", minimum=1),
              layer_types=["sliding_attention" if x else "full_attention" for x in swa],
              mlp_layer_types=["sparse" if x else "dense" for x in moe],
              sliding_window=m.int("attention.sliding_window", minimum=1),
              attention_value_scale=m.float("attention.value_scale", 1.0),
              attention_bias=any(f"blk.{i}.attn_q.bias" in m.shapes for i in range(n)), hidden_act="silu",
              rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": theta,
                                                  "partial_rotary_factor": partial},
                               "sliding_attention": {"rope_type": "default",
                                                     "rope_theta": m.float("rope.freq_base_swa", theta),
                                                     "partial_rotary_factor": partial}})
    if any(moe):
        hf.update(n_routed_experts=m.int("expert_count", minimum=1),
                  num_experts_per_tok=m.int("expert_used_count", minimum=1),
                  moe_intermediate_size=m.int("expert_feed_forward_length", minimum=1), norm_topk_prob=True,
                  routed_scaling_factor=1.0, n_group=1, topk_group=1)
    if m.float("expert_weights_scale", 1.0) != 1.0:   # llama.cpp's mimo2 never reads it: its experts are unscaled
        raise m._err("expert_weights_scale", "1.0 or absent (llama.cpp's mimo2 graph does not scale the experts)",
                     m.raw("expert_weights_scale"))
    return hf


def mimo2_rules(hf: dict) -> list:
    a = f"{LAYER}.self_attn"
    rules = _base_rules() + _mlp_rules(f"{LAYER}.mlp")
    for p, kind in (("q_proj", T.ATTN_Q), ("k_proj", T.ATTN_K), ("v_proj", T.ATTN_V), ("o_proj", T.ATTN_OUT)):
        rules += [rule(f"{a}.{p}.weight", g(kind)), rule(f"{a}.{p}.bias", g(kind, ".bias"))]
    return rules + [rule(f"{a}.sinks", g(T.ATTN_SINKS)), rule(f"{a}.sinks", g(T.ATTN_SINKS, ""))]


ARCHS = (
    Arch("jamba", "jamba", jamba_config, jamba_rules, doc="Jamba: Mamba with dt/B/C norms, GQA without RoPE, experts"),
    Arch("kimi-linear", "kimi_linear", kimi_linear_config, kimi_linear_rules,
         doc="Kimi Linear: KDA layers and MLA without RoPE, sigmoid-routed experts"),
    Arch("glm-dsa", "glm_moe_dsa", glm_dsa_config, glm_dsa_rules,
         doc="GLM-5: MLA read through the DSA lightning indexer, sigmoid-routed experts"),
    Arch("mimo2", "mimo_v2_flash", mimo2_config, mimo2_rules,
         doc="MiMo-V2-Flash: window attention with sinks and full attention, sigmoid-routed experts"),
)
