"""LFM3 (Liquid AI, ``lfm3``): LFM2's gated short convolutions (storelab's ``short_conv``, arXiv 2511.23404)
with two kinds of GQA attention, full and sliding-window, per ``layer_types`` ("conv", "full_attention",
"sliding_attention"; transformers' default: full at i % 4 == 2, sliding at i % 4 == 0 from layer 4 on, conv
elsewhere), a SwiGLU feed-forward ``intermediate_size`` wide on every layer, tied embeddings.

What LFM3 adds to LFM2's layers:

* sandwich norms (``use_sandwich_norm``, default true): x + norm2(f(norm1(x))) around the mixer and the
  feed-forward (``LayerConfig.norms = "sandwich"``); without it, LFM2's pre norms;
* each attention head's output scaled by sigmoid(W_g x), one number per head and token from a D -> H
  projection (``use_attention_gate``, default true; storelab's attention ``head_gate``);
* a per-head RMSNorm on queries and keys before RoPE (Qwen3's), biases with ``attention_bias``;
* a rope per layer type (``rope_parameters.full_attention`` / ``.sliding_attention``). The published
  default: plain RoPE, theta 10,000, on the sliding layers; "proportional" RoPE with theta 10^6 and
  ``partial_rotary_factor`` 0.5 on the full ones: of a head's K channels, pairs (i, i + K/2) for i < a =
  int(p K / 2) rotate with frequency theta^(-2i/K) (divided by ``factor``), the others not at all.
  storelab's partial rotary turns pairs (i, i + R/2) of the first R channels with theta'^(-2i/R): with
  R = 2a and theta' = theta^(R/K) the frequencies are the same, and the pairs become the same once the
  query and key channels of every head are reordered [0, a) + [K/2, K/2 + a) + the rest. Loading reorders
  the rows of ``q_proj`` / ``k_proj`` (and their biases) and the q/k norm weights so: a dot product of a
  query and a key does not see the order, so the logits are transformers' (the loaded tensors are not
  the file's). ``factor`` becomes a ``linear`` rope scaling.

The sliding layers keep the last ``sliding_window`` - 1 tokens (transformers' window counts the query).
Parameters per layer: the convolution's 4 D^2 + D W (in and out projections, W taps; biases with
``conv_bias``) or the attention's D(H + 2G)K + HKD, 2K norms and the D*H gate; the feed-forward 3 D I;
two norms (four with sandwich norms). The state: conv layers W - 1 inputs of D (transformers keeps W),
attention layers their keys and values (a window's of them on the sliding layers).

Names (transformers' ``Lfm3ForCausalLM``; ``a`` = ``model.layers.i``):

| ours                                     | transformers                                         |
|------------------------------------------|------------------------------------------------------|
| blocks.i.norm_token / norm_channel       | a.operator_norm / a.ffn_norm                         |
| blocks.i.post_norm_token / post_norm_channel | a.post_operator_norm / a.post_ffn_norm (sandwich) |
| blocks.i.token.in_proj, conv_weight, out_proj | a.conv.in_proj, a.conv.conv.weight, a.conv.out_proj (conv layers) |
| blocks.i.token.{q,k}_proj, q_norm, k_norm | a.self_attn.{q,k}_proj, q_norm, k_norm (rows reordered per head) |
| blocks.i.token.v_proj, o_proj, g_proj    | a.self_attn.v_proj, o_proj, gate_proj (in memory: g_proj) |
| blocks.i.channel.{gate,up,down}_proj     | a.feed_forward.w1 / w3 / w2                          |
| norm.weight                              | model.embedding_norm.weight                          |
"""

from __future__ import annotations

import dataclasses

import torch

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._common import layer_prefix, linear
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import FULL, SLIDING, Decl, Fields
from storelab.checkpoint.families.lfm2 import CONV, lfm2_token_table
from storelab.checkpoint.table import Src, copy

TYPES = (CONV, FULL, SLIDING)
ROPES = ("default", "proportional")


def lfm3_types(t: Fields, n: int) -> list[str]:
    """``layer_types``, else transformers' default pattern."""
    if t.has("layer_types"):
        types = t.list("layer_types", n=n)
    else:
        types = [FULL if i % 4 == 2 else SLIDING if i % 4 == 0 and i > 0 else CONV for i in range(n)]
    for i, x in enumerate(types):
        if x not in TYPES:
            raise t._err(f"layer_types[{i}]", f"{x!r} is not an LFM3 layer type ({', '.join(TYPES)})")
    return types


def _rope(t: Fields, kind: str, K: int) -> tuple[Fields, str]:
    """The layer type's rope fields and kind; transformers' defaults when the file gives none."""
    if not t.has("rope_parameters"):
        default = {SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
                   FULL: {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.5}}[kind]
        return Fields(default, t.where, t.prefix + f"rope_parameters.{kind}."), default["rope_type"]
    rp = t.sub("rope_parameters")
    rp = rp.sub(kind) if isinstance(rp.d.get(kind), dict) else rp
    return rp, rp.str("rope_type", "type", default="default")


def rotated_angles(t: Fields, kind: str, K: int) -> int:
    """a: the pairs (i, i + K/2) a proportional rope turns; K/2 for a plain one."""
    rp, rope_type = _rope(t, kind, K)
    if rope_type != "proportional":
        return K // 2
    return int(rp.float("partial_rotary_factor", default=1.0, minimum=0.0, maximum=1.0) * K // 2)


def lfm3_token(t: Fields, i: int, kind: str, decl: Decl, D: int, eps: float):
    from storelab.stores.attention import AttentionConfig, WindowConfig
    from storelab.stores.short_conv import ShortConvConfig

    if kind == CONV:
        return ShortConvConfig(d_model=D, conv_kernel=t.int("conv_L_cache", default=7, minimum=2),
                               bias=t.bool("conv_bias", default=False))
    H = t.int("num_attention_heads", minimum=1)
    K = t.int("head_dim", default=128, minimum=2)
    rp, rope_type = _rope(t, kind, K)
    theta = rp.float("rope_theta", default=1e6, positive=True)
    scaling = None
    if rope_type == "proportional":
        R = 2 * rotated_angles(t, kind, K)
        partial, theta = R / K, theta ** (R / K)
        if int(K * partial) != R:
            raise rp._err("partial_rotary_factor", f"turns {R} of {K} channels, which storelab's partial rotary "
                                                   f"cannot say exactly")
        if rp.float("factor", default=1.0) != 1.0:
            scaling = {"rope_type": "linear", "factor": rp.float("factor")}
    else:
        partial = rp.float("partial_rotary_factor", default=1.0, minimum=0.0, maximum=1.0)
    bias = t.bool("attention_bias", default=False)
    common = dict(d_model=D, n_heads=H, n_kv_heads=t.int("num_key_value_heads", default=H, minimum=1), head_dim=K,
                  partial_rotary=partial, rope_theta=theta, rope_scaling=scaling, qk_norm=True, qkv_bias=bias,
                  out_bias=bias, head_gate=t.bool("use_attention_gate", default=True), norm_eps=eps)
    if kind == SLIDING:
        return WindowConfig(window=t.int("sliding_window", default=256, minimum=2) - 1, **common)
    return AttentionConfig(**common)


def _reordered(name: str, K: int, a: int) -> Src:
    """Rows of each K-row head in storelab's order: [0, a) + [K/2, K/2 + a) + [a, K/2) + [K/2 + a, K)."""
    h = K // 2
    order = [*range(a), *range(h, h + a), *range(a, h), *range(h + a, K)]

    def take(w):
        idx = torch.tensor(order, device=w.device)
        return w.view(-1, K, *w.shape[1:])[:, idx].reshape(w.shape)

    return Src((name,), take, f"channels of each {K}-wide head reordered, the {a} rotated pairs first")


def lfm3_token_table(tab: dict, o: str, a: str, tok, names: set[str]) -> None:
    if tok.KIND == "short_conv":
        lfm2_token_table(tab, o, a, tok, names)
        return
    K, R = tok.head_dim, tok.rotary_dim
    for p in ("q_proj", "k_proj"):
        tab[f"{o}.{p}.weight"] = _reordered(f"{a}.{p}.weight", K, R // 2)
        if tok.qkv_bias:
            tab[f"{o}.{p}.bias"] = _reordered(f"{a}.{p}.bias", K, R // 2)
    for p in ("q_norm", "k_norm"):
        tab[f"{o}.{p}.weight"] = _reordered(f"{a}.{p}.weight", K, R // 2)
    linear(tab, f"{o}.v_proj", f"{a}.v_proj", bias=tok.qkv_bias)
    linear(tab, f"{o}.o_proj", f"{a}.o_proj", bias=tok.out_bias)
    if tok.head_gate:  # published as gate_proj; transformers renames it g_proj when it loads
        linear(tab, f"{o}.g_proj", f"{a}.gate_proj" if f"{a}.gate_proj.weight" in names else f"{a}.g_proj")


def lfm3_names(tab: dict, hf: dict, cfg, names: set[str]) -> None:
    """LFM's names for the norms and the feed-forward, in place of the reader's usual entries."""
    pre, _ = layer_prefix(names)
    tab["norm.weight"] = copy(f"{pre}embedding_norm.weight")
    for i, lay in enumerate(cfg.layers):
        a, b, f = f"{pre}layers.{i}", f"blocks.{i}", f"{pre}layers.{i}.feed_forward"
        tab[f"{b}.norm_token.weight"] = copy(f"{a}.operator_norm.weight")
        tab[f"{b}.norm_channel.weight"] = copy(f"{a}.ffn_norm.weight")
        if lay.norms == "sandwich":
            tab[f"{b}.post_norm_token.weight"] = copy(f"{a}.post_operator_norm.weight")
            tab[f"{b}.post_norm_channel.weight"] = copy(f"{a}.post_ffn_norm.weight")
        for k in [k for k in tab if k.startswith(f"{b}.channel.")]:
            del tab[k]
        for ours, theirs in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")):
            linear(tab, f"{b}.channel.{ours}", f"{f}.{theirs}")


DECL = Decl(name="lfm3", model_types=("lfm3",), title="LFM3 (checkpoint)", eps=1e-5, theta=1e6, tied=True,
            types=lfm3_types, token=lfm3_token, token_table=lfm3_token_table, extra=lfm3_names)


def to_config(hf: dict):
    """The reader's layers (no experts: every feed-forward dense), sandwich norms with ``use_sandwich_norm``."""
    t = _reader.text_fields(hf)
    for key in ("num_experts", "num_local_experts"):
        if t.int(key, default=0):
            raise t._err(key, "LFM3's feed-forward is dense (Lfm3MLP); no experts")
    cfg = _reader.to_config(DECL, hf)
    if not t.bool("use_sandwich_norm", default=True):
        return cfg
    return dataclasses.replace(cfg, layers=[dataclasses.replace(lay, norms="sandwich") for lay in cfg.layers])


def runs(hf: dict) -> None:
    """A rope kind storelab turns (plain or proportional), per attention layer type."""
    t = _reader.text_fields(hf)
    K = t.int("head_dim", default=128, minimum=2)
    for kind in set(lfm3_types(t, t.int("num_hidden_layers", minimum=1))) - {CONV}:
        rp, rope_type = _rope(t, kind, K)
        if rope_type not in ROPES:
            raise rp._err("rope_type", f"{rope_type!r}: storelab runs LFM3's {', '.join(ROPES)} rope only "
                                       "(accounting reads it; loading weights does not)")


FAMILY = Family(stores=("short_conv", "attention", "window", "ffn", "residual"),
                name=DECL.name, model_types=DECL.model_types, to_config=to_config,
                table=lambda hf, cfg, names: _reader.table(DECL, hf, cfg, names),
                ignored=lambda hf: DECL.ignored, runs=runs)
