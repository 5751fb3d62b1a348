"""Laguna (Poolside, 2026; ``laguna``: Laguna-XS.2, Laguna-S-2.1): GQA attention with per-head q/k RMSNorms and
an output gate, local and global layers, and sigmoid-routed experts with a shared expert (transformers 5.23's
``LagunaForCausalLM``).

* attention: ``head_dim`` (128), a query head count per layer (``num_attention_heads_per_layer``: the releases give
  global layers 48 heads and local ones 64), ``num_key_value_heads`` on every layer; q/k RMSNorms per head before
  the rotation; RoPE per layer type from ``rope_parameters`` (global layers rotate half of each head, with YaRN in
  the releases; local ones the whole head within ``sliding_window``);
* the output gate, softplus(g_proj x) (our ``gate_activation = "softplus"``), is one factor per head under
  ``gating: true`` / ``"per-head"`` (our ``head_gate``, ``g_proj`` D -> H) and one per channel otherwise (our
  ``gate``: each head's gate rows after its query rows in ``q_proj``, as the table fuses them);
* channel: ``mlp_layer_types`` ("dense": a SwiGLU MLP of ``intermediate_size``; "sparse": ``num_experts`` experts
  of ``moe_intermediate_size``, the top ``num_experts_per_tok`` by sigmoid score plus the choice bias
  ``e_score_correction_bias``, renormalised and times ``moe_routed_scaling_factor``, beside a shared SwiGLU of
  ``shared_expert_intermediate_size``);
* pre-norm RMSNorms; untied embeddings by default.

Refused by name: ``moe_router_logit_softcapping`` > 0 (a tanh cap on the router logits: no moe router has one) and
``moe_apply_router_weight_on_input`` (transformers refuses it too).
Parameters per layer: the attention's D*H_i*K*2 + 2*D*G*K + D*H_i (per-head gate; D*H_i*K per channel) + 2K, the
MLP's 3*D*I or the experts' 3*E*D*I + E*D + E + 3*D*S; the state is the keys and values (the window's on local
layers). Names: Poolside's, as transformers also saves them (``self_attn.g_proj``, ``mlp.gate.weight``,
``mlp.experts.e_score_correction_bias``, ``mlp.experts.<e>.{gate,up,down}_proj``, ``mlp.shared_expert``), or
transformers' in-memory ones (``mlp.gate.e_score_correction_bias``, 3-D ``mlp.experts``, ``mlp.shared_experts``).
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._common import either, layer_prefix
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Decl, Fields, _attention, text_fields
from storelab.checkpoint.families.afmoe import _query_and_gate
from storelab.checkpoint.table import copy

__all__ = ["FAMILY"]


def _per_head(t: Fields) -> bool:
    g = t.raw("gating", default=True)
    if g is True or g == "per-head":
        return True
    if g is False or g == "per-channel" or g == "per-element":
        return False
    raise t._err("gating", f"must be true, false, \"per-head\" or \"per-channel\", got {g!r}")


def laguna_attention(t: Fields, i: int, kind: str, decl: Decl, D: int, eps: float):
    a = _attention(t, i, kind, decl, D, eps)
    if t.has("num_attention_heads_per_layer"):
        H = t.list("num_attention_heads_per_layer", n=t.int("num_hidden_layers"))[i]
        if isinstance(H, bool) or not isinstance(H, int) or H < 1 or H % a.n_kv_heads:
            raise t._err(f"num_attention_heads_per_layer[{i}]", f"must be a positive multiple of "
                                                                 f"num_key_value_heads ({a.n_kv_heads}), got {H!r}")
        a = dataclasses.replace(a, n_heads=H)
    if a.qkv_bias:
        raise t._err("attention_bias", "true is not supported (Laguna's g_proj has no bias; storelab's gated q_proj "
                                       "would give its gate rows one)")
    per_head = _per_head(t)
    return dataclasses.replace(a, head_gate=per_head, gate=not per_head, gate_activation="softplus")


DECL = Decl(name="laguna", model_types=("laguna",), title="Laguna (checkpoint)", qk_norm=True, router="sigmoid",
            router_bias=True, token=laguna_attention, stores=("attention", "window", "ffn", "moe", "residual"))


def _defaults(hf: dict) -> dict:
    """``LagunaConfig``'s defaults where the file is silent: head_dim 128, a 512 window, every layer global, the
    first layer dense, its two rope types."""
    t = text_fields(hf)
    n = t.int("num_hidden_layers", minimum=1)
    out = dict(hf, head_dim=hf.get("head_dim") or 128)
    out.setdefault("sliding_window", 512)
    out.setdefault("layer_types", ["full_attention"] * n)
    out.setdefault("mlp_layer_types", ["dense"] + ["sparse"] * (n - 1))
    out.setdefault("rope_parameters", {
        "full_attention": {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0}})
    return out


def to_config(hf: dict):
    hf = _defaults(hf)
    t = text_fields(hf)
    if t.float("moe_router_logit_softcapping", default=0.0, minimum=0.0) > 0:
        raise t._err("moe_router_logit_softcapping", "a tanh cap on the router logits is not supported (no moe "
                                                     "router in storelab caps them)")
    if t.bool("moe_apply_router_weight_on_input", default=False):
        raise t._err("moe_apply_router_weight_on_input", "true is not supported (transformers refuses it too)")
    cfg = _reader.to_config(DECL, hf)
    scale = t.float("moe_routed_scaling_factor", default=1.0, positive=True)
    layers = [dataclasses.replace(lay, channel=dataclasses.replace(lay.channel, routed_scaling=scale))
              if lay.channel.KIND == "moe" else lay for lay in cfg.layers]
    return dataclasses.replace(cfg, layers=layers)


def table(hf: dict, cfg, names: set[str]) -> dict:
    hf = _defaults(hf)
    tab = _reader.table(DECL, hf, cfg, names)
    pre = layer_prefix(names)[0]
    for i, lay in enumerate(cfg.layers):
        a, b, tok = f"{pre}layers.{i}.self_attn", f"blocks.{i}.token", lay.token
        if lay.channel.KIND == "moe":  # the release's files (and transformers' save) keep it beside the experts
            m = f"{pre}layers.{i}.mlp"
            tab[f"blocks.{i}.channel.choice_bias"] = copy(either(names, f"{m}.experts.e_score_correction_bias",
                                                                 f"{m}.gate.e_score_correction_bias"))
        if tok.head_gate:
            tab[f"{b}.g_proj.weight"] = copy(f"{a}.g_proj.weight")
        else:
            tab[f"{b}.q_proj.weight"] = _query_and_gate(f"{a}.q_proj.weight", f"{a}.g_proj.weight", tok.n_heads)
    return tab


FAMILY = Family(stores=DECL.stores, name=DECL.name, model_types=DECL.model_types, to_config=to_config, table=table,
                ignored=lambda hf: DECL.ignored, runs=lambda hf: _reader.runs(DECL, _defaults(hf)))
