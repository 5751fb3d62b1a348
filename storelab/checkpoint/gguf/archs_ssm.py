"""GGUF architectures of the Mamba-2 family and its hybrids: ``mamba2``, ``nemotron_h`` / ``nemotron_h_moe``
(Nemotron-H, Nemotron 3), ``granitehybrid`` (Granite 4.0-H), read back into transformers' ``mamba2``,
``nemotron_h`` and ``granitemoehybrid``; ``falcon-h1`` is refused by name.

What llama.cpp's converter does (``conversion/mamba.py`` ``Mamba2Model``, ``conversion/granite.py``
``GraniteHybridModel`` / ``GraniteMoeModel`` / ``GraniteModel``, ``conversion/nemotron.py``
``NemotronHModel``, ``conversion/llama.py`` ``LlamaModel.permute``) and how it is undone here:

* every Mamba-2 mixer: ``A_log`` stored as ``ssm_a`` = -exp(A_log) shaped [H, 1] (A_log = log(-ssm_a)
  flattened), ``D`` as ``ssm_d`` [H, 1], ``dt_bias`` as ``ssm_dt.bias``, the conv ``[C, 1, W]`` squeezed to
  ``[C, W]``, the gated norm's weight [d_inner] as ``ssm_norm`` [groups, d_inner / groups] (flattened back);
* metadata: ``ssm.inner_size`` = heads x head size, ``ssm.time_step_rank`` = heads, ``ssm.state_size``,
  ``ssm.group_count``, ``ssm.conv_kernel``; the hybrids write per-layer ``attention.head_count_kv`` (0 for a
  Mamba layer) and Nemotron-H per-layer ``feed_forward_length`` (0 for a layer without an MLP). The layer
  pattern is read from which tensors each block holds (``ssm_in``: Mamba-2, ``attn_q``: attention,
  ``ffn_up``: MLP, ``ffn_up_exps``: experts), which is exact where the arrays are not (a dense MLP layer
  of Nemotron 3 writes 0 in ``feed_forward_length``, as a Mamba layer does);
* the attention layers of the Granite / Nemotron-H converters go through ``LlamaModel.modify_tensors``:
  q and k rows permuted per head for GGML's RoPE (undone with ``unpermute``; harmless for their NoPE);
* Granite: ``shared_mlp.input_linear`` [2S, D] split into ``ffn_gate_shexp`` / ``ffn_up_shexp`` (experts
  present) or ``ffn_gate`` / ``ffn_up``; ``block_sparse_moe.input_linear`` into ``ffn_gate_exps`` /
  ``ffn_up_exps``; the multipliers as ``attention.scale``, ``embedding_scale``, ``residual_scale``,
  ``logit_scale``; RoPE used iff ``rope.scaling.finetuned`` (the converter writes true only for Bamba and
  for models without Mamba layers).

``falcon-h1``: storelab has no Falcon-H1 family (attention and Mamba-2 side by side in one layer, muP
multipliers), so its header is read enough to refuse it by name.
"""

from __future__ import annotations

import torch
from gguf.constants import MODEL_TENSOR as T
from torch import Tensor

from storelab.checkpoint.gguf.arch import Arch, Meta, g, rule, unpermute
from storelab.checkpoint.shards import CheckpointError

__all__ = ["ARCHS"]


def _blocks(m: Meta, n: int) -> list[set[str]]:
    """Per block, which of the mixers / channel kinds its tensors show."""
    out = []
    for i in range(n):
        has = set()
        for kind, name in (("mamba", T.SSM_IN), ("attention", T.ATTN_Q), ("mlp", T.FFN_UP), ("moe", T.FFN_UP_EXP)):
            if g(name).format(bid=i) in m.shapes:
                has.add(kind)
        out.append(has)
    return out


def _ssm(m: Meta) -> dict:
    """The Mamba-2 mixer's fields (transformers' ``mamba2`` names; the hybrids rename them)."""
    inner, H = m.int("ssm.inner_size", minimum=1), m.int("ssm.time_step_rank", minimum=1)
    if inner % H:
        raise m._err("ssm.inner_size", f"a multiple of ssm.time_step_rank ({H})", inner)
    return {"num_heads": H, "head_dim": inner // H, "state_size": m.int("ssm.state_size", minimum=1),
            "n_groups": m.int("ssm.group_count", 1, minimum=1), "conv_kernel": m.int("ssm.conv_kernel", minimum=1),
            "use_conv_bias": "blk.0.ssm_conv1d.bias" in m.shapes, "use_bias": "blk.0.ssm_in.bias" in m.shapes}


def _eps(m: Meta, default: float) -> float:
    if m.has("attention.layer_norm_rms_epsilon"):
        return m.float("attention.layer_norm_rms_epsilon")
    return m.float("attention.layer_norm_epsilon", default)


def mamba2_config(m: Meta) -> dict:
    D, n = m.int("embedding_length", minimum=1), m.int("block_count", minimum=1)
    hf = {"hidden_size": D, "num_hidden_layers": n, "layer_norm_epsilon": _eps(m, 1e-5),
          "vocab_size": m.tensor_shape("token_embd.weight")[0], "tie_word_embeddings": "output.weight" not in m.shapes,
          "rms_norm": True}
    hf.update(_ssm(m))
    hf["expand"] = hf["num_heads"] * hf["head_dim"] // D
    if hf["expand"] * D != hf["num_heads"] * hf["head_dim"]:
        raise m._err("ssm.inner_size", f"a multiple of embedding_length ({D}) for transformers' mamba2 (expand)",
                     hf["num_heads"] * hf["head_dim"])
    return hf


def _mixer_rules(x: str, b: str) -> list:
    """A Mamba-2 mixer at ``x`` (transformers' ``Mamba2Mixer`` names) from block ``b``'s ``ssm_*`` tensors."""
    rules = [rule(f"{x}.conv1d.weight", g(T.SSM_CONV1D), fn=lambda w: w.unsqueeze(1), what="[C, W] -> [C, 1, W]"),
             rule(f"{x}.conv1d.bias", g(T.SSM_CONV1D, ".bias")),
             rule(f"{x}.A_log", g(T.SSM_A, ""), fn=lambda a: torch.log(-a).reshape(-1), what="-exp(A_log) [H, 1] -> A_log"),
             rule(f"{x}.D", g(T.SSM_D, ""), fn=lambda d: d.reshape(-1), what="[H, 1] -> [H]"),
             rule(f"{x}.dt_bias", g(T.SSM_DT, ".bias")),
             rule(f"{x}.norm.weight", g(T.SSM_NORM), fn=lambda w: w.reshape(-1), what="[groups, d / groups] -> [d]")]
    for sfx in (".weight", ".bias"):
        rules += [rule(f"{x}.in_proj{sfx}", g(T.SSM_IN, sfx)), rule(f"{x}.out_proj{sfx}", g(T.SSM_OUT, sfx))]
    return rules


def mamba2_rules(hf: dict) -> list:
    b = "backbone.layers.{bid}"
    return [rule("backbone.embeddings.weight", g(T.TOKEN_EMBD)), rule("backbone.norm_f.weight", g(T.OUTPUT_NORM)),
            rule("lm_head.weight", g(T.OUTPUT)), rule(f"{b}.norm.weight", g(T.ATTN_NORM))] + _mixer_rules(f"{b}.mixer", b)


def _attention_rules(a: str, H: int, KV: int) -> list:
    rules = []
    for sfx in (".weight", ".bias"):
        rules += [rule(f"{a}.q_proj{sfx}", g(T.ATTN_Q, sfx), fn=unpermute(H), what="q rows un-permuted (RoPE pairs)"),
                  rule(f"{a}.k_proj{sfx}", g(T.ATTN_K, sfx), fn=unpermute(KV), what="k rows un-permuted (RoPE pairs)"),
                  rule(f"{a}.v_proj{sfx}", g(T.ATTN_V, sfx)), rule(f"{a}.o_proj{sfx}", g(T.ATTN_OUT, sfx))]
    return rules


def _attn_heads(m: Meta, n: int) -> tuple[int, int]:
    """(query heads, key-value heads) of the attention layers: ``attention.head_count_kv`` is per layer, 0
    for a Mamba layer; every attention layer must have the same count."""
    kv = {x for x in m.ints("attention.head_count_kv", n) if x}
    if len(kv) > 1:
        raise m._err("attention.head_count_kv", "one count for every attention layer", sorted(kv))
    H = m.int("attention.head_count", minimum=0)
    return H, (kv.pop() if kv else H)


# ---- Nemotron-H ------------------------------------------------------------------------------------------

_CODE = {"mamba": "M", "attention": "*", "mlp": "-", "moe": "E"}


def nemotron_h_config(m: Meta) -> dict:
    n = m.int("block_count", minimum=1)
    mtp = m.int("nextn_predict_layers", 0)
    if mtp:
        raise m._err("nextn_predict_layers", "0 (Nemotron-H's folded MTP block is not mapped back to transformers' "
                     "mtp.* tensors yet)", mtp)
    pattern = ""
    for i, has in enumerate(_blocks(m, n)):
        if len(has) != 1:
            raise CheckpointError(f"{m.path}: block {i} holds {sorted(has) or 'no'} mixer tensors (ssm_in, attn_q, "
                                  f"ffn_up, ffn_up_exps): a Nemotron-H block has exactly one "
                                  f"(general.architecture {m.arch!r})")
        pattern += _CODE[has.pop()]
    H, KV = _attn_heads(m, n)
    ssm = _ssm(m)
    hf = {"hidden_size": m.int("embedding_length", minimum=1), "num_hidden_layers": n,
          "hybrid_override_pattern": pattern, "num_attention_heads": H, "num_key_value_heads": KV,
          "head_dim": m.int("attention.key_length", minimum=1), "layer_norm_epsilon": _eps(m, 1e-5),
          "mamba_num_heads": ssm["num_heads"], "mamba_head_dim": ssm["head_dim"], "ssm_state_size": ssm["state_size"],
          "n_groups": ssm["n_groups"], "conv_kernel": ssm["conv_kernel"], "use_conv_bias": ssm["use_conv_bias"],
          "use_bias": ssm["use_bias"], "attention_bias": "blk.{}.attn_q.bias".format(pattern.find("*")) in m.shapes,
          "mlp_bias": False, "mlp_hidden_act": "relu2", "max_position_embeddings": m.int("context_length", 0),
          "vocab_size": m.tensor_shape("token_embd.weight")[0], "tie_word_embeddings": "output.weight" not in m.shapes}
    ff = [x for x in m.ints("feed_forward_length", n) if x]
    if "-" in pattern:
        i = pattern.find("-")
        hf["intermediate_size"] = m.tensor_shape(g(T.FFN_UP).format(bid=i))[0]
    elif ff:
        hf["intermediate_size"] = ff[0]
    if "E" in pattern:
        hf.update(n_routed_experts=m.int("expert_count", minimum=1), num_experts_per_tok=m.int("expert_used_count", minimum=1),
                  moe_intermediate_size=m.int("expert_feed_forward_length", minimum=1),
                  moe_shared_expert_intermediate_size=m.int("expert_shared_feed_forward_length", 0),
                  n_shared_experts=m.int("expert_shared_count", 1), norm_topk_prob=bool(m.raw("expert_weights_norm", True)),
                  routed_scaling_factor=m.float("expert_weights_scale", 1.0), n_group=m.int("expert_group_count", 1),
                  topk_group=m.int("expert_group_used_count", 1))
        if m.has("moe_latent_size"):
            hf["moe_latent_size"] = m.int("moe_latent_size", minimum=1)
    return hf


def nemotron_h_rules(hf: dict) -> list:
    b, x = "backbone.layers.{bid}", "backbone.layers.{bid}.mixer"
    rules = [rule("backbone.embeddings.weight", g(T.TOKEN_EMBD)), rule("backbone.norm_f.weight", g(T.OUTPUT_NORM)),
             rule("lm_head.weight", g(T.OUTPUT)), rule(f"{b}.norm.weight", g(T.ATTN_NORM))]
    rules += _mixer_rules(x, b) + _attention_rules(x, hf["num_attention_heads"], hf["num_key_value_heads"])
    for sfx in (".weight", ".bias"):
        rules += [rule(f"{x}.up_proj{sfx}", g(T.FFN_UP, sfx)), rule(f"{x}.down_proj{sfx}", g(T.FFN_DOWN, sfx))]
    rules += [rule(f"{x}.gate.weight", g(T.FFN_GATE_INP)),
              rule(f"{x}.gate.e_score_correction_bias", g(T.FFN_EXP_PROBS_B, ".bias")),
              rule(f"{x}.experts.up_proj", g(T.FFN_UP_EXP)), rule(f"{x}.experts.down_proj", g(T.FFN_DOWN_EXP)),
              rule(f"{x}.shared_experts.up_proj.weight", g(T.FFN_UP_SHEXP)),
              rule(f"{x}.shared_experts.down_proj.weight", g(T.FFN_DOWN_SHEXP)),
              rule(f"{x}.fc1_latent_proj.weight", g(T.MOE_LATENT_DOWN)),
              rule(f"{x}.fc2_latent_proj.weight", g(T.MOE_LATENT_UP))]
    return rules


# ---- Granite 4.0-H ---------------------------------------------------------------------------------------

def granitehybrid_config(m: Meta) -> dict:
    n = m.int("block_count", minimum=1)
    types = []
    for i, has in enumerate(_blocks(m, n)):
        mixer = has & {"mamba", "attention"}
        if len(mixer) != 1:
            raise CheckpointError(f"{m.path}: block {i} holds {sorted(mixer) or 'no'} mixer tensors (ssm_in, attn_q): "
                                  f"a Granite hybrid block has exactly one (general.architecture {m.arch!r})")
        types.append(mixer.pop())
    H, KV = _attn_heads(m, n)
    D = m.int("embedding_length", minimum=1)
    ssm = _ssm(m)
    rope = bool(m.raw("rope.scaling.finetuned", False))
    hd = D // H
    if rope and m.int("rope.dimension_count", hd) != hd:
        raise m._err("rope.dimension_count", f"{hd} (the whole head: granitemoehybrid rotates whole heads; a "
                     f"partial rotation is Bamba's, read from its config.json by storelab's bamba family)",
                     m.raw("rope.dimension_count"))
    hf = {"hidden_size": D, "num_hidden_layers": n, "layer_types": types, "num_attention_heads": H,
          "num_key_value_heads": KV, "rms_norm_eps": _eps(m, 1e-6), "rope_theta": m.float("rope.freq_base", 10000.0),
          "position_embedding_type": "rope" if rope else "nope",
          "mamba_n_heads": ssm["num_heads"], "mamba_d_head": ssm["head_dim"], "mamba_d_state": ssm["state_size"],
          "mamba_n_groups": ssm["n_groups"], "mamba_d_conv": ssm["conv_kernel"], "mamba_conv_bias": ssm["use_conv_bias"],
          "mamba_proj_bias": ssm["use_bias"], "mamba_expand": ssm["num_heads"] * ssm["head_dim"] // D,
          "attention_bias": any(f"blk.{i}.attn_q.bias" in m.shapes for i in range(n)),
          "attention_multiplier": m.float("attention.scale", 1.0), "embedding_multiplier": m.float("embedding_scale", 1.0),
          "residual_multiplier": m.float("residual_scale", 1.0), "logits_scaling": m.float("logit_scale", 1.0),
          "max_position_embeddings": m.int("context_length", 0), "vocab_size": m.tensor_shape("token_embd.weight")[0],
          "tie_word_embeddings": "output.weight" not in m.shapes}
    if m.has("expert_count") and m.int("expert_count") > 0:
        hf.update(num_local_experts=m.int("expert_count"), num_experts_per_tok=m.int("expert_used_count", minimum=1),
                  intermediate_size=m.tensor_shape(g(T.FFN_UP_EXP).format(bid=0))[1],
                  shared_intermediate_size=m.int("expert_shared_feed_forward_length", minimum=1))
    else:
        hf.update(num_local_experts=0, shared_intermediate_size=m.tensor_shape(g(T.FFN_UP).format(bid=0))[0])
    return hf


def granitehybrid_rules(hf: dict) -> list:
    L = "model.layers.{bid}"
    cat0 = dict(fn=lambda a, b: torch.cat([a, b], dim=0), what="gate and up rows stacked")
    rules = [rule("model.embed_tokens.weight", g(T.TOKEN_EMBD)), rule("model.norm.weight", g(T.OUTPUT_NORM)),
             rule("lm_head.weight", g(T.OUTPUT)), rule(f"{L}.input_layernorm.weight", g(T.ATTN_NORM)),
             rule(f"{L}.post_attention_layernorm.weight", g(T.FFN_NORM))]
    rules += _mixer_rules(f"{L}.mamba", L) + _attention_rules(f"{L}.self_attn", hf["num_attention_heads"],
                                                            hf["num_key_value_heads"])
    s, e = f"{L}.shared_mlp", f"{L}.block_sparse_moe"
    rules += [rule(f"{s}.input_linear.weight", g(T.FFN_GATE_SHEXP), g(T.FFN_UP_SHEXP), **cat0),
              rule(f"{s}.input_linear.weight", g(T.FFN_GATE), g(T.FFN_UP), **cat0),
              rule(f"{s}.output_linear.weight", g(T.FFN_DOWN_SHEXP)), rule(f"{s}.output_linear.weight", g(T.FFN_DOWN)),
              rule(f"{e}.router.layer.weight", g(T.FFN_GATE_INP)),
              rule(f"{e}.input_linear.weight", g(T.FFN_GATE_EXP), g(T.FFN_UP_EXP),
                   fn=lambda a, b: torch.cat([a, b], dim=1), what="gate and up experts stacked"),
              rule(f"{e}.output_linear.weight", g(T.FFN_DOWN_EXP))]
    return rules


# ---- Falcon-H1: refused -----------------------------------------------------------------------------------

def falcon_h1_config(m: Meta) -> dict:
    raise CheckpointError(f"{m.path}: general.architecture 'falcon-h1' (Falcon-H1) is not read: storelab has no "
                          f"Falcon-H1 family yet (attention and Mamba-2 side by side in one layer, muP multipliers; "
                          f"its config.json is refused alike)")


def _no_rules(hf: dict) -> list:
    return []


ARCHS = (
    Arch("mamba2", "mamba2", mamba2_config, mamba2_rules, doc="Mamba-2 (SSD)"),
    Arch("nemotron_h", "nemotron_h", nemotron_h_config, nemotron_h_rules,
         doc="Nemotron-H: Mamba-2, NoPE attention, ReLU^2 MLP"),
    Arch("nemotron_h_moe", "nemotron_h", nemotron_h_config, nemotron_h_rules,
         doc="Nemotron 3: Mamba-2, NoPE attention, ReLU^2 experts with sigmoid routing"),
    Arch("granitehybrid", "granitemoehybrid", granitehybrid_config, granitehybrid_rules,
         doc="Granite 4.0-H: Mamba-2 and attention, experts beside a shared MLP"),
    Arch("falcon-h1", "falcon_h1", falcon_h1_config, _no_rules, doc="refused: no storelab family"),
)
