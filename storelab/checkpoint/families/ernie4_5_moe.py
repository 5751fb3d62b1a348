"""ERNIE 4.5 MoE and dense (Baidu, ERNIE 4.5 technical report, 2025; ``ernie4_5_moe``, ``ernie4_5``: no experts):
GQA attention with RoPE on interleaved channel pairs (2i, 2i + 1; ``rope_interleaved``), no biases (``use_bias`` false), tied
embeddings by default, a dense SwiGLU of ``intermediate_size`` on the layers outside the experts'
range, and on layer i a mixture of experts when (i + 1) % ``moe_layer_interval`` == 0 and
``moe_layer_start_index`` <= i <= ``moe_layer_end_index`` (-1: the last layer), as
``Ernie4_5_MoeDecoderLayer`` places them. The router: softmax over all ``moe_num_experts`` logits,
the ``moe_k`` chosen on softmax + the statistics bias ``moe_statics.e_score_correction_bias`` (a
buffer: it steers the choice, the weights are the unbiased softmax), the chosen renormalised (always;
transformers divides by max(sum, ``moe_norm_min``), storelab by sum + 1e-20), plus
``moe_num_shared_experts`` shared experts of ``moe_intermediate_size`` each.

Names (the release's, which transformers 5.23 writes back; ``m`` = ``model.layers.i.mlp``):

| ours                                 | checkpoint                                                         |
|--------------------------------------|--------------------------------------------------------------------|
| blocks.i.token.{q,k,v,o}_proj        | model.layers.i.self_attn.{q,k,v,o}_proj                            |
| blocks.i.channel.{gate,up,down}_proj | m.{gate,up,down}_proj (dense layers)                               |
| blocks.i.channel.router              | m.gate.weight                                                      |
| blocks.i.channel.choice_bias [E]     | m.moe_statics.e_score_correction_bias [1, E] (v5: m.gate.moe_statics.) |
| blocks.i.channel.gate_up, down       | m.experts.{e}.{gate,up,down}_proj (or 3-D gate_up_proj / down_proj) |
| blocks.i.channel.shared_*_proj       | m.shared_experts.{gate,up,down}_proj                               |

The multi-token-prediction tensors of the release (``mtp_block``, ``mtp_emb_norm``, ``mtp_hidden_norm``,
``mtp_linear_proj``; ``num_nextn_predict_layers``) are ignored and not counted, as transformers ignores them.
``use_bias`` true (biases on every projection, the MLPs and the LM head) is refused naming the field:
the published ERNIE 4.5 models have none, and storelab's experts and shared experts take no biases.
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families._common import either, layer_prefix
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Decl, _attention, _channel, runs, table, text_fields, to_config
from storelab.checkpoint.table import Src


def ernie_token(t, i, kind, decl, D, eps):
    """The reader's attention, rotating interleaved channel pairs."""
    return dataclasses.replace(_attention(t, i, kind, decl, D, eps), rope_interleaved=True)


def ernie_sparse(t, n: int) -> list[bool]:
    """Whether layer i holds experts (``Ernie4_5_MoeDecoderLayer``'s rule)."""
    if not t.int("moe_num_experts", "num_experts", default=0):
        return [False] * n
    start = t.int("moe_layer_start_index", default=1)
    end = t.int("moe_layer_end_index", default=-1, minimum=-1)
    end = n - 1 if end == -1 else end
    every = t.int("moe_layer_interval", default=1, minimum=1)
    return [(i + 1) % every == 0 and start <= i <= end for i in range(n)]


def ernie_config(decl: Decl, hf: dict):
    """The reader's config, the experts placed by ERNIE's rule and their scores always renormalised."""
    t = text_fields(hf)
    if t.bool("use_bias", default=False):
        raise t._err("use_bias", "true is not supported (biases on every projection, MLP and the LM head; "
                                 "storelab's experts take none, and no published ERNIE 4.5 model has them)")
    cfg = to_config(decl, hf)
    D, eps = cfg.d_model, cfg.norm_eps
    layers = []
    for i, (lay, sparse) in enumerate(zip(cfg.layers, ernie_sparse(t, cfg.n_layers))):
        ch = _channel(t, i, sparse, decl, D, eps)
        ch = dataclasses.replace(ch, norm_topk_prob=True) if sparse else ch
        layers.append(dataclasses.replace(lay, channel=ch))
    return dataclasses.replace(cfg, layers=layers)


def ernie_statics(tab, hf, cfg, names):
    """The choice bias from ``moe_statics`` ([1, E] -> [E])."""
    pre, _ = layer_prefix(names)
    for i, lay in enumerate(cfg.layers):
        if lay.channel.KIND != "moe":
            continue
        m = f"{pre}layers.{i}.mlp"
        where = either(names, f"{m}.moe_statics.e_score_correction_bias",
                       f"{m}.gate.moe_statics.e_score_correction_bias")
        tab[f"blocks.{i}.channel.choice_bias"] = Src((where,), lambda b: b.reshape(-1), "[1, E] -> [E]")


MTP = (r"(^|\.)mtp_",)  # the release's MTP tensors (transformers: _keys_to_ignore_on_load_unexpected "mtp")

DECL = Decl(name="ernie4_5_moe", model_types=("ernie4_5_moe", "ernie4_5"), title="ERNIE 4.5 (checkpoint)", qkv_bias=False,
            o_bias=False, router="softmax", router_bias=True, eps=1e-5, theta=500000.0, tied=True, token=ernie_token,
            extra=ernie_statics)

FAMILY = Family(stores=("attention", "ffn", "moe", "residual"),
                name=DECL.name, model_types=DECL.model_types, to_config=lambda hf: ernie_config(DECL, hf),
                table=lambda hf, cfg, names: table(DECL, hf, cfg, names), ignored=lambda hf: DECL.ignored + MTP,
                runs=lambda hf: runs(DECL, hf))
