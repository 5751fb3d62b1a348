"""Mellum 2 (JetBrains, 2026; ``mellum``): Qwen3-MoE's decoder with local and global layers, each layer type with
its own rotation, and dense or sparse MLPs per layer (transformers 5.23's ``MellumForCausalLM``).

* attention: GQA with per-head q/k RMSNorms before the rotation, no biases; ``layer_types`` (default: every layer
  global) put a window of ``sliding_window`` (1024, counting the query itself) on the local layers; RoPE per layer
  type from ``rope_parameters`` (``MellumConfig``'s default: global 500,000, local 10,000; a
  ``partial_rotary_factor`` per type as Laguna's rotary embedding reads it);
* channel: ``mlp_layer_types`` (default: all "sparse"): a SwiGLU MLP of ``intermediate_size``, or
  ``num_local_experts`` experts of ``moe_intermediate_size`` chosen by a softmax router (top
  ``num_experts_per_tok``, renormalised with ``norm_topk_prob``, default true), no shared expert;
* pre-norm RMSNorms, untied embeddings by default; the MTP layer (``mtp.*``) is ignored.

Parameters per layer: the attention's D*(H + 2G)*K + H*K*D + 2K, the MLP's 3*D*I or the experts' 3*E*D*I + E*D,
two d_model norms; the state is the keys and values (the window's on local layers). Names: transformers' usual
(``self_attn.{q,k,v,o}_proj``, ``q_norm``, ``k_norm``, ``mlp.gate``, ``mlp.experts``), as ``qwen3.py``.
"""

from __future__ import annotations

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Decl, text_fields

__all__ = ["FAMILY"]

DECL = Decl(name="mellum", model_types=("mellum",), title="Mellum 2 (checkpoint)", qk_norm=True,
            norm_topk_default=True, ignored=Decl.ignored + (r"^mtp\.",),
            stores=("attention", "window", "ffn", "moe", "residual"))


def _defaults(hf: dict) -> dict:
    """``MellumConfig``'s defaults where the file is silent (or says null): every layer global and sparse, a 1024
    window, the two layer types' rotations."""
    n = text_fields(hf).int("num_hidden_layers", minimum=1)
    fill = {"sliding_window": 1024, "layer_types": ["full_attention"] * n, "mlp_layer_types": ["sparse"] * n,
            "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 500000.0},
                                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0}}}
    return {**hf, **{k: v for k, v in fill.items() if hf.get(k) is None}}


FAMILY = Family(stores=DECL.stores, name=DECL.name, model_types=DECL.model_types,
                to_config=lambda hf: _reader.to_config(DECL, _defaults(hf)),
                table=lambda hf, cfg, names: _reader.table(DECL, _defaults(hf), cfg, names),
                ignored=lambda hf: DECL.ignored, runs=lambda hf: _reader.runs(DECL, _defaults(hf)))
