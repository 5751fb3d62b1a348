"""StepFun's Step-3.5 / Step-3.7 Flash text model (``step3p5``, and the ``step3p7`` wrapper whose ``text_config``
it is; transformers 5.23's ``Step3p7TextModel`` under ``Step3p7ForConditionalGeneration``).

* attention: ``head_dim`` (128), ``num_key_value_heads`` (``num_attention_groups``) on every layer, a query head
  count per layer type (global layers ``num_attention_heads``, local ones ``num_sliding_attention_heads``, from the
  hub file's ``attention_other_setting`` or the saved ``per_layer_config``); per-head q/k RMSNorms before the
  rotation; logits scaled by ``query_pre_attn_scalar`` ** -0.5 (default head_dim); one sigmoid output gate per head
  from ``g_proj`` (our ``head_gate``; ``gating`` per channel is refused: transformers' attention cannot broadcast
  it);
* RoPE per layer type (rotate-half pairs over the first ``partial_rotary_factor`` of the head): the saved
  ``rope_parameters`` per type, or the hub file's per-layer ``rope_theta`` / ``partial_rotary_factors`` lists,
  ``rope_scaling`` on the global layers (llama3 in the releases); local layers a window of ``sliding_window``
  (which counts the query: our ``window`` is one less);
* every norm is Gemma's RMSNorm, x / rms(x) * (1 + w) (the 1 added when loading), eps ``rms_norm_eps`` (1e-5);
* channel: ``mlp_layer_types`` (the hub file's ``moe_layers_enum``; by default layers 3 on sparse): "dense" a
  SwiGLU MLP of ``intermediate_size``; "sparse" ``n_routed_experts`` (``moe_num_experts``) SwiGLU experts of
  ``moe_intermediate_size``, the top ``num_experts_per_tok`` (``moe_top_k``) by sigmoid score plus the choice
  bias, renormalised and times ``moe_router_scaling_factor``, beside a shared SwiGLU of ``share_expert_dim``;
* untied embeddings by default; MTP layers stored after the decoder's (``num_nextn_predict_layers``) ignored.

Accounted, refused for running: ``swiglu_limits`` / ``swiglu_limits_shared`` entries above 0 (Step-3.7-Flash's
layers 43 and 44): transformers clips silu(gate) <= limit after the activation (and |up| <= limit), a different
function from storelab's swiglu_limit (gate clipped before it), and the shared expert has a limit of its own.
Refused by name: ``use_bidirectional_attention``, ``mlp_bias``, a ``layer_types`` entry no store fills
(``minimax_m3_sparse``), an ``attention_other_setting`` with another key-value head count or head size.

Parameters per layer: the attention's D*H_i*K*2 + 2*D*G*K + D*H_i + 2K, the MLP's 3*D*I or the experts'
3*E*D*I + E*D + E + 3*D*S, two norms; the state is the keys and values (the window's on local layers). Names: the
ones transformers saves (StepFun's: ``moe.gate``, ``moe.router_bias``, 3-D ``moe.{gate,up,down}_proj``,
``share_expert``) or its in-memory ones (``mlp.gate``, ``mlp.gate.e_score_correction_bias``,
``mlp.experts.gate_up_proj``, ``mlp.shared_experts``), under ``model.`` or ``model.language_model.``.
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._common import either, gated_mlp, layer_prefix
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import FULL, Decl, Fields, _attention, text_fields
from storelab.checkpoint.table import Src, copy, plus_one

__all__ = ["FAMILY"]


def _heads(t: Fields, i: int, kind: str) -> int:
    """The query heads of layer i: ``per_layer_config`` (saved), else ``num_sliding_attention_heads`` /
    ``attention_other_setting`` on a local layer, else ``num_attention_heads``."""
    H = t.int("num_attention_heads", minimum=1)
    per = t.sub("per_layer_config", default={})
    if per.has(str(i)):
        return per.sub(str(i)).int("num_attention_heads", default=H, minimum=1)
    if kind != FULL:
        other = t.sub("attention_other_setting", default={})
        return t.int("num_sliding_attention_heads", default=other.int("num_attention_heads", default=H, minimum=1),
                     minimum=1)
    return H


def step_attention(t: Fields, i: int, kind: str, decl: Decl, D: int, eps: float):
    a = _attention(t, i, kind, decl, D, eps)
    H = _heads(t, i, kind)
    if H % a.n_kv_heads:
        raise t._err("num_sliding_attention_heads" if kind != FULL else "num_attention_heads",
                     f"layer {i}: {H} query heads are not a multiple of num_key_value_heads ({a.n_kv_heads})")
    g = t.raw("gating", default=True)
    if not (g is True or g == "per-head"):
        raise t._err("gating", f"{g!r} is not supported (one gate per channel: transformers' Step3p7Attention cannot "
                               f"broadcast its g_proj over the heads; true / \"per-head\" is read)")
    scalar = t.float("query_pre_attn_scalar", default=float(a.head_dim), positive=True)
    scale = None if scalar == a.head_dim else scalar ** -0.5
    return dataclasses.replace(a, n_heads=H, head_gate=True, attn_scale=scale)


DECL = Decl(name="step3p7", model_types=("step3p5", "step3p7"), title="Step-3.5 / 3.7 Flash (checkpoint)",
            qk_norm=True, router="sigmoid", router_bias=True, eps=1e-5, mtp=True, token=step_attention,
            ignored=Decl.__dataclass_fields__["ignored"].default + (
                r"^vision_model\.", r"^model\.vision_model\.", r"^vit_large_projector\.",
                r"^model\.vit_large_projector\."))


def _layer_list(t: Fields, key: str, n: int) -> list:
    """A per-layer list of the hub file (padded with MTP entries: cut to the decoder's layers)."""
    return t.list(key, n=n)


def _v5(hf: dict) -> dict:
    """The text config in transformers' v5 form (what ``Step3p7TextConfig.__post_init__`` makes of a hub file):
    the aliases named, per-type ``rope_parameters``, ``mlp_layer_types`` from ``moe_layers_enum``."""
    t = text_fields(hf)
    d = dict(t.d)
    n = t.int("num_hidden_layers", minimum=1)
    for ours, theirs in (("num_key_value_heads", "num_attention_groups"), ("num_experts_per_tok", "moe_top_k"),
                         ("n_routed_experts", "moe_num_experts"), ("share_expert_dim", "share_expert_dims")):
        if d.get(ours) is None and d.get(theirs) is not None:
            d[ours] = d[theirs]
    if d.get("head_dim") is None:
        d["head_dim"] = 128
    if not t.has("layer_types"):
        d["layer_types"] = [FULL] * n
    types = Fields(d, t.where, t.prefix).list("layer_types", n=n)
    if not t.has("mlp_layer_types"):
        enum = t.raw("moe_layers_enum", default=None)
        if enum is None:
            sparse = set(range(3, n))
        else:
            items = enum.split(",") if isinstance(enum, str) else enum
            if not isinstance(items, list):
                raise t._err("moe_layers_enum", f"must be a comma-separated string or a list, got {enum!r}")
            try:
                sparse = {int(x) for x in items if str(x).strip()}
            except ValueError:
                raise t._err("moe_layers_enum", f"must list layer numbers, got {enum!r}") from None
        d["mlp_layer_types"] = ["sparse" if i in sparse else "dense" for i in range(n)]
    rp = t.raw("rope_parameters", default=None)
    if not (isinstance(rp, dict) and all(isinstance(rp.get(k), dict) for k in set(types))):
        theta = t.raw("rope_theta", default=10000.0)
        thetas = _layer_list(t, "rope_theta", n) if isinstance(theta, list) else [theta] * n
        partials = _layer_list(t, "partial_rotary_factors", n) if t.has("partial_rotary_factors") else None
        rp = {}
        for kind in set(types):
            j = types.index(kind)
            rp[kind] = {"rope_type": "default", "rope_theta": thetas[j]}
            if partials:
                rp[kind]["partial_rotary_factor"] = partials[j]
        if t.has("rope_scaling") and FULL in rp:
            rp[FULL].update(t.sub("rope_scaling").d)
    d["rope_parameters"] = rp
    d.pop("rope_theta", None)
    d.pop("rope_scaling", None)
    d.pop("partial_rotary_factor", None)
    other = t.sub("attention_other_setting", default={})
    for key, want in (("num_attention_groups", d.get("num_key_value_heads")), ("head_dim", d["head_dim"])):
        if other.has(key) and other.raw(key) != want:
            raise other._err(key, f"{other.raw(key)!r} differs from the global layers' {want!r} (transformers reads "
                                  f"only num_attention_heads of it; storelab refuses rather than guess)")
    return dict(hf, text_config=d) if text_fields(hf).prefix else d


def _limits(t: Fields, n: int) -> dict[str, list]:
    return {k: t.list(k, n=n) for k in ("swiglu_limits", "swiglu_limits_shared") if t.has(k)}


def to_config(hf: dict):
    t = text_fields(hf)
    if t.bool("use_bidirectional_attention", default=False):
        raise t._err("use_bidirectional_attention", "true is not supported (a bidirectional window; storelab's "
                                                    "attention is causal)")
    if t.bool("mlp_bias", default=False):
        raise t._err("mlp_bias", "true is not supported (the experts' and shared expert's biases: no moe store has "
                                 "them)")
    hf = _v5(hf)
    t = text_fields(hf)
    n = t.int("num_hidden_layers", minimum=1)
    for key, values in _limits(t, n).items():
        for i, v in enumerate(values):
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0):
                raise t._err(f"{key}[{i}]", f"must be a number >= 0 or null, got {v!r}")
    cfg = _reader.to_config(DECL, hf)
    scale = t.float("moe_router_scaling_factor", default=1.0, positive=True)
    layers = []
    for lay in cfg.layers:
        if lay.channel.KIND == "moe":  # renormalised always (Step3p7TopKRouter), shared width share_expert_dim
            S = t.int("share_expert_dim", default=1280, minimum=1)
            lay = dataclasses.replace(lay, channel=dataclasses.replace(
                lay.channel, routed_scaling=scale, norm_topk_prob=True, n_shared=1, d_shared=S))
        layers.append(lay)
    return dataclasses.replace(cfg, layers=layers)


def runs(hf: dict) -> None:
    hf = _v5(hf)
    t = text_fields(hf)
    n = t.int("num_hidden_layers", minimum=1)
    for key, values in _limits(t, n).items():
        for i, v in enumerate(values):
            if v:
                raise t._err(f"{key}[{i}]", f"{v!r}: transformers clips silu(gate) <= limit after the activation "
                                            f"(and |up| <= limit), storelab's swiglu_limit clips the gate before it "
                                            f"and gives the shared expert no limit of its own (accounting reads it; "
                                            f"loading weights does not)")
    _reader.runs(DECL, hf)


def _gate_up(gate, up):
    import torch

    return torch.cat([gate, up], dim=1)


def table(hf: dict, cfg, names: set[str]) -> dict:
    hf = _v5(hf)
    tab = _reader.table(DECL, hf, cfg, names)
    pre = layer_prefix(names)[0]
    for key, src in list(tab.items()):  # Gemma's norms everywhere: 1 + w
        if key.endswith(("norm_token.weight", "norm_channel.weight", "q_norm.weight", "k_norm.weight")) \
                or key == "norm.weight":
            tab[key] = plus_one(src.names[0])
    for i, lay in enumerate(cfg.layers):
        a, b = f"{pre}layers.{i}.self_attn", f"blocks.{i}.token"
        tab[f"{b}.g_proj.weight"] = copy(f"{a}.g_proj.weight")
        if lay.channel.KIND != "moe":
            continue
        c, m, mm = f"blocks.{i}.channel", f"{pre}layers.{i}.moe", f"{pre}layers.{i}.mlp"
        tab[f"{c}.router.weight"] = copy(either(names, f"{m}.gate.weight", f"{mm}.gate.weight"))
        tab[f"{c}.choice_bias"] = copy(either(names, f"{m}.router_bias", f"{mm}.gate.e_score_correction_bias"))
        if f"{m}.gate_proj.weight" in names:  # StepFun's: gate and up stacked per expert apart
            tab[f"{c}.gate_up"] = Src((f"{m}.gate_proj.weight", f"{m}.up_proj.weight"), _gate_up,
                                      "moe.gate_proj and moe.up_proj concatenated per expert")
            tab[f"{c}.down"] = copy(f"{m}.down_proj.weight")
        else:
            tab[f"{c}.gate_up"] = copy(f"{mm}.experts.gate_up_proj")
            tab[f"{c}.down"] = copy(f"{mm}.experts.down_proj")
        shared = next((p for p in (f"{pre}layers.{i}.share_expert", f"{mm}.shared_experts")
                       if f"{p}.gate_proj.weight" in names), f"{pre}layers.{i}.share_expert")
        gated_mlp(tab, (f"{c}.shared_gate_proj", f"{c}.shared_up_proj", f"{c}.shared_down_proj"), shared, names,
                  lay.channel.shared_width)
    return tab


FAMILY = Family(stores=DECL.stores, name=DECL.name, model_types=DECL.model_types, to_config=to_config, table=table,
                ignored=lambda hf: _reader._ignored(DECL, _v5(hf)), runs=runs)
