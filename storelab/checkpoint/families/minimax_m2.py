"""MiniMax-M2 / M2.5 / M2.7 (MiniMax; ``minimax_m2``): full GQA attention on every layer with one RMSNorm
over all query heads' channels and one over all key heads' channels (``qk_norm_scope="all"``, before
RoPE; ``use_qk_norm``), partial RoPE on the first ``rotary_dim`` channels of each head (v5 configs:
``rope_parameters.partial_rotary_factor``), no projection biases, and a mixture of experts on every
layer: sigmoid scores, the choice made on score + ``e_score_correction_bias`` (``use_routing_bias``),
the chosen scores renormalised (always, as ``MiniMaxM2TopKRouter`` does), experts of
``intermediate_size`` with a SiLU-gated unit, no shared expert.

Names (the release, and transformers' ``MiniMaxM2ForCausalLM``; ``m`` = ``model.layers.i``):

| ours                                 | checkpoint                                                        |
|--------------------------------------|-------------------------------------------------------------------|
| blocks.i.token.{q,k,v,o}_proj        | m.self_attn.{q,k,v,o}_proj                                        |
| blocks.i.token.q_norm / k_norm       | m.self_attn.q_norm [H K] / k_norm [G K]                           |
| blocks.i.channel.router, choice_bias | m.block_sparse_moe.gate.weight, m.block_sparse_moe.e_score_correction_bias |
|                                      | (transformers' v5 modules: m.mlp.)                                |
| blocks.i.channel.gate_up, down       | m.block_sparse_moe.experts.{e}.w1 / w3 / w2 (or 3-D gate_up_proj / down_proj) |

The release's multi-token-prediction modules (``num_mtp_modules``) are not part of the decoder: their
tensors, stored after the last layer or under ``mtp``, are ignored and not counted. ``attn_type_list``
entries other than 1 (MiniMax-01's lightning attention) and a shared expert
(``shared_intermediate_size`` > 0) are refused naming the field: MiniMax-M2 has neither.
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Decl, _attention, runs, table, text_fields, to_config
from storelab.checkpoint.families._common import beyond_layers


def minimax_m2_token(t, i, kind, decl, D, eps):
    """Full attention; q/k norms over all heads (``use_qk_norm``), RoPE on ``rotary_dim`` channels."""
    kinds = t.list("attn_type_list", n=t.int("num_hidden_layers", minimum=1), default=None)
    if kinds is not None and kinds[i] != 1:
        raise t._err(f"attn_type_list[{i}]", f"{kinds[i]!r} is not supported (MiniMax-M2's layers are full "
                                             f"attention, 1; storelab's minimax_m2 family reads those only)")
    qk_norm = t.bool("use_qk_norm", default=True)
    att = _attention(t, i, kind, dataclasses.replace(decl, qk_norm=qk_norm), D, eps)
    if qk_norm:
        att = dataclasses.replace(att, qk_norm_scope="all")
    rp = t.sub("rope_parameters") if t.has("rope_parameters") else t
    if t.has("rotary_dim") and not rp.has("partial_rotary_factor"):  # the release names the channels
        att = dataclasses.replace(att, partial_rotary=t.int("rotary_dim", minimum=0) / att.head_dim)
    return att


def minimax_m2_config(decl: Decl, hf: dict):
    """The reader's config; the choice bias as ``use_routing_bias`` says (default on), the chosen scores
    always renormalised (``norm_topk_prob`` is not a MiniMax-M2 field)."""
    t = text_fields(hf)
    if t.int("shared_intermediate_size", default=0):
        raise t._err("shared_intermediate_size", f"{t.int('shared_intermediate_size')}: MiniMax-M2 has no shared "
                                                 f"expert (transformers' MiniMaxM2SparseMoeBlock builds none)")
    t.int("num_local_experts", "num_experts", minimum=1)  # every layer is a mixture of experts
    cfg = to_config(decl, hf)
    bias = t.bool("use_routing_bias", default=True)
    layers = [dataclasses.replace(lay, channel=dataclasses.replace(lay.channel, router_bias=bias, norm_topk_prob=True))
              for lay in cfg.layers]
    return dataclasses.replace(cfg, layers=layers)


def _ignored(decl: Decl, hf: dict) -> tuple[str, ...]:
    n = text_fields(hf).int("num_hidden_layers", minimum=1)
    return decl.ignored + (beyond_layers(n), r"(^|\.)mtp\.")


DECL = Decl(name="minimax_m2", model_types=("minimax_m2",), title="MiniMax-M2 (checkpoint)", qkv_bias=False,
            o_bias=False, router="sigmoid", router_bias=True, theta=5e6, token=minimax_m2_token)

FAMILY = Family(stores=("attention", "moe", "residual"),
                name=DECL.name, model_types=DECL.model_types, to_config=lambda hf: minimax_m2_config(DECL, hf),
                table=lambda hf, cfg, names: table(DECL, hf, cfg, names), ignored=lambda hf: _ignored(DECL, hf),
                runs=lambda hf: runs(DECL, hf))
