"""LFM2 and LFM2-MoE (Liquid AI, arXiv 2511.23404; ``lfm2``, ``lfm2_moe``): a hybrid of gated short
convolutions (storelab's ``short_conv``, 3 taps in the published models) and a few GQA attention layers
with RoPE and an RMSNorm on each query and key head (before RoPE), a SwiGLU feed-forward on every
layer, pre-norm RMSNorms, tied embeddings.

Layers: ``layer_types`` ("conv" / "full_attention"), or the older ``full_attn_idxs`` (the attention
layers' indices; all layers when absent, as transformers reads it). The convolution: ``conv_L_cache``
taps (our ``conv_kernel``), ``conv_bias`` on its three parts.

The feed-forward's width (``Lfm2MLP``): I = ``intermediate_size`` (``block_ff_dim`` in the published
files; it wins when both are given, as in transformers); with ``block_auto_adjust_ff_dim`` (default
true) I' = int(2 I / 3), then with ``block_ffn_dim_multiplier`` m (default 1.0) int(m I') rounded up
to a multiple of ``block_multiple_of`` (default 256): LFM2-1.2B's 12288 becomes 8192. LFM2-MoE keeps
``intermediate_size`` for its first ``num_dense_layers`` layers and routes the rest: sigmoid scores,
the ``expert_bias`` added for the choice only (``use_expert_bias``), the chosen weights renormalised
(``norm_topk_prob``; transformers adds 1e-6 to their sum, storelab 1e-20) and scaled by
``routed_scaling_factor``.

Names (transformers' ``Lfm2ForCausalLM``; ``a`` = ``model.layers.i``):

| ours                               | transformers                                                  |
|------------------------------------|---------------------------------------------------------------|
| blocks.i.norm_token / norm_channel | a.operator_norm / a.ffn_norm                                  |
| blocks.i.token.in_proj, out_proj   | a.conv.in_proj, a.conv.out_proj (short_conv layers)           |
| blocks.i.token.conv_weight         | a.conv.conv.weight [D, 1, W] -> [D, W] (and conv.bias)        |
| blocks.i.token.{q,k,v}_proj        | a.self_attn.{q,k,v}_proj (attention layers)                   |
| blocks.i.token.o_proj              | a.self_attn.out_proj                                          |
| blocks.i.token.q_norm / k_norm     | a.self_attn.q_layernorm / k_layernorm                         |
| blocks.i.channel.{gate,up,down}_proj | a.feed_forward.w1 / w3 / w2 (dense layers)                  |
| blocks.i.channel.router, choice_bias | a.feed_forward.gate.weight, a.feed_forward.expert_bias      |
| blocks.i.channel.gate_up, down     | a.feed_forward.experts.gate_up_proj / down_proj (3-D)         |
| norm.weight                        | model.embedding_norm.weight (the final norm, despite its name) |
"""

from __future__ import annotations

from storelab.checkpoint.families._common import experts, layer_prefix, linear
from storelab.checkpoint.families._reader import FULL, Decl, Fields, _attention, family
from storelab.checkpoint.table import Src, copy

CONV = "conv"


def lfm2_types(t: Fields, n: int) -> list[str]:
    """``layer_types``, else "full_attention" at ``full_attn_idxs`` and "conv" elsewhere."""
    if t.has("layer_types"):
        types = t.list("layer_types", n=n)
    else:
        where = t.list("full_attn_idxs", default=list(range(n)))
        for j, x in enumerate(where):
            if isinstance(x, bool) or not isinstance(x, int):
                raise t._err(f"full_attn_idxs[{j}]", f"must be a layer index, got {x!r}")
        types = [FULL if i in where else CONV for i in range(n)]
    for i, x in enumerate(types):
        if x not in (CONV, FULL):
            raise t._err(f"layer_types[{i}]", f"{x!r} is not an LFM2 layer type (conv, full_attention)")
    return types


def lfm2_width(t: Fields) -> int:
    """The dense feed-forward's width, as ``Lfm2MLP`` computes it (LFM2-MoE's dense layers: as given)."""
    width = t.int("block_ff_dim", "intermediate_size", minimum=1)  # transformers: block_ff_dim wins
    if t.str("model_type", default="lfm2") == "lfm2_moe" or not t.bool("block_auto_adjust_ff_dim", default=True):
        return width
    width = int(2 * width / 3)
    width = int(t.float("block_ffn_dim_multiplier", default=1.0, positive=True) * width)
    multiple = t.int("block_multiple_of", default=256, minimum=1)
    return multiple * ((width + multiple - 1) // multiple)


def lfm2_token(t, i, kind, decl, D, eps):
    from storelab.stores.short_conv import ShortConvConfig

    if kind == CONV:
        return ShortConvConfig(d_model=D, conv_kernel=t.int("conv_L_cache", default=3, minimum=2),
                               bias=t.bool("conv_bias", default=False))
    return _attention(t, i, kind, decl, D, eps)


def lfm2_token_table(tab, o, a, tok, names):
    """``a`` is the reader's ``...layers.i.self_attn``; a convolution layer sits at ``...layers.i.conv``."""
    if tok.KIND == "short_conv":
        c = a.rsplit(".", 1)[0] + ".conv"
        linear(tab, f"{o}.in_proj", f"{c}.in_proj", bias=tok.bias)
        tab[f"{o}.conv_weight"] = Src((f"{c}.conv.weight",), lambda w: w.squeeze(1), "[D, 1, W] -> [D, W]")
        if tok.bias:
            tab[f"{o}.conv_bias"] = copy(f"{c}.conv.bias")
        linear(tab, f"{o}.out_proj", f"{c}.out_proj", bias=tok.bias)
        return
    for p in ("q_proj", "k_proj", "v_proj"):
        linear(tab, f"{o}.{p}", f"{a}.{p}")
    linear(tab, f"{o}.o_proj", f"{a}.out_proj")
    tab[f"{o}.q_norm.weight"] = copy(f"{a}.q_layernorm.weight")
    tab[f"{o}.k_norm.weight"] = copy(f"{a}.k_layernorm.weight")


def lfm2_names(tab, hf, cfg, names):
    """LFM2's own names for the norms and the feed-forward; they replace the reader's usual entries."""
    pre, _ = layer_prefix(names)
    tab["norm.weight"] = copy(f"{pre}embedding_norm.weight")
    for i, lay in enumerate(cfg.layers):
        a, b, ch = f"{pre}layers.{i}", f"blocks.{i}", lay.channel
        tab[f"{b}.norm_token.weight"] = copy(f"{a}.operator_norm.weight")
        tab[f"{b}.norm_channel.weight"] = copy(f"{a}.ffn_norm.weight")
        f, c = f"{a}.feed_forward", f"{b}.channel"
        for k in [k for k in tab if k.startswith(c + ".")]:
            del tab[k]
        if ch.KIND == "ffn":
            for ours, theirs in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")):
                linear(tab, f"{c}.{ours}", f"{f}.{theirs}")
            continue
        tab[f"{c}.router.weight"] = copy(f"{f}.gate.weight")
        if ch.router_bias:
            tab[f"{c}.choice_bias"] = copy(f"{f}.expert_bias")
        experts(tab, c, f"{f}.experts", names, ch.n_experts)


# no biases on the attention's projections whatever the config says (``Lfm2Attention``: bias=False)
FAMILY = family(Decl(stores=("short_conv", "attention", "ffn", "moe", "residual"),
                     name="lfm2", model_types=("lfm2", "lfm2_moe"), title="LFM2 (checkpoint)", qk_norm=True,
                     qkv_bias=False, o_bias=False, router="sigmoid", router_bias=True, eps=1e-5, theta=1e6, tied=True, types=lfm2_types,
                     ffn_width=lfm2_width, token=lfm2_token, token_table=lfm2_token_table, extra=lfm2_names))
