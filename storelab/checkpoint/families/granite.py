"""Granite 3 (IBM; ``granite``, ``granitemoe``, ``granitemoeshared``, ``granite_swa``, ``granitemoe_swa``): Llama
decoders trained with muP multipliers (Power scheduler, arXiv 2408.13359), dense or with experts.

* attention (``GraniteAttention``): GQA with RoPE, the logits scaled by ``attention_multiplier`` (our
  ``attn_scale``) instead of head_dim^-1/2; biases on all four projections with ``attention_bias``;
* the ``_swa`` kinds: full and sliding layers per ``layer_types`` (default: every fourth layer full, from the
  first), a learned sink logit per head on every layer (an extra softmax denominator, our ``sink``), a
  rope base per layer from ``layer_rope_theta`` (0: the layer uses no positions);
* channel: a SwiGLU MLP (``mlp_bias``), or ``num_local_experts`` experts of width ``intermediate_size``, the top
  ``num_experts_per_tok`` router logits softmaxed among themselves (our softmax top-k, renormalised), beside a
  shared MLP of width ``shared_intermediate_size`` added unweighted (``granitemoeshared``, ``granitemoe_swa``;
  none when 0);
* muP: ``embedding_multiplier`` -> ``embed_scale``; the logits divided by ``logits_scaling`` -> ``logit_scale`` =
  1 / logits_scaling; ``residual_multiplier`` m scales each sublayer's output before its residual add,
  x + m f(x): folded into the rows of every output projection at load (o_proj, the MLP's / experts' / shared
  MLP's down projections and their biases, ``Src`` "x residual_multiplier"), so the loaded tensors are not the
  file's but the function is.

HyperCLOVA X SEED (NAVER, 2025; ``hyperclovax``): dense Granite with Peri-LayerNorm: with ``use_post_norm``
(default true) an RMSNorm after each sublayer as well as before it, x + m norm2(f(norm1(x))) (``LayerConfig.norms =
"sandwich"``, ``post_norm1`` / ``post_norm2``), m folded into those norms' weights (m w) rather than the output
projections (a norm after them would undo it); the logits *times* ``logits_scaling`` (a multiplier here, not
Granite's divisor); ``attention_multiplier`` head_dim^-1/2 when the file gives none.

Parameters per layer: the attention's D*(H + 2G)*K + H*K*D (+ H sinks), the MLP's 3*D*I or the experts'
E*3*D*I + E*D router (+ the shared MLP's 3*D*S), two d_model norms; the state is the keys and values.

Names (transformers'; ``a`` = ``model.layers.i``, ``m`` = ``a.block_sparse_moe``): the usual ``a.self_attn.*``,
``a.mlp.*``; ``m.router.layer.weight`` (or ``m.router.weight``), ``m.input_linear.weight`` [E, 2I, D] (or
``m.experts.gate_up_proj``), ``m.output_linear.weight`` (or ``m.experts.down_proj``), ``a.shared_mlp.input_linear``
(gate rows, then up rows) and ``a.shared_mlp.output_linear``.
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._common import base_entries, either, layer_prefix, linear, model_config
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import FULL, SLIDING, Decl, Fields, _attention, layer_types, text_fields, tied
from storelab.checkpoint.table import Src, copy, rows

__all__ = ["FAMILY"]

MOE = ("granitemoe", "granitemoeshared", "granitemoe_swa")
SWA = ("granite_swa", "granitemoe_swa")
CLOVA = ("hyperclovax",)  # Granite's multipliers, Peri-LayerNorm, logits times logits_scaling
DECL = Decl(name="granite", model_types=("granite", "granite_swa") + MOE + CLOVA, title="Granite 3 (checkpoint)")


def _kind(hf: dict) -> str:
    return Fields(hf).str("model_type")


def _positive(t: Fields, key: str) -> float:
    v = t.float(key, default=1.0)
    if not v > 0:
        raise t._err(key, f"must be > 0, got {v!r}")
    return v


def _post_norms(hf: dict) -> bool:
    """HyperCLOVA X's norms after each sublayer (``use_post_norm``)."""
    return _kind(hf) in CLOVA and text_fields(hf).bool("use_post_norm", default=True)


def _types(t: Fields, n: int, swa: bool) -> list[str]:
    if swa and not t.has("layer_types"):   # GraniteSWAConfig: layer 0, 4, 8, ... full
        return [FULL if i % 4 == 0 else SLIDING for i in range(n)]
    return layer_types(t, n) if swa else [FULL] * n


def to_config(hf: dict):
    from storelab.models.config import LayerConfig
    from storelab.stores.depth import ResidualConfig
    from storelab.stores.ffn import FFNConfig
    from storelab.stores.moe import MoEConfig

    kind, t = _kind(hf), text_fields(hf)
    D, n = t.int("hidden_size", minimum=1), t.int("num_hidden_layers", minimum=1)
    eps = t.float("rms_norm_eps", default=1e-6, positive=True)
    if t.str("hidden_act", default="silu") not in ("silu", "swish"):
        raise t._err("hidden_act", f"{t.str('hidden_act')!r} is not supported (Granite's MLPs are SiLU-gated)")
    _positive(t, "residual_multiplier")
    decl = dataclasses.replace(DECL, sink_on=(FULL, SLIDING) if kind in SWA else ())
    thetas = t.list("layer_rope_theta", n=n, default=None) if kind in SWA else None
    I = t.int("intermediate_size", minimum=1)
    if kind in MOE:
        S = t.int("shared_intermediate_size", default=0)
        channel = MoEConfig(d_model=D, n_experts=t.int("num_local_experts", default=8, minimum=1),
                            top_k=t.int("num_experts_per_tok", default=2, minimum=1), d_expert=I, router="softmax",
                            norm_topk_prob=True, n_shared=1 if S else 0, d_shared=S or None, norm_eps=eps)
    else:
        channel = FFNConfig(d_model=D, d_ff=I, bias=t.bool("mlp_bias", default=False))
    layers = []
    for i, lt in enumerate(_types(t, n, kind in SWA)):
        a = _attention(t, i, lt, decl, D, eps)
        a = dataclasses.replace(a, attn_scale=t.float("attention_multiplier", positive=True,
                                                      default=a.head_dim ** -0.5 if kind in CLOVA else 1.0))
        if thetas is not None:
            theta = thetas[i]
            if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta < 0:
                raise t._err(f"layer_rope_theta[{i}]", f"must be a number >= 0, got {theta!r}")
            a = dataclasses.replace(a, rope_theta=float(theta) or a.rope_theta, partial_rotary=a.partial_rotary
                                    if theta else 0.0, rope_scaling=a.rope_scaling if theta else None)
        layers.append(LayerConfig(token=a, channel=channel, depth=ResidualConfig(d_model=D),
                                  norms="sandwich" if _post_norms(hf) else "pre"))
    cfg = model_config(hf, t.d, name=kind.replace("_", "-"), title=DECL.title, d_model=D, layers=layers,
                       norm_eps=eps, context=t.int("max_position_embeddings", default=0))
    return dataclasses.replace(cfg, tie_embeddings=tied(hf, t, kind in SWA), vocab_size=t.int("vocab_size", minimum=1),
                               embed_scale=t.float("embedding_multiplier", default=1.0, positive=True),
                               logit_scale=_positive(t, "logits_scaling") ** (1 if kind in CLOVA else -1))


def _times(name: str, m: float) -> Src:
    return Src((name,), lambda w: w * m, f"x residual_multiplier {m:g}")


def table(hf: dict, cfg, names: set[str]) -> dict:
    m = _positive(text_fields(hf), "residual_multiplier")
    pre, head = layer_prefix(names)
    tab: dict = {}
    base_entries(tab, cfg, prefix=pre, head=head)
    if _post_norms(hf):  # m scales the post norms' weights; the output projections stay the file's
        for i in range(cfg.n_layers):
            for ours, theirs in (("post_norm_token", "post_norm1"), ("post_norm_channel", "post_norm2")):
                tab[f"blocks.{i}.{ours}.weight"] = _times(f"{pre}layers.{i}.{theirs}.weight", m)
        m = 1.0
    for i, lay in enumerate(cfg.layers):
        a, b, tok, ch = f"{pre}layers.{i}", f"blocks.{i}", lay.token, lay.channel
        _reader.attention_entries(tab, f"{b}.token", f"{a}.self_attn", tok)
        outs = [(f"{b}.token.o_proj", f"{a}.self_attn.o_proj", tok.out_bias)]
        c = f"{b}.channel"
        if ch.KIND == "ffn":
            for p in ("gate_proj", "up_proj"):
                linear(tab, f"{c}.{p}", f"{a}.mlp.{p}", bias=ch.bias)
            outs.append((f"{c}.down_proj", f"{a}.mlp.down_proj", ch.bias))
        else:
            e = f"{a}.block_sparse_moe"
            tab[f"{c}.router.weight"] = copy(either(names, f"{e}.router.layer.weight", f"{e}.router.weight"))
            tab[f"{c}.gate_up"] = copy(either(names, f"{e}.input_linear.weight", f"{e}.experts.gate_up_proj"))
            tab[f"{c}.down"] = _times(either(names, f"{e}.output_linear.weight", f"{e}.experts.down_proj"), m)
            if ch.shared_width:
                S, s = ch.shared_width, f"{a}.shared_mlp"
                tab[f"{c}.shared_gate_proj.weight"] = rows(f"{s}.input_linear.weight", 0, S)
                tab[f"{c}.shared_up_proj.weight"] = rows(f"{s}.input_linear.weight", S, 2 * S)
                tab[f"{c}.shared_down_proj.weight"] = _times(f"{s}.output_linear.weight", m)
        for ours, theirs, bias in outs:
            tab[f"{ours}.weight"] = _times(f"{theirs}.weight", m)
            if bias:
                tab[f"{ours}.bias"] = _times(f"{theirs}.bias", m)
    return tab


FAMILY = Family(stores=("attention", "window", "ffn", "moe", "residual"),
                name="granite", model_types=DECL.model_types, to_config=to_config, table=table,
                ignored=lambda hf: DECL.ignored, runs=lambda hf: _reader.runs(DECL, hf))
