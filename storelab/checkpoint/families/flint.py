"""Flint (RecursiveSI, 2026; ``flint``): a Qwen3-MoE decoder whose local layers rotate and whose global layers use
no positions, a learned sink logit per head on every layer, and sigmoid-routed experts beside an ungated shared
expert (transformers 5.23's ``FlintForCausalLM``).

* attention: GQA with per-head q/k RMSNorms, no biases; ``layer_types`` (``FlintConfig``'s default: global on
  layers 0, 1, every layer i with i % 4 == 1 and the last, local elsewhere); a local layer rotates (RoPE from
  ``rope_parameters``) within ``sliding_window`` (513, counting the query itself, so our ``window`` is 512); a
  global layer has no positions (NoPE: ``partial_rotary`` 0); every layer one learned logit per head in the
  softmax's denominator (``softmax_offset`` in the saved files, ``sinks`` in memory: our ``sink``);
* channel: the layers of ``mlp_only_layers`` (default [0, 1]) a SwiGLU MLP of ``intermediate_size``, the others
  ``num_experts`` experts of ``moe_intermediate_size``: the top ``num_experts_per_tok`` sigmoid scores of the
  fp32 router logits (no choice bias), renormalised with ``norm_topk_prob``, plus a shared SwiGLU of
  ``shared_expert_intermediate_size`` added unweighted;
* pre-norm RMSNorms (gpt-oss's: the weight applied in fp32 before the cast back, the same function in fp32).

Parameters per layer: the attention's D*(H + 2G)*K + H*K*D + 2K + H, the MLP's 3*D*I or the experts' 3*E*D*I +
E*D + the shared 3*D*S, two d_model norms; the state is the keys and values (the window's on local layers).
Names: transformers' (``self_attn.softmax_offset`` or ``sinks``, ``mlp.gate``, ``mlp.experts``,
``mlp.shared_expert``).
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._common import either, layer_prefix
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import FULL, SLIDING, Decl, Fields, _attention, text_fields
from storelab.checkpoint.table import copy

__all__ = ["FAMILY"]


def flint_attention(t: Fields, i: int, kind: str, decl: Decl, D: int, eps: float):
    """The reader's attention; a global layer uses no positions."""
    a = _attention(t, i, kind, decl, D, eps)
    return dataclasses.replace(a, partial_rotary=0.0, rope_scaling=None) if kind == FULL else a


def _sinks(tab: dict, hf: dict, cfg, names: set[str]) -> None:
    pre = layer_prefix(names)[0]
    for i in range(cfg.n_layers):
        a = f"{pre}layers.{i}.self_attn"
        tab[f"blocks.{i}.token.sinks"] = copy(either(names, f"{a}.softmax_offset", f"{a}.sinks"))


DECL = Decl(name="flint", model_types=("flint",), title="Flint (checkpoint)", qk_norm=True, sink_on=(FULL, SLIDING),
            router="sigmoid", norm_topk_default=True, token=flint_attention, extra=_sinks,
            stores=("attention", "window", "ffn", "moe", "residual"))


def _defaults(hf: dict) -> dict:
    """``FlintConfig``'s defaults where the file is silent (or says null): its layer pattern, a 513 window, two
    dense layers."""
    n = text_fields(hf).int("num_hidden_layers", minimum=1)
    fill = {"sliding_window": 513, "mlp_only_layers": [0, 1][:n],
            "layer_types": [FULL if i < 2 or i % 4 == 1 or i == n - 1 else SLIDING for i in range(n)]}
    return {**hf, **{k: v for k, v in fill.items() if hf.get(k) is None}}


FAMILY = Family(stores=DECL.stores, name=DECL.name, model_types=DECL.model_types,
                to_config=lambda hf: _reader.to_config(DECL, _defaults(hf)),
                table=lambda hf, cfg, names: _reader.table(DECL, _defaults(hf), cfg, names),
                ignored=lambda hf: DECL.ignored, runs=lambda hf: _reader.runs(DECL, _defaults(hf)))
