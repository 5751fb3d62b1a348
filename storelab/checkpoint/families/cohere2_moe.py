"""Cohere's mixture-of-experts Command models (``cohere2_moe``; transformers 5.23's ``Cohere2MoeForCausalLM``):
Command A's parallel block with routed experts, dense prefix layers and shared experts.

* one norm per layer, read by both mixers: x + attn(n(x)) + mlp(n(x)) (``LayerConfig.norms = "parallel"``);
  n and the final norm are bias-free LayerNorms, eps ``layer_norm_eps`` (``ModelConfig.norm_kind = "layer"``),
  or RMSNorms when the file gives ``rms_norm_eps``;
* attention: ``head_dim`` (128 when the file is silent, not hidden_size / heads as in ``cohere2``); local layers
  a sliding window (``sliding_window`` counts the query, so our ``window`` is one less) with RoPE on interleaved
  pairs of channels (``rope_interleaved``); global layers no positions (NoPE), except the dense prefix layers when
  ``prefix_dense_sliding_window_pattern`` is 1 (transformers' ``force_rope``: they rotate);
* ``layer_types``, else the first ``first_k_dense_replace`` layers every ``prefix_dense_sliding_window_pattern``-th
  global and the rest every ``sliding_window_pattern``-th (4) global; ``mlp_layer_types``, else those first layers
  dense;
* channel: "dense" a SwiGLU MLP of ``prefix_dense_intermediate_size`` (else ``intermediate_size``); "sparse"
  ``num_experts`` SwiGLU experts of ``intermediate_size``, the top ``num_experts_per_tok`` by router logit
  weighted by a softmax over those (``expert_selection_fn`` "softmax": our softmax router, renormalised) or by
  their sigmoids (renormalised under ``norm_topk_prob``); ``num_shared_experts`` shared experts fused into one
  SwiGLU of ``num_shared_experts * intermediate_size``, added (``shared_expert_combination_strategy`` "sum") or
  averaged with the routed output, (routed + shared) / 2 ("average", the default): the halves are folded into the
  routing (``routed_scaling = 0.5``) and the shared down projection (its weights times 0.5, exact in any float);
* the logits times ``logit_scale`` (0.0625); tied embeddings by default.

Parameters per layer: the attention's D*(H + 2G)*K + H*K*D (biases with ``attention_bias``), the MLP's 3*D*I or
the experts' E*D + 3*E*D*I + 3*D*S, one d_model norm; the state is the keys and values (W of them on a local
layer). Names: transformers' ``Cohere2MoeForCausalLM`` as it saves them (``mlp.gate``, per-expert
``mlp.experts.<e>.{gate,up,down}_proj`` or 3-D ``gate_up_proj``, ``mlp.shared_experts``), one
``input_layernorm`` per layer.
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import FULL, SLIDING, Decl, Fields, _attention, mlp_types, text_fields
from storelab.checkpoint.table import Src

__all__ = ["FAMILY"]

SELECTIONS = ("softmax", "sigmoid")       # expert_selection_fn
COMBINATIONS = ("average", "sum")         # shared_expert_combination_strategy


def _types(t: Fields, n: int) -> list[str]:
    """``layer_types``, else ``Cohere2MoeConfig``'s: the dense prefix and the rest, each with its own period."""
    if t.has("layer_types"):
        return _reader.layer_types(t, n)
    first = t.int("first_k_dense_replace", default=0)
    prefix = t.int("prefix_dense_sliding_window_pattern", default=1, minimum=1)
    rest = t.int("sliding_window_pattern", default=4, minimum=1)
    return ([FULL if (i + 1) % prefix == 0 else SLIDING for i in range(min(first, n))]
            + [FULL if (i + 1) % rest == 0 else SLIDING for i in range(n - min(first, n))])


def _forced_rope(t: Fields, i: int) -> bool:
    """transformers' ``force_rope``: a dense layer rotates when the prefix pattern is 1."""
    n = t.int("num_hidden_layers", minimum=1)
    dense = mlp_types(t, n, moe=True)[i] == "dense"
    return dense and t.int("prefix_dense_sliding_window_pattern", default=1, minimum=1) == 1


def cohere2_moe_attention(t: Fields, i: int, kind: str, decl: Decl, D: int, eps: float):
    """The shared reader's attention, head_dim 128 when unsaid, interleaved rotation; no positions on a global
    layer unless it is a forced-rope dense one."""
    a = _attention(t, i, kind, decl, D, eps)
    K = t.int("head_dim", default=128, minimum=1)
    a = dataclasses.replace(a, head_dim=K, v_head_dim=K, rope_interleaved=True)
    if kind == FULL and not _forced_rope(t, i):
        a = dataclasses.replace(a, partial_rotary=0.0, rope_scaling=None)
    return a


DECL = Decl(name="cohere2_moe", model_types=("cohere2_moe",), title="Command MoE (checkpoint)", eps=1e-5, tied=True,
            types=_types, token=cohere2_moe_attention,
            ffn_width=lambda t: t.int("prefix_dense_intermediate_size", "intermediate_size", minimum=1))


def _choices(t: Fields) -> tuple[str, str]:
    sel = t.str("expert_selection_fn", default="softmax")
    if sel not in SELECTIONS:
        raise t._err("expert_selection_fn", f"must be one of {', '.join(SELECTIONS)}, got {sel!r}")
    comb = t.str("shared_expert_combination_strategy", default="average")
    if comb not in COMBINATIONS:
        raise t._err("shared_expert_combination_strategy", f"must be one of {', '.join(COMBINATIONS)}, got {comb!r}")
    return sel, comb


def _averaged(t: Fields) -> bool:
    """Whether the routed and shared outputs are averaged (only with shared experts)."""
    return _choices(t)[1] == "average" and t.int("num_shared_experts", default=0) > 0


def to_config(hf: dict):
    t = text_fields(hf)
    sel, _ = _choices(t)
    scale = t.float("logit_scale", default=0.0625, positive=True)
    cfg = _reader.to_config(DECL, hf)
    half = 0.5 if _averaged(t) else 1.0
    layers = []
    for lay in cfg.layers:
        ch = lay.channel
        if ch.KIND == "moe":  # softmax over the chosen logits is always renormalised; sigmoid as the file says
            ch = dataclasses.replace(ch, router=sel, routed_scaling=half,
                                     norm_topk_prob=sel == "softmax" or t.bool("norm_topk_prob", default=True))
        layers.append(dataclasses.replace(lay, channel=ch, norms="parallel"))
    rms = t.has("rms_norm_eps")
    return dataclasses.replace(cfg, layers=layers, norm_kind="rms" if rms else "layer", logit_scale=scale)


def _halved(src: Src) -> Src:
    return Src(src.names, lambda *w: 0.5 * src.make(*w), f"({src.what or 'copied'}) times 0.5 (averaged)")


def table(hf: dict, cfg, names: set[str]) -> dict:
    """The reader's names without a second norm per layer; an averaged shared expert's down projection halved."""
    tab = _reader.table(DECL, hf, cfg, names)
    average = _averaged(text_fields(hf))
    for i, lay in enumerate(cfg.layers):
        del tab[f"blocks.{i}.norm_channel.weight"]
        if average and lay.channel.KIND == "moe":
            key = f"blocks.{i}.channel.shared_down_proj.weight"
            tab[key] = _halved(tab[key])
    return tab


FAMILY = Family(stores=("attention", "window", "ffn", "moe", "residual"),
                name=DECL.name, model_types=DECL.model_types, to_config=to_config, table=table,
                ignored=lambda hf: DECL.ignored, runs=lambda hf: _reader.runs(DECL, hf))
