"""The ``gemma4`` GGUF architecture (Gemma 4 31B dense and 26B-A4B MoE, as llama.cpp, Ollama and LM Studio users
hold them), read back into transformers' ``gemma4_text`` (``storelab/checkpoint/families/gemma4.py``).

What llama.cpp's converter does (``conversion/gemma.py`` ``Gemma4Model``, a ``Gemma3Model``, over
``conversion/base.py`` ``TextModel.set_gguf_parameters``), what its loader and graph read
(``src/models/gemma4.cpp``) and how it is undone here:

* norms: ``norm_shift`` is 0 (Gemma 4 applies w, not Gemma 3's 1 + w), so every norm is stored as it is;
* metadata: ``attention.key_length`` / ``value_length`` = ``global_head_dim``, ``*_swa`` = ``head_dim``;
  ``attention.head_count_kv`` one count, or per layer (the window layers' ``num_key_value_heads``, the full
  layers' ``num_global_key_value_heads``) when the config names the latter; ``attention.sliding_window_pattern``
  (true = a window layer) is ``layer_types``; ``rope.freq_base`` / ``rope.freq_base_swa`` the full and window
  layers' thetas (absent swa: llama.cpp takes the full one); ``expert_count``, ``expert_used_count`` (from
  ``top_k_experts``) and ``expert_feed_forward_length`` the MoE block's sizes; ``final_logit_softcapping``;
* ``attention_k_eq_v``: the converter writes no ``attn_v`` where transformers has no ``v_proj``, and llama.cpp
  then takes the raw key projection as the values (``Vcur = Kcur``, before the k norm and RoPE). So a file whose
  full layers hold no ``attn_v`` is read as ``attention_k_eq_v`` with those layers' KV heads as
  ``num_global_key_value_heads``; the KV cache still keeps V beside K (the values are RMS-normed, the keys normed
  and rotated: two different rows per token);
* proportional RoPE (full layers): no metadata, but one F32 tensor ``rope_freqs.weight`` of ``global_head_dim / 2``
  factors, 1.0 for the first int(global_head_dim x partial_rotary_factor / 2) pairs and 1e30 (a frequency of ~0:
  never turning) for the rest, with ``rope.dimension_count`` the whole head (``generate_extra_tensors``); the
  window layers rotate their whole head (``rope.dimension_count_swa``). The factors give back
  ``partial_rotary_factor`` (a config tensor, read at header time);
* router: ``router.proj`` is ``ffn_gate_inp``, ``router.scale`` is ``ffn_gate_inp.scale`` as it is (llama.cpp
  multiplies the weightless RMS-normed stream by 1/sqrt(D) and the scale, as transformers does), and
  ``router.per_expert_scale`` is ``ffn_down_exps.scale`` as it is (applied to each chosen expert's output,
  after the softmax top-k weights are renormalised: the same product). A file without the latter (the
  converter's NVFP4 path folds it into the expert weights) has per-expert scales of 1;
* experts: ``gate_up_proj`` ``[E, 2I, D]`` is ``ffn_gate_up_exps`` as it is (or ``ffn_gate_exps`` and
  ``ffn_up_exps`` stacked, gate first, which llama.cpp's loader also takes); ``down_proj`` is ``ffn_down_exps``;
  the dense MLP beside them is ``ffn_{gate,up,down}`` with ``ffn_norm`` / ``post_ffw_norm_1``, the experts'
  norms ``pre_ffw_norm_2`` / ``post_ffw_norm_2``, their sum normed by ``post_ffw_norm``;
* ``layer_scalar`` is ``layer_output_scale.weight`` ``[1]``; the attention logits are not scaled (llama.cpp's
  ``f_attention_scale`` 1.0, whatever the file says); the embedding is scaled by sqrt(D) in both.

Refused by name: per-layer input embeddings (``embedding_length_per_layer_input`` > 0, the E2B / E4B releases,
with their ``per_layer_*`` tensors), layers reusing another's KV (``attention.shared_kv_layers`` > 0), per-layer
feed-forward widths (``use_double_wide_mlp``), RoPE factors other than the converter's proportional ones, a window
layer without ``attn_v``, full layers that disagree on ``attn_v``, and a last layer that is a window layer
(transformers forces Gemma 4's last layer global; llama.cpp would not).
"""

from __future__ import annotations

import torch
from gguf.constants import MODEL_TENSOR as T

from storelab.checkpoint.gguf.arch import LAYER, Arch, Meta, cat_rows, common_config, g, rule
from storelab.checkpoint.shards import CheckpointError

__all__ = ["ARCHS"]

ATTN, MLP = f"{LAYER}.self_attn", f"{LAYER}.mlp"
ROPE_FREQS = g(T.ROPE_FREQS)
UNROTATED = 1e29  # the converter's 1e30 (a pair that never turns), as F32, is above this


def _swa_pattern(m: Meta, n: int) -> list[bool]:
    swa = m.raw("attention.sliding_window_pattern")
    if not isinstance(swa, list) or len(swa) != n or any(not isinstance(x, (bool, int)) for x in swa):
        raise m._err("attention.sliding_window_pattern", f"a list of {n} flags (true: a window layer)", swa)
    swa = [bool(x) for x in swa]
    if swa[-1]:
        raise m._err("attention.sliding_window_pattern", "a full-attention last layer (transformers' Gemma 4 "
                     "makes the last layer global)", swa)
    return swa


def _refuse(m: Meta, n: int) -> None:
    """The Gemma 4 devices the ``gemma4`` family does not read, each named by its GGUF key."""
    if m.int("embedding_length_per_layer_input", 0) > 0:
        raise m._err("embedding_length_per_layer_input", "0 (per-layer input embeddings, Gemma 4 E2B / E4B's "
                     "second embedding table, have no store in storelab yet)", m.raw("embedding_length_per_layer_input"))
    if m.int("attention.shared_kv_layers", 0) > 0:
        raise m._err("attention.shared_kv_layers", "0 (layers reusing an earlier layer's keys and values, Gemma 4 "
                     "E2B / E4B, are not read yet)", m.raw("attention.shared_kv_layers"))
    ff = m.raw("feed_forward_length")
    if isinstance(ff, list) and len(set(ff)) != 1:
        raise m._err("feed_forward_length", "one width for every layer (use_double_wide_mlp's per-layer widths "
                     "come with shared-KV layers, not read)", ff)
    if m.has("rope.scaling.type") and m.str("rope.scaling.type") != "none":
        raise m._err("rope.scaling.type", "none (Gemma 4's full layers scale by rope_freqs.weight alone)",
                     m.raw("rope.scaling.type"))
    for key, swa_key in (("attention.key_length", "attention.value_length"),
                         ("attention.key_length_swa", "attention.value_length_swa")):
        if m.has(swa_key) and m.int(swa_key, minimum=1) != m.int(key, minimum=1):
            raise m._err(swa_key, f"equal to {m.full(key)} (llama.cpp's gemma4 requires it)", m.raw(swa_key))


def _partial_rotary(m: Meta, d: int) -> float:
    """``partial_rotary_factor`` of the full layers from ``rope_freqs.weight``: r ones then 1e30s, r = int(d p / 2)."""
    f = m.values(ROPE_FREQS).flatten().tolist()
    r = next((i for i, x in enumerate(f) if x != 1.0), len(f))
    if len(f) != d // 2 or r == 0 or any(x < UNROTATED for x in f[r:]):
        raise CheckpointError(f"{m.path}: tensor {ROPE_FREQS!r}: not Gemma 4's proportional RoPE factors "
                              f"({d // 2} values: ones, then 1e30 for the pairs that never turn), got {f}")
    p = 2 * r / d
    if int(d * p / 2) != r:
        raise CheckpointError(f"{m.path}: tensor {ROPE_FREQS!r}: {r} turning pairs of {d // 2} give no "
                              f"partial_rotary_factor p with int({d} p / 2) = {r}")
    return p


def gemma4_config(m: Meta) -> dict:
    hf = common_config(m)
    n, H = hf["num_hidden_layers"], hf["num_attention_heads"]
    _refuse(m, n)
    swa = _swa_pattern(m, n)
    kv = m.ints("attention.head_count_kv", n) if m.has("attention.head_count_kv") else [H] * n
    has_v = [g(T.ATTN_V).format(bid=i) in m.shapes for i in range(n)]
    for i in range(n):
        if swa[i] and not has_v[i]:
            raise CheckpointError(f"{m.path}: tensor 'blk.{i}.attn_v.weight' missing on a window layer "
                                  f"(Gemma 4 reads values from keys on full layers only)")
    full = [i for i in range(n) if not swa[i]]
    k_eq_v = {not has_v[i] for i in full}
    if len(k_eq_v) > 1:
        raise CheckpointError(f"{m.path}: full layers {[i for i in full if has_v[i]]} hold attn_v and "
                              f"{[i for i in full if not has_v[i]]} do not: transformers' attention_k_eq_v is "
                              "one setting for every full layer")
    k_eq_v = k_eq_v.pop()
    kv_swa, kv_full = {kv[i] for i in range(n) if swa[i]}, {kv[i] for i in full}
    if len(kv_swa) > 1 or len(kv_full) > 1 or (not k_eq_v and kv_swa and kv_swa != kv_full):
        raise m._err("attention.head_count_kv", "one count on the window layers and one on the full layers, the "
                     "same unless the full layers read values from keys (no attn_v)", kv)
    K_full, K_swa = hf["head_dim"], m.int("attention.key_length_swa", minimum=2)
    if m.int("rope.dimension_count", K_full, minimum=1) != K_full:
        raise m._err("rope.dimension_count", f"{K_full}, the full layers' head (their partial rotation is "
                     f"{ROPE_FREQS!r})", m.raw("rope.dimension_count"))
    if m.int("rope.dimension_count_swa", K_swa, minimum=1) != K_swa:
        raise m._err("rope.dimension_count_swa", f"{K_swa}, the window layers' whole head (transformers' Gemma 4 "
                     "rotates it all)", m.raw("rope.dimension_count_swa"))
    theta = hf.pop("rope_theta")
    rope = {"sliding_attention": {"rope_type": "default", "rope_theta": m.float("rope.freq_base_swa", theta)}}
    if full:
        rope["full_attention"] = {"rope_type": "proportional", "rope_theta": theta,
                                  "partial_rotary_factor": _partial_rotary(m, K_full)}
    ff = m.raw("feed_forward_length")
    moe = [g(T.FFN_GATE_INP).format(bid=i) in m.shapes for i in range(n)]
    if len(set(moe)) > 1:
        raise CheckpointError(f"{m.path}: blocks {[i for i in range(n) if moe[i]]} hold experts (ffn_gate_inp) and "
                              "the others do not: transformers' enable_moe_block is one setting for every layer")
    hf.update(head_dim=K_swa, global_head_dim=K_full, num_key_value_heads=min(kv_swa or kv_full),
              attention_k_eq_v=k_eq_v, num_global_key_value_heads=min(kv_full) if k_eq_v else None,
              layer_types=["sliding_attention" if x else "full_attention" for x in swa],
              sliding_window=m.int("attention.sliding_window", minimum=2), rope_parameters=rope,
              intermediate_size=ff[0] if isinstance(ff, list) else m.int("feed_forward_length", minimum=1),
              final_logit_softcapping=m.raw("final_logit_softcapping", None), hidden_activation="gelu_pytorch_tanh",
              attention_bias=False, hidden_size_per_layer_input=0, num_kv_shared_layers=0,
              enable_moe_block=moe[0])
    if moe[0]:
        hf.update(num_experts=m.int("expert_count", minimum=1), top_k_experts=m.int("expert_used_count", minimum=1),
                  moe_intermediate_size=m.int("expert_feed_forward_length", minimum=1))
    return hf


def gemma4_rules(hf: dict) -> list:
    rules = [rule("model.embed_tokens.weight", g(T.TOKEN_EMBD)), rule("lm_head.weight", g(T.OUTPUT)),
             rule("model.norm.weight", g(T.OUTPUT_NORM)), rule(f"{LAYER}.layer_scalar", g(T.LAYER_OUT_SCALE))]
    for ours, kind in (("input_layernorm", T.ATTN_NORM), ("post_attention_layernorm", T.ATTN_POST_NORM),
                       ("pre_feedforward_layernorm", T.FFN_PRE_NORM), ("post_feedforward_layernorm", T.FFN_POST_NORM),
                       ("pre_feedforward_layernorm_2", T.FFN_PRE_NORM_2),
                       ("post_feedforward_layernorm_1", T.FFN_POST_NORM_1),
                       ("post_feedforward_layernorm_2", T.FFN_POST_NORM_2)):
        rules.append(rule(f"{LAYER}.{ours}.weight", g(kind)))
    for p, kind in (("q_proj", T.ATTN_Q), ("k_proj", T.ATTN_K), ("v_proj", T.ATTN_V), ("o_proj", T.ATTN_OUT),
                    ("q_norm", T.ATTN_Q_NORM), ("k_norm", T.ATTN_K_NORM)):
        rules.append(rule(f"{ATTN}.{p}.weight", g(kind)))
    for p, kind in (("gate_proj", T.FFN_GATE), ("up_proj", T.FFN_UP), ("down_proj", T.FFN_DOWN)):
        rules.append(rule(f"{MLP}.{p}.weight", g(kind)))
    r, x = f"{LAYER}.router", f"{LAYER}.experts"
    return rules + [
        rule(f"{r}.proj.weight", g(T.FFN_GATE_INP)), rule(f"{r}.scale", g(T.FFN_GATE_INP, ".scale")),
        rule(f"{r}.per_expert_scale", g(T.FFN_DOWN_EXP, ".scale")),
        rule(f"{r}.per_expert_scale", g(T.FFN_GATE_INP), fn=lambda w: torch.ones(w.shape[0], dtype=w.dtype),
             what="no ffn_down_exps.scale: every expert's scale 1 (folded into its weights, or none)"),
        rule(f"{x}.gate_up_proj", g(T.FFN_GATE_UP_EXP)),
        rule(f"{x}.gate_up_proj", g(T.FFN_GATE_EXP), g(T.FFN_UP_EXP), fn=cat_rows,
             what="gate and up experts stacked, gate rows first"),
        rule(f"{x}.down_proj", g(T.FFN_DOWN_EXP))]


ARCHS = (
    Arch("gemma4", "gemma4_text", gemma4_config, gemma4_rules, config_tensors=(ROPE_FREQS,),
         doc="Gemma 4: window and global layers of their own heads, values from keys, proportional RoPE, "
             "an MLP beside routed experts"),
)
