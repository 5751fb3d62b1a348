"""Llama 4 (Meta, 2025; ``llama4_text``, and the ``llama4`` wrapper of Scout and Maverick, whose vision tower
and projector are not built: their tensors are ignored, ``vision_params`` counts them apart and the model's notes
say how many). A decoder of GQA attention layers, each followed by a SwiGLU MLP or a mixture of experts.

Attention, per layer (transformers' ``Llama4TextAttention``; the ``chunked`` store's docstring maps the fields):

* a RoPE layer (``no_rope_layers[i]`` = 1; by default every layer but each ``no_rope_layer_interval``-th, 4)
  rotates interleaved pairs (``rope_interleaved``) with ``rope_theta`` (500,000 by default) and, with
  ``use_qk_norm``, divides each query and key head by its root mean square after the rotation
  (``qk_l2_norm``, eps ``rms_norm_eps``). ``layer_types`` (by default "chunked_attention" on the RoPE layers)
  makes it the ``chunked`` store, ``attention_chunk_size`` tokens a chunk (8,192 published);
* a NoPE layer is global ``attention`` without positions, its queries scaled by Llama 4's temperature
  (``attn_temperature_tuning``, ``floor_scale``, ``attn_scale`` -> ``attn_temperature_scale``).

Channel, per layer: experts on the layers ``moe_layers`` lists (by default every
``interleave_moe_layer_step``-th: all of Scout's, every second of Maverick's), else a SwiGLU MLP of width
``intermediate_size_mlp``. The experts (``Llama4TextMoe``): ``num_local_experts`` of width
``intermediate_size``, ``num_experts_per_tok`` (1) chosen by the router's top logits, each weighted by the
sigmoid of its logit; the weight scales the expert's input, not its output (``MoEConfig.scale_input``);
one shared expert of the same width, unweighted.

Fields the published files leave out take transformers' defaults (``Llama4TextConfig``, ``DEFAULTS``).
Scout's ``rope_scaling`` (rope_type "llama3") is passed to the RoPE layers (``AttentionConfig.rope_scaling``,
``storelab.ops.rope``); the other scalings storelab runs (linear, yarn) go the same way, any other is refused.

Names (transformers' ``Llama4ForCausalLM``: ``model.``; the wrapper's: ``model.language_model.`` in
transformers 5, ``language_model.model.`` in the published files; ``a`` = ``<prefix>layers.i``):

| ours                                   | transformers                                          |
|----------------------------------------|-------------------------------------------------------|
| blocks.i.token.{q,k,v,o}_proj          | a.self_attn.{q,k,v,o}_proj                            |
| blocks.i.channel.{gate,up,down}_proj   | a.feed_forward.{gate,up,down}_proj (dense layers)     |
| blocks.i.channel.router                | a.feed_forward.router.weight                          |
| blocks.i.channel.gate_up [E, 2I, D]    | a.feed_forward.experts.gate_up_proj [E, D, 2I], transposed |
| blocks.i.channel.down [E, D, I]        | a.feed_forward.experts.down_proj [E, I, D], transposed |
| blocks.i.channel.shared_{gate,up,down}_proj | a.feed_forward.shared_expert.{gate,up,down}_proj |
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families._common import base_entries, gated_mlp, layer_prefix
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import (CHUNKED, FULL, RUNS_ROPE, Decl, Fields, attention_entries, rope_of,
                                                  text_fields, to_config as reader_config)
from storelab.checkpoint.table import Src, copy

# transformers' Llama4TextConfig defaults, for the fields a published file leaves out
DEFAULTS = dict(hidden_size=5120, intermediate_size=8192, intermediate_size_mlp=16384, num_hidden_layers=48,
                num_attention_heads=40, num_key_value_heads=8, hidden_act="silu", rms_norm_eps=1e-5,
                num_experts_per_tok=1, num_local_experts=16, interleave_moe_layer_step=1, use_qk_norm=True,
                no_rope_layer_interval=4, attention_chunk_size=8192, attn_temperature_tuning=True,
                floor_scale=8192, attn_scale=0.1, attention_bias=False, vocab_size=202048)
LAYOUTS = (("model.", "lm_head.weight"), ("model.language_model.", "lm_head.weight"),
           ("language_model.model.", "language_model.lm_head.weight"))
IGNORED = (r"rotary_emb\.", r"(^|\.)vision_model\.", r"(^|\.)multi_modal_projector\.")


def with_defaults(hf: dict) -> dict:
    """The config with transformers' defaults filled into the text part (a wrapper keeps its own fields)."""
    t = text_fields(hf)
    filled = {**DEFAULTS, **{k: v for k, v in t.d.items() if v is not None}}
    f = Fields(filled, t.where, t.prefix)
    n = f.int("num_hidden_layers", minimum=1)
    if not filled.get("no_rope_layers"):  # absent or [] (Scout's file): every interval-th layer has no RoPE
        every = f.int("no_rope_layer_interval", minimum=1)
        filled["no_rope_layers"] = [int((i + 1) % every != 0) for i in range(n)]
    if not filled.get("layer_types"):
        filled["layer_types"] = [CHUNKED if r else FULL for r in f.list("no_rope_layers", n=n)]
    return {**hf, "text_config": filled} if t.prefix else filled


def llama4_token(t: Fields, i: int, kind: str, decl: Decl, D: int, eps: float):
    from storelab.stores.attention import AttentionConfig
    from storelab.stores.chunked import ChunkedConfig

    H = t.int("num_attention_heads", minimum=1)
    uses_rope = bool(t.list("no_rope_layers", n=t.int("num_hidden_layers"))[i])
    bias = t.bool("attention_bias")
    common = dict(d_model=D, n_heads=H, n_kv_heads=t.int("num_key_value_heads", minimum=1),
                  head_dim=t.int("head_dim", default=D // H, minimum=1), rope_theta=rope_of(t, theta=5e5).theta,
                  qkv_bias=bias, out_bias=bias, norm_eps=eps)
    if uses_rope:
        rp = rope_of(t, theta=5e5)
        common.update(rope_interleaved=True, qk_l2_norm=t.bool("use_qk_norm"),
                      rope_scaling=rp.scaling if rp.kind in RUNS_ROPE[1:] else None)
    else:
        common.update(partial_rotary=0.0, attn_temperature_tuning=t.bool("attn_temperature_tuning"),
                      floor_scale=t.int("floor_scale", minimum=1), attn_temperature_scale=t.float("attn_scale", minimum=0.0))
    if kind == CHUNKED and t.has("attention_chunk_size"):
        return ChunkedConfig(chunk=t.int("attention_chunk_size", minimum=1), **common)
    if kind in (CHUNKED, FULL):  # a chunked layer without a chunk size reads the whole context
        return AttentionConfig(**common)
    raise t._err(f"layer_types[{i}]", f"{kind!r} is not a Llama 4 layer type (chunked_attention, full_attention)")


DECL = Decl(name="llama4", model_types=("llama4", "llama4_text"), title="Llama 4 (checkpoint)", router="sigmoid",
            norm_topk_default=False, eps=1e-5, theta=5e5, token=llama4_token,
            ffn_width=lambda t: t.int("intermediate_size_mlp", minimum=1))


def vision_params(hf: dict) -> int:
    """Parameters of the wrapper's vision tower and projector (``Llama4VisionModel``, ``Llama4MultiModalProjector``;
    not built), from ``vision_config``; 0 without one. With H ``hidden_size``, I ``intermediate_size``, L layers,
    P ``patch_size``, S ``image_size``: the patch embedding [H, C P^2] (no bias), the class embedding [H], the
    position table [(S / P)^2 + 1, H], LayerNorms before and after the layers (2H each); per layer q, k, v, o
    [H, H] and fc1 [I, H], fc2 [H, I], all with biases, and two LayerNorms; the pixel-shuffle adapter's fc1
    [projector_input_dim, I] and fc2 [projector_output_dim]^2 and the projector [text hidden, vision_output_dim],
    none with a bias."""
    top = Fields(hf)
    if not top.has("vision_config"):
        return 0
    v = top.sub("vision_config")
    H, I, L = (v.int(k, minimum=1) for k in ("hidden_size", "intermediate_size", "num_hidden_layers"))
    P, S, C = v.int("patch_size", minimum=1), v.int("image_size", minimum=1), v.int("num_channels", default=3)
    tower = C * P * P * H + H + ((S // P) ** 2 + 1) * H + 4 * H + L * (4 * H * H + 2 * H * I + I + 9 * H)
    adapter = v.int("projector_input_dim", minimum=1) * I + v.int("projector_output_dim", minimum=1) ** 2
    projector = v.int("vision_output_dim", minimum=1) * text_fields(with_defaults(hf)).int("hidden_size")
    return tower + adapter + projector


def to_config(hf: dict):
    cfg = reader_config(DECL, with_defaults(hf))
    t = text_fields(with_defaults(hf))
    layers = [dataclasses.replace(lay, channel=dataclasses.replace(
        lay.channel, n_shared=1, d_shared=t.int("intermediate_size", minimum=1), scale_input=True))
              if lay.channel.KIND == "moe" else lay for lay in cfg.layers]
    cfg = dataclasses.replace(cfg, layers=layers)
    vision = vision_params(hf)
    if vision:
        cfg.notes = f"vision tower and projector (vision_config; not built, counted apart): {vision:,} parameters"
    return cfg


def _transposed(name: str, what: str) -> Src:
    return Src((name,), lambda w: w.transpose(1, 2), what)


def table(hf: dict, cfg, names: set[str]) -> dict:
    pre, head = layer_prefix(names, LAYOUTS[2:])
    tab: dict = {}
    base_entries(tab, cfg, prefix=pre, head=head)
    for i, lay in enumerate(cfg.layers):
        a, b = f"{pre}layers.{i}", f"blocks.{i}"
        attention_entries(tab, f"{b}.token", f"{a}.self_attn", lay.token)
        f, c = f"{a}.feed_forward", f"{b}.channel"
        if lay.channel.KIND == "ffn":
            gated_mlp(tab, (f"{c}.gate_proj", f"{c}.up_proj", f"{c}.down_proj"), f, names, lay.channel.d_ff)
            continue
        tab[f"{c}.router.weight"] = copy(f"{f}.router.weight")
        tab[f"{c}.gate_up"] = _transposed(f"{f}.experts.gate_up_proj", "[E, D, 2I] -> [E, 2I, D]")
        tab[f"{c}.down"] = _transposed(f"{f}.experts.down_proj", "[E, I, D] -> [E, D, I]")
        gated_mlp(tab, (f"{c}.shared_gate_proj", f"{c}.shared_up_proj", f"{c}.shared_down_proj"),
                  f"{f}.shared_expert", names, lay.channel.shared_width)
    return tab


def runs(hf: dict) -> None:
    """The RoPE scalings storelab's attention computes (``RUNS_ROPE``: Scout's "llama3" among them)."""
    t = text_fields(with_defaults(hf))
    rp = rope_of(t, theta=5e5)
    if rp.kind not in RUNS_ROPE:
        key = "rope_scaling" if t.has("rope_scaling") else "rope_parameters"
        raise t._err(f"{key}.rope_type", f"{rp.kind!r}: storelab's attention runs {', '.join(RUNS_ROPE)} "
                                         f"(accounting reads it; loading weights does not)")


FAMILY = Family(stores=("attention", "chunked", "ffn", "moe", "residual"),
                name="llama4", model_types=DECL.model_types, to_config=to_config, table=table,
                ignored=lambda hf: IGNORED, runs=runs)
