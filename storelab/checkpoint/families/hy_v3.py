"""Hy3 (Tencent Hunyuan, 2026; ``hy_v3``): a Llama decoder with per-head q/k RMSNorms and DeepSeek-V3-style
sigmoid experts with a choice bias (transformers 5.23's ``HYV3ForCausalLM``).

* attention: GQA with RMSNorms over each query and key head before the rotation (``ApertusAttention``), RoPE
  with ``rope_theta`` 11,158,840 by default, biases with ``attention_bias``;
* channel: ``mlp_layer_types`` (default: the first layer "dense", the others "sparse"): a SwiGLU MLP of
  ``intermediate_size``, or ``num_experts`` experts of ``moe_intermediate_size``: the top ``num_experts_per_tok``
  of sigmoid(fp32 logits) + ``e_score_correction_bias`` (the choice only), their sigmoid scores renormalised and
  times ``router_scaling_factor`` (2.826), beside ``num_shared_experts`` shared SwiGLUs of
  ``moe_intermediate_size`` (one fused MLP) added unweighted (in fp32 with ``enable_moe_fp32_combine``: the same
  sum, rounded once);
* pre-norm RMSNorms (eps 1e-5), untied embeddings; the MTP layer stored after the decoder's is ignored.
``mlp_bias`` (biases on the dense and shared MLPs) has no place in storelab's shared experts and is refused by name.

Parameters per layer: the attention's D*(H + 2G)*K + H*K*D + 2K, the MLP's 3*D*I or the experts' 3*E*D*I + E*D +
E + the shared 3*D*S*I_e, two d_model norms; the state is the keys and values. Names: Tencent's, as transformers
saves them (``mlp.router.gate.weight``, ``mlp.expert_bias``, ``mlp.experts.<e>.{gate,up,down}_proj``,
``mlp.shared_mlp``) or transformers' in-memory ones (``mlp.gate.weight``, ``mlp.e_score_correction_bias``, 3-D
``mlp.experts``, ``mlp.shared_experts``).
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._common import either, layer_prefix
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Decl, text_fields
from storelab.checkpoint.table import copy

__all__ = ["FAMILY"]


def _names(tab: dict, hf: dict, cfg, names: set[str]) -> None:
    pre = layer_prefix(names)[0]
    for i, lay in enumerate(cfg.layers):
        if lay.channel.KIND == "moe":
            m, c = f"{pre}layers.{i}.mlp", f"blocks.{i}.channel"
            tab[f"{c}.router.weight"] = copy(either(names, f"{m}.router.gate.weight", f"{m}.gate.weight"))
            tab[f"{c}.choice_bias"] = copy(either(names, f"{m}.expert_bias", f"{m}.e_score_correction_bias"))


DECL = Decl(name="hy_v3", model_types=("hy_v3",), title="Hy3 (checkpoint)", qk_norm=True, router="sigmoid",
            router_bias=True, norm_topk_default=True, eps=1e-5, theta=11158840.0, mtp=True, extra=_names,
            stores=("attention", "ffn", "moe", "residual"))


def _defaults(hf: dict) -> dict:
    n = text_fields(hf).int("num_hidden_layers", minimum=1)
    return hf if hf.get("mlp_layer_types") is not None else {**hf, "mlp_layer_types": ["dense"] + ["sparse"] * (n - 1)}


def to_config(hf: dict):
    t = text_fields(hf)
    if t.bool("mlp_bias", default=False):
        raise t._err("mlp_bias", "true is not supported (storelab's shared experts have no biases)")
    cfg = _reader.to_config(DECL, _defaults(hf))
    scale = t.float("router_scaling_factor", default=2.826, positive=True)
    layers = [dataclasses.replace(lay, channel=dataclasses.replace(lay.channel, routed_scaling=scale))
              if lay.channel.KIND == "moe" else lay for lay in cfg.layers]
    return dataclasses.replace(cfg, layers=layers)


FAMILY = Family(stores=DECL.stores, name=DECL.name, model_types=DECL.model_types, to_config=to_config,
                table=lambda hf, cfg, names: _reader.table(DECL, _defaults(hf), cfg, names),
                ignored=lambda hf: _reader._ignored(DECL, hf), runs=lambda hf: _reader.runs(DECL, hf))
