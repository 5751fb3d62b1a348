"""The GGUF architecture ``deepseek4`` (DeepSeek-V4: CSA / HCA compressed attention, mHC depth streams,
hash-routed then sqrt-softplus-routed experts), read back into transformers' ``deepseek_v4`` (storelab family
``storelab/checkpoint/families/deepseek_v4.py``).

gguf-py 0.19 knows neither the architecture nor its names, so every name this module reads is declared once
below (``KEY`` for metadata, ``NAME`` for tensors), each with the llama.cpp source it comes from:

* the converter: ``conversion/deepseek.py`` ``DeepseekV4Model`` of ggml-org/llama.cpp (index copy at commit
  01a723dc630d075780ac7081fd63fbd87780f665): ``set_gguf_parameters`` writes the keys, ``_map_tensor_name_deepseek4``
  names the tensors from DeepSeek's release names (``layers.{i}.attn.wq_a.weight`` ...; transformers saves the same
  names under ``model.``, with ``embed_tokens``, ``hc_head.hc_*`` and the KV norm as ``attn.norm``), experts are
  stacked per layer (``w1`` / ``w3`` / ``w2``), ``gate.tid2eid`` is written as int32 (GGML I32), nothing is
  permuted or transposed, and the MTP tensors (``mtp.*``) are dropped;
* the loader: ``src/models/deepseek4.cpp`` ``load_arch_hparams`` / ``load_arch_tensors`` (index copy at commit
  00395eb285c7c6821ff372e3ca41dae9da33c2c7): which keys are required, every tensor's shape, the per-layer kind
  from ``attention.compress_ratios`` (0 a window-only layer; otherwise a compressor whose width is 2x the head
  on ratio 4, with the indexer, 1x otherwise) and the hash layers (the first ``hash_layer_count``, with
  ``ffn_gate_tid2eid`` instead of ``exp_probs_b``);
* the tensor-name strings of ``src/llama-arch.cpp``'s LLM_TENSOR_NAMES: the index holds no copy of that file with
  the V4 entries; the strings below are those of a gguf-py ``constants.py`` ``TENSOR_NAMES`` carrying the V4
  entries (``blk.{bid}.attn_compressor_kv`` ... ``blk.{bid}.indexer_compressor_norm``; index id 57692108481),
  agreeing with the converter's ``MODEL_TENSOR`` members and the loader's ``tn(...)`` calls.

How the metadata becomes transformers' config:

* ``attention.compress_ratios`` (one per block) gives ``layer_types``: 0 ``sliding_attention``; a ratio with the
  indexer's tensors ``compressed_sparse_attention``, without them ``heavily_compressed_attention`` (llama.cpp takes
  ratio 4 for the first and 128 for the second; the file's own tensors decide here, so any rate a transformers
  config may hold reads back). ``compress_rates`` is each kind's ratio; two layers of one kind with different
  ratios have no transformers form and are refused, as is a compressor whose width or ``ape`` rows disagree.
* ``hash_layer_count`` gives ``mlp_layer_types`` (the first ones ``hash_moe``); ``expert_gating_func`` must be
  4 (llama.cpp's LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS, ``src/llama-hparams.h``; the loader refuses others).
* ``swiglu_clamp_exp`` (one per block, written only for a positive ``swiglu_limit``) must be one value:
  ``swiglu_limit``; absent, no clamp. A ``swiglu_clamp_shexp`` other than it is refused (transformers has one).
* ``rope.freq_base`` is the window layers' ``rope_theta``; ``attention.compress_rope_freq_base`` the compressed
  layers'; ``rope.scaling.*`` (YaRN) belongs to the compressed layers only (``rope_parameters.compress``, with
  transformers' ``attention_factor`` 1.0); ``rope.dimension_count`` / ``attention.key_length`` is
  ``partial_rotary_factor``.
* ``nextn_predict_layers`` counts MTP blocks appended to ``block_count`` only when the file holds
  ``blk.{n}.nextn.eh_proj.weight``, as llama.cpp's loader decides (the converter drops them, so a converted file
  has none); such blocks are read as ``model.layers.{n + k}.<name>``, which the family ignores.

``ffn_gate_tid2eid`` is stored as I32: ``GGUFShards`` hands every tensor over as F32 and ``dequant.py`` reads no
I32, so a file with hash layers has its header, plan and accounting read, and loading it is refused by the loader
naming ``model.layers.{i}.ffn.gate.tid2eid`` (an integer table given as F32). Reading it needs ``GGUFShards.info``
to say I32 for an integer GGML type and ``dequant.py`` to read I32 as integers; a file without hash layers
(``hash_layer_count`` 0) loads.
"""

from __future__ import annotations

import torch
from gguf.constants import MODEL_TENSOR as T

from storelab.checkpoint.gguf.arch import Arch, Meta, common_config, g, rule
from storelab.checkpoint.shards import CheckpointError

__all__ = ["ARCHS", "KEY", "NAME"]

ARCH = "deepseek4"

# Metadata keys (without the "deepseek4." prefix) that gguf-py 0.19 lacks: the loader's LLM_KV_* in
# src/models/deepseek4.cpp load_arch_hparams, written by DeepseekV4Model.set_gguf_parameters.
KEY = {
    "compress_ratios": "attention.compress_ratios",                 # LLM_KV_ATTENTION_COMPRESS_RATIOS (>= block_count)
    "compress_rope_theta": "attention.compress_rope_freq_base",     # LLM_KV_ATTENTION_COMPRESS_ROPE_FREQ_BASE
    "o_groups": "attention.output_group_count",                     # LLM_KV_ATTENTION_OUTPUT_GROUP_COUNT
    "o_lora_rank": "attention.output_lora_rank",                    # LLM_KV_ATTENTION_OUTPUT_LORA_RANK
    "hc_mult": "hyper_connection.count",                            # LLM_KV_HYPER_CONNECTION_COUNT
    "hc_sinkhorn_iters": "hyper_connection.sinkhorn_iterations",    # LLM_KV_HYPER_CONNECTION_SINKHORN_ITERATIONS
    "hc_eps": "hyper_connection.epsilon",                           # LLM_KV_HYPER_CONNECTION_EPSILON
    "num_hash_layers": "hash_layer_count",                          # LLM_KV_HASH_LAYER_COUNT
}
SQRT_SOFTPLUS = 4   # LLAMA_EXPERT_GATING_FUNC_TYPE_SQRT_SOFTPLUS (src/llama-hparams.h); gguf-py 0.19 stops at 2

# Tensor names gguf-py 0.19 lacks (converter MODEL_TENSOR member -> string); the rest come from gguf-py (g(...)).
NAME = {
    "OUTPUT_HC_FN": "output_hc_fn.weight",                          # loader: LLM_TENSOR_HC_HEAD_FN {hc*D, hc}
    "OUTPUT_HC_BASE": "output_hc_base.weight",                      # {hc}
    "OUTPUT_HC_SCALE": "output_hc_scale.weight",                    # {1}
    "HC_ATTN_FN": "blk.{bid}.hc_attn_fn.weight",                    # {hc*D, (2 + hc)*hc}
    "HC_ATTN_BASE": "blk.{bid}.hc_attn_base.weight",
    "HC_ATTN_SCALE": "blk.{bid}.hc_attn_scale.weight",              # {3}
    "HC_FFN_FN": "blk.{bid}.hc_ffn_fn.weight",
    "HC_FFN_BASE": "blk.{bid}.hc_ffn_base.weight",
    "HC_FFN_SCALE": "blk.{bid}.hc_ffn_scale.weight",
    "ATTN_KV": "blk.{bid}.attn_kv.weight",                          # wkv {D, C}
    "ATTN_OUT_A": "blk.{bid}.attn_output_a.weight",                 # wo_a {H*C/g, g*r}
    "ATTN_OUT_B": "blk.{bid}.attn_output_b.weight",                 # wo_b {g*r, D}
    "ATTN_COMPRESSOR_KV": "blk.{bid}.attn_compressor_kv.weight",    # {D, coff*C}
    "ATTN_COMPRESSOR_GATE": "blk.{bid}.attn_compressor_gate.weight",
    "ATTN_COMPRESSOR_APE": "blk.{bid}.attn_compressor_ape.weight",  # {coff*C, ratio}
    "ATTN_COMPRESSOR_NORM": "blk.{bid}.attn_compressor_norm.weight",
    "INDEXER_COMPRESSOR_KV": "blk.{bid}.indexer_compressor_kv.weight",   # {D, 2*c_I}
    "INDEXER_COMPRESSOR_GATE": "blk.{bid}.indexer_compressor_gate.weight",
    "INDEXER_COMPRESSOR_APE": "blk.{bid}.indexer_compressor_ape.weight",
    "INDEXER_COMPRESSOR_NORM": "blk.{bid}.indexer_compressor_norm.weight",
    "FFN_GATE_TID2EID": "blk.{bid}.ffn_gate_tid2eid.weight",        # I32 {top_k, vocab}
    "NEXTN_EH_PROJ": "blk.{bid}.nextn.eh_proj.weight",              # an MTP block's probe (load_arch_hparams)
}


def _layer_types(m: Meta, n: int, C: int) -> tuple[list[str], dict[str, int]]:
    """``layer_types`` and ``compress_rates`` from ``compress_ratios`` and the indexer's presence per block."""
    key = KEY["compress_ratios"]
    ratios = m.raw(key)
    if not isinstance(ratios, list) or len(ratios) < n or any(
            isinstance(r, bool) or not isinstance(r, int) or r < 0 for r in ratios[:n]):
        raise m._err(key, f"a list of at least block_count ({n}) non-negative integers", ratios)
    types, rates = [], {}
    for i, r in enumerate(ratios[:n]):
        if r == 0:
            types.append("sliding_attention")
            continue
        csa = g(T.INDEXER_PROJ).format(bid=i) in m.shapes
        kind = "compressed_sparse_attention" if csa else "heavily_compressed_attention"
        ape = NAME["ATTN_COMPRESSOR_APE"].format(bid=i)
        want = (r, (2 if csa else 1) * C)
        if m.tensor_shape(ape) != want:
            raise CheckpointError(f"{m.path}: tensor {ape!r}: shape {list(m.tensor_shape(ape))}, but "
                                  f"{m.full(key)}[{i}] = {r} on a {kind} layer (head {C}) needs {list(want)}")
        if rates.setdefault(kind, r) != r:
            raise m._err(key, f"one ratio per layer kind (transformers' compress_rates); {kind} layers have "
                              f"{rates[kind]} and {r}", ratios)
        types.append(kind)
    return types, rates


def _mtp_count(m: Meta, n_all: int) -> int:
    """MTP blocks after the decoder: ``nextn_predict_layers`` when the file holds the first one's
    ``nextn.eh_proj`` (llama.cpp's probe), else none."""
    k = m.int("nextn_predict_layers", 0)
    if k >= n_all:
        raise m._err("nextn_predict_layers", f"fewer than block_count ({n_all})", k)
    return k if k and NAME["NEXTN_EH_PROJ"].format(bid=n_all - k) in m.shapes else 0


def _swiglu_limit(m: Meta, n: int) -> float | None:
    if not m.has("swiglu_clamp_exp"):
        return None
    exp = m.raw("swiglu_clamp_exp")
    vals = exp if isinstance(exp, list) else [exp]
    if len(set(vals[:n])) != 1 or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in vals):
        raise m._err("swiglu_clamp_exp", "one clamp for every layer (transformers' swiglu_limit)", exp)
    if m.has("swiglu_clamp_shexp") and m.raw("swiglu_clamp_shexp") != exp:
        raise m._err("swiglu_clamp_shexp", f"the routed experts' clamp {exp!r} (transformers has one swiglu_limit)",
                     m.raw("swiglu_clamp_shexp"))
    return float(vals[0])


def deepseek4_config(m: Meta) -> dict:
    hf = common_config(m)
    mtp = _mtp_count(m, hf["num_hidden_layers"])
    n = hf["num_hidden_layers"] = hf["num_hidden_layers"] - mtp
    C = hf["head_dim"]
    if m.int("expert_gating_func") != SQRT_SOFTPLUS:
        raise m._err("expert_gating_func", f"{SQRT_SOFTPLUS} (sqrt-softplus, DeepSeek-V4's router)",
                     m.raw("expert_gating_func"))
    n_hash = m.int(KEY["num_hash_layers"])
    types, rates = _layer_types(m, n, C)
    rot = m.int("rope.dimension_count", minimum=2)
    if rot > C or rot % 2:
        raise m._err("rope.dimension_count", f"an even count no more than the head ({C})", rot)
    hf.update(
        q_lora_rank=m.int("attention.q_lora_rank", minimum=1), o_lora_rank=m.int(KEY["o_lora_rank"], minimum=1),
        o_groups=m.int(KEY["o_groups"], minimum=1), sliding_window=m.int("attention.sliding_window", minimum=1),
        index_n_heads=m.int("attention.indexer.head_count", minimum=1),
        index_head_dim=m.int("attention.indexer.key_length", minimum=1),
        index_topk=m.int("attention.indexer.top_k", minimum=1),
        hc_mult=m.int(KEY["hc_mult"], minimum=1), hc_sinkhorn_iters=m.int(KEY["hc_sinkhorn_iters"], minimum=1),
        hc_eps=m.float(KEY["hc_eps"]),
        n_routed_experts=m.int("expert_count", minimum=1), num_experts_per_tok=m.int("expert_used_count", minimum=1),
        moe_intermediate_size=m.int("expert_feed_forward_length", minimum=1),
        n_shared_experts=m.int("expert_shared_count"), routed_scaling_factor=m.float("expert_weights_scale"),
        norm_topk_prob=bool(m.raw("expert_weights_norm")), scoring_func="sqrtsoftplus",
        swiglu_limit=_swiglu_limit(m, n), hidden_act="silu", num_nextn_predict_layers=m.int("nextn_predict_layers", 0),
        layer_types=types, compress_rates=rates, compress_rope_theta=m.float(KEY["compress_rope_theta"]),
        mlp_layer_types=["hash_moe"] * min(n, n_hash) + ["moe"] * max(0, n - n_hash),
        partial_rotary_factor=rot / C)
    hf.pop("intermediate_size", None)   # transformers' alias of moe_intermediate_size
    factor = rot / C
    compress = {"rope_type": "default", "rope_theta": hf["compress_rope_theta"], "partial_rotary_factor": factor}
    if (rs := hf.pop("rope_scaling", None)) is not None:
        if rs["rope_type"] != "yarn":
            raise m._err("rope.scaling.type", "yarn or none (DeepSeek-V4's compressed layers' rope)", rs["rope_type"])
        compress.update(rs, attention_factor=1.0)
        for k, gk in (("beta_fast", "rope.scaling.yarn_beta_fast"), ("beta_slow", "rope.scaling.yarn_beta_slow")):
            if m.has(gk):
                compress[k] = m.float(gk)
    hf["rope_parameters"] = {"main": {"rope_type": "default", "rope_theta": hf["rope_theta"],
                                      "partial_rotary_factor": factor}, "compress": compress}
    return hf


# ---- tensors -----------------------------------------------------------------------------------------------

L = "model.layers.{bid}"


def _per_layer() -> list[tuple[str, str]]:
    """(transformers name, GGUF name) of every per-layer tensor read as it is (DeepseekV4Model's table inverted)."""
    a, f = f"{L}.attn", f"{L}.ffn"
    pairs = [(f"{L}.attn_norm.weight", g(T.ATTN_NORM)),
             (f"{L}.ffn_norm.weight", g(T.FFN_NORM)),
             (f"{a}.attn_sink", g(T.ATTN_SINKS)),
             (f"{a}.wq_a.weight", g(T.ATTN_Q_A)),
             (f"{a}.q_norm.weight", g(T.ATTN_Q_A_NORM)),
             (f"{a}.wq_b.weight", g(T.ATTN_Q_B)),
             (f"{a}.wkv.weight", NAME["ATTN_KV"]),
             (f"{a}.norm.weight", g(T.ATTN_KV_A_NORM)),          # the release's attn.kv_norm
             (f"{a}.wo_a.weight", NAME["ATTN_OUT_A"]),
             (f"{a}.wo_b.weight", NAME["ATTN_OUT_B"]),
             (f"{a}.indexer.wq_b.weight", g(T.INDEXER_ATTN_Q_B)),
             (f"{a}.indexer.weights_proj.weight", g(T.INDEXER_PROJ)),
             (f"{f}.gate.weight", g(T.FFN_GATE_INP)),
             (f"{f}.gate.bias", g(T.FFN_EXP_PROBS_B, ".bias")),   # score layers
             (f"{f}.gate.tid2eid", NAME["FFN_GATE_TID2EID"]),     # hash layers
             (f"{f}.experts.down_proj", g(T.FFN_DOWN_EXP)),       # w2 stacked [E, D, I]
             (f"{f}.shared_experts.w1.weight", g(T.FFN_GATE_SHEXP)),
             (f"{f}.shared_experts.w3.weight", g(T.FFN_UP_SHEXP)),
             (f"{f}.shared_experts.w2.weight", g(T.FFN_DOWN_SHEXP))]
    for part in ("attn", "ffn"):
        for q in ("fn", "base", "scale"):
            pairs.append((f"{L}.hc_{part}_{q}", NAME[f"HC_{part.upper()}_{q.upper()}"]))
    for ours, pre in ((f"{a}.compressor", "ATTN"), (f"{a}.indexer.compressor", "INDEXER")):
        for theirs, kind in (("wkv.weight", "KV"), ("wgate.weight", "GATE"), ("ape", "APE"), ("norm.weight", "NORM")):
            pairs.append((f"{ours}.{theirs}", NAME[f"{pre}_COMPRESSOR_{kind}"]))
    return pairs


def _mtp_rules(hf: dict) -> list:
    """An MTP block's tensors (any kind above, and ``nextn.*``) under ``model.layers.{n + k}.<GGUF name after the
    block>``, read by nothing (the family ignores layers past ``num_hidden_layers``)."""
    n, k = hf["num_hidden_layers"], hf.get("num_nextn_predict_layers", 0)   # rules of absent blocks are skipped
    names = [gn for _, gn in _per_layer()] + [g(T.FFN_GATE_EXP), g(T.FFN_UP_EXP)]
    names += [f"blk.{{bid}}.nextn.{x}.weight" for x in ("eh_proj", "enorm", "hnorm", "embed_tokens",
                                                         "shared_head_head", "shared_head_norm")]
    out = []
    for b in range(n, n + k):
        for gn in names:
            name = gn.format(bid=b)
            out.append(rule(f"model.layers.{b}.{name.split('.', 2)[2]}", name))
    return out


def deepseek4_rules(hf: dict) -> list:
    top = [rule("model.embed_tokens.weight", g(T.TOKEN_EMBD)), rule("head.weight", g(T.OUTPUT)),
           rule("model.norm.weight", g(T.OUTPUT_NORM))]
    top += [rule(f"model.hc_head.hc_{q}", NAME[f"OUTPUT_HC_{q.upper()}"]) for q in ("fn", "base", "scale")]
    experts = rule(f"{L}.ffn.experts.gate_up_proj", g(T.FFN_GATE_EXP), g(T.FFN_UP_EXP),
                   fn=lambda a, b: torch.cat([a, b], dim=1), what="gate (w1) and up (w3) experts stacked")
    return top + [rule(h, gn) for h, gn in _per_layer()] + [experts] + _mtp_rules(hf)


ARCHS = (
    Arch(ARCH, "deepseek_v4", deepseek4_config, deepseek4_rules,
         doc="DeepSeek-V4 (CSA / HCA compressed attention, mHC, hash then sqrt-softplus MoE)"),
)
