"""AFMoE (Arcee's Trinity models; ``afmoe``): sandwich-normed layers of gated attention, local layers rotating and
global layers without positions, and sigmoid-routed experts.

* attention (``AfmoeAttention``): GQA, ``head_dim`` 128 by default, per-head q/k RMSNorms before the rotation; RoPE
  on the ``sliding_attention`` layers only (within ``sliding_window``, 1024), the ``full_attention`` layers use no
  positions; the output of each head times sigmoid(``gate_proj`` x) per channel (our ``gate``: the table puts each
  head's gate rows after its query rows in ``q_proj``, Qwen3-Next's layout); ``attention_bias`` (false in the
  releases) refused, naming the field: the gate has no bias;
* ``layer_types``, else every ``global_attn_every_n_layers``-th layer (4) global and the rest local;
* sandwich norms (``norms = "sandwich"``): ``input_layernorm`` / ``post_attention_layernorm`` around the attention,
  ``pre_mlp_layernorm`` / ``post_mlp_layernorm`` around the MLP;
* channel: the first ``num_dense_layers`` (1) a SwiGLU MLP of ``intermediate_size``; then ``num_experts`` experts of
  ``moe_intermediate_size``, the top ``num_experts_per_tok`` by sigmoid score plus ``expert_bias`` (a choice bias),
  their scores renormalised and times ``route_scale``, beside a shared MLP of ``num_shared_experts`` x
  ``moe_intermediate_size``;
* ``mup_enabled``: the embedding times sqrt(hidden_size); untied embeddings by default.

Parameters per layer: the attention's D*(2H + 2G)*K + H*K*D + 2K, the MLP's 3*D*I or the experts' E*3*D*I + E*D
router + E bias + the shared 3*D*S, four norms; the state is the keys and values (a window's W on local layers).
Names: transformers' ``AfmoeForCausalLM`` (``self_attn.gate_proj``, ``mlp.router.gate``, ``mlp.expert_bias``,
``mlp.experts`` 3-D, ``mlp.shared_experts``).
"""

from __future__ import annotations

import dataclasses

import torch

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._common import layer_prefix
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import FULL, SLIDING, Decl, Fields, _attention, text_fields
from storelab.checkpoint.table import Src, copy

__all__ = ["FAMILY"]


def afmoe_attention(t: Fields, i: int, kind: str, decl: Decl, D: int, eps: float):
    if t.bool("attention_bias", default=False):  # q_proj would carry a bias for the gate rows too
        raise t._err("attention_bias", "true is not supported (AFMoE's gate_proj has no bias; storelab's gated q_proj "
                                       "would give its gate rows one)")
    a = dataclasses.replace(_attention(t, i, kind, decl, D, eps), gate=True)
    return a if kind == SLIDING else dataclasses.replace(a, partial_rotary=0.0, rope_scaling=None)


DECL = Decl(name="afmoe", model_types=("afmoe",), title="AFMoE / Trinity (checkpoint)", qk_norm=True, eps=1e-5,
            router="sigmoid", router_bias=True, token=afmoe_attention,
            stores=("attention", "window", "ffn", "moe", "residual"))


def _defaults(hf: dict) -> dict:
    """``AfmoeConfig``'s defaults where the file is silent: ``head_dim`` 128, a 1024 window, every fourth layer
    global, the first layer dense."""
    t = text_fields(hf)
    n = t.int("num_hidden_layers", minimum=1)
    out = dict(hf, head_dim=hf.get("head_dim") or 128)
    out.setdefault("sliding_window", 1024)
    if "layer_types" not in hf:
        every = t.int("global_attn_every_n_layers", default=4, minimum=1)
        out["layer_types"] = [FULL if (i + 1) % every == 0 else SLIDING for i in range(n)]
    if "mlp_layer_types" not in hf:
        first = t.int("num_dense_layers", default=1)
        out["mlp_layer_types"] = ["dense" if i < first else "sparse" for i in range(n)]
    return out


def to_config(hf: dict):
    hf = _defaults(hf)
    t = text_fields(hf)
    cfg = _reader.to_config(DECL, hf)
    scale = t.float("route_scale", default=1.0, positive=True)
    layers = [dataclasses.replace(lay, norms="sandwich", channel=dataclasses.replace(lay.channel, routed_scaling=scale)
                                  if lay.channel.KIND == "moe" else lay.channel) for lay in cfg.layers]
    embed = t.float("hidden_size") ** 0.5 if t.bool("mup_enabled", default=False) else 1.0
    return dataclasses.replace(cfg, layers=layers, embed_scale=embed)


def _query_and_gate(q: str, g: str, H: int) -> Src:
    """Each head's query rows followed by its gate rows (our ``q_proj`` with ``gate``)."""
    def fuse(wq: torch.Tensor, wg: torch.Tensor) -> torch.Tensor:
        D = wq.shape[-1]
        return torch.cat([wq.reshape(H, -1, D), wg.reshape(H, -1, D)], 1).reshape(-1, D)

    return Src((q, g), fuse, "each head's q_proj rows, then its gate_proj rows")


def table(hf: dict, cfg, names: set[str]) -> dict:
    hf = _defaults(hf)
    tab = _reader.table(DECL, hf, cfg, names)
    pre = layer_prefix(names)[0]
    for i, lay in enumerate(cfg.layers):
        a, b, tok = f"{pre}layers.{i}", f"blocks.{i}", lay.token
        tab[f"{b}.post_norm_token.weight"] = copy(f"{a}.post_attention_layernorm.weight")
        tab[f"{b}.norm_channel.weight"] = copy(f"{a}.pre_mlp_layernorm.weight")
        tab[f"{b}.post_norm_channel.weight"] = copy(f"{a}.post_mlp_layernorm.weight")
        tab[f"{b}.token.q_proj.weight"] = _query_and_gate(f"{a}.self_attn.q_proj.weight",
                                                          f"{a}.self_attn.gate_proj.weight", tok.n_heads)
        if lay.channel.KIND == "moe":
            tab[f"{b}.channel.router.weight"] = copy(f"{a}.mlp.router.gate.weight")
            tab[f"{b}.channel.choice_bias"] = copy(f"{a}.mlp.expert_bias")
    return tab


FAMILY = Family(stores=DECL.stores, name=DECL.name, model_types=DECL.model_types, to_config=to_config, table=table,
                ignored=lambda hf: DECL.ignored, runs=lambda hf: _reader.runs(DECL, _defaults(hf)))
