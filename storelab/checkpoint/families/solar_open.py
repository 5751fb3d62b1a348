"""Solar Open (Upstage, 2025; ``solar_open``): Llama's attention beside GLM-4.5's experts on every layer.

* attention (``LlamaAttention``): GQA with RoPE (base 1,000,000 by default), ``head_dim`` 128 by default,
  ``attention_bias`` on q/k/v only (the output projection never has one); no q/k norms;
* channel: every layer an MoE (``SolarOpenConfig`` drops ``first_k_dense_replace``; a file's is not read by
  transformers, nor here): ``n_routed_experts`` experts of ``moe_intermediate_size`` chosen by sigmoid scores plus
  the routing bias (``e_score_correction_bias``) among ``topk_group`` of ``n_group`` groups, renormalised
  (``norm_topk_prob``) and times ``routed_scaling_factor``, beside one shared MLP of ``n_shared_experts`` x
  ``moe_intermediate_size``;
* pre-norm RMSNorms (eps ``rms_norm_eps``, 1e-5), untied embeddings.

Parameters per layer: the attention's D*(H + 2G)*K + H*K*D, the experts' E*3*D*I + E*D router + E bias + the
shared MLP's 3*D*S; the state is the keys and values. Names: transformers' usual ones (``mlp.gate``,
``mlp.experts`` 3-D, ``mlp.shared_experts``).
"""

from __future__ import annotations

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Decl

__all__ = ["FAMILY"]

DECL = Decl(name="solar_open", model_types=("solar_open",), title="Solar Open (checkpoint)", o_bias=False,
            router="sigmoid", router_bias=True, eps=1e-5, theta=1_000_000.0,
            types=lambda t, n: [_reader.FULL] * n, stores=("attention", "moe", "residual"))


def _defaults(hf: dict) -> dict:
    """``head_dim`` 128 when the file names none; every layer sparse (``SolarOpenDecoderLayer``)."""
    n = _reader.text_fields(hf).int("num_hidden_layers", minimum=1)
    return dict(hf, head_dim=hf.get("head_dim") or 128, mlp_layer_types=["sparse"] * n)


FAMILY = Family(stores=DECL.stores, name=DECL.name, model_types=DECL.model_types,
                to_config=lambda hf: _reader.to_config(DECL, _defaults(hf)),
                table=lambda hf, cfg, names: _reader.table(DECL, _defaults(hf), cfg, names),
                ignored=lambda hf: DECL.ignored, runs=lambda hf: _reader.runs(DECL, hf))
