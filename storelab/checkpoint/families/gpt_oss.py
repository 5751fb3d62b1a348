"""gpt-oss (OpenAI, arXiv 2508.10925; ``gpt_oss``): GQA attention with biases on q, k, v and o, a learned
sink logit per head on every layer, layers alternating between a sliding window and full attention
(``layer_types``; transformers' ``sliding_window`` 128 counts the query, so our window is 127 earlier
tokens), YaRN rope (``rope_scaling``; accounting reads it, running needs a rope storelab computes:
``_reader.RUNS_ROPE``), and a mixture of experts on every layer:

* the router is a linear layer with a bias; the top-k of its logits are chosen and weighted by the
  softmax over those k logits (``route_topk``'s softmax renormalised over the chosen);
* each expert is a clamped SwiGLU with biases: g = min(W_g x + b_g, limit), u = clamp(W_u x + b_u,
  -limit, limit), y = W_down (g sigmoid(alpha g) (u + 1)) + b_down, alpha ``swiglu_alpha`` (1.702),
  limit ``swiglu_limit`` (7.0): storelab's ``clamped_swiglu`` with ``expert_biases`` and
  ``router_logit_bias`` on the moe store.

Parameters per MoE layer (E experts of width I, D model width): E D + E (router) + 3 E I D + E (2 I + D);
the active count reads ``num_experts_per_tok`` of them.

Names (transformers' ``GptOssForCausalLM``, the unquantized layout; ``m`` = ``model.layers.i.mlp``):

| ours                                   | transformers                                                |
|----------------------------------------|-------------------------------------------------------------|
| blocks.i.token.{q,k,v,o}_proj (+ bias) | model.layers.i.self_attn.{q,k,v,o}_proj                     |
| blocks.i.token.sinks                   | model.layers.i.self_attn.sinks                              |
| blocks.i.channel.router (+ bias)       | m.router.weight, m.router.bias                              |
| blocks.i.channel.gate_up [E, 2I, D]    | m.experts.gate_up_proj [E, D, 2I] transposed, gate rows first |
|                                        | (its columns interleave gate, up: even, odd)                |
| blocks.i.channel.gate_up_bias [E, 2I]  | m.experts.gate_up_proj_bias, de-interleaved the same way    |
| blocks.i.channel.down [E, D, I]        | m.experts.down_proj [E, I, D] transposed                    |
| blocks.i.channel.down_bias [E, D]      | m.experts.down_proj_bias                                    |

The published checkpoints store the experts in MXFP4 (``gate_up_proj_blocks`` / ``_scales``); storelab
reads the bf16 layout above (transformers' own, and the dequantized copies): loading a checkpoint whose
``quantization_config.quant_method`` is "mxfp4" is refused naming that field (``Family.runs``); accounting
from config.json is exact either way.
"""

from __future__ import annotations

import dataclasses

import torch

from storelab.checkpoint.families._common import layer_prefix
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import (FULL, SLIDING, Decl, _attention, runs, table, text_fields,
                                                  to_config)
from storelab.checkpoint.table import Src, copy

SWIGLU_ALPHA, SWIGLU_LIMIT = 1.702, 7.0  # GptOssConfig's defaults


def gpt_oss_token(t, i, kind, decl, D, eps):
    """The reader's attention, with ``attention_bias`` true when the config does not say (GptOssConfig)."""
    bias = t.bool("attention_bias", default=True)
    return _attention(t, i, kind, dataclasses.replace(decl, qkv_bias=bias, o_bias=bias), D, eps)


def gpt_oss_config(decl: Decl, hf: dict):
    """The reader's config, every MoE layer given gpt-oss's router bias, expert biases and clamped SwiGLU."""
    t = text_fields(hf)
    t.int("num_local_experts", "num_experts", minimum=1)  # every layer is a mixture of experts
    cfg = to_config(decl, hf)
    unit = dict(activation="clamped_swiglu", swiglu_alpha=t.float("swiglu_alpha", default=SWIGLU_ALPHA),
                swiglu_limit=t.float("swiglu_limit", default=SWIGLU_LIMIT), swiglu_up_shift=1.0,
                router_logit_bias=True, expert_biases=True)
    layers = [dataclasses.replace(lay, channel=dataclasses.replace(lay.channel, **unit)) for lay in cfg.layers]
    return dataclasses.replace(cfg, layers=layers)


def gpt_oss_runs(decl: Decl, hf: dict) -> None:
    """The reader's rope check, and MXFP4 experts refused (storelab reads them in bf16)."""
    runs(decl, hf)
    q = text_fields(hf).sub("quantization_config", default={})
    if q.str("quant_method", default="") == "mxfp4":
        raise q._err("quant_method", "'mxfp4': storelab reads gpt-oss's experts in bf16 (gate_up_proj, down_proj), "
                                     "not as MXFP4 blocks and scales (accounting reads the config)")


def _gate_rows_first(w):
    """[..., 2I] with gate and up interleaved (even, odd) -> [..., 2I] gate first, then up."""
    return torch.cat([w[..., 0::2], w[..., 1::2]], -1)


def gpt_oss_experts(tab, hf, cfg, names):
    """The router and experts under gpt-oss's names (they replace the reader's ``mlp.gate`` entries)."""
    pre, _ = layer_prefix(names)
    for i, lay in enumerate(cfg.layers):
        m, c = f"{pre}layers.{i}.mlp", f"blocks.{i}.channel"
        for k in [k for k in tab if k.startswith(c + ".")]:
            del tab[k]
        tab[f"{c}.router.weight"] = copy(f"{m}.router.weight")
        tab[f"{c}.router.bias"] = copy(f"{m}.router.bias")
        x = f"{m}.experts"
        tab[f"{c}.gate_up"] = Src((f"{x}.gate_up_proj",), lambda w: _gate_rows_first(w).transpose(1, 2),
                                  "[E, D, 2I] interleaved -> [E, 2I, D] gate rows first")
        tab[f"{c}.gate_up_bias"] = Src((f"{x}.gate_up_proj_bias",), _gate_rows_first,
                                       "[E, 2I] interleaved -> gate first")
        tab[f"{c}.down"] = Src((f"{x}.down_proj",), lambda w: w.transpose(1, 2), "[E, I, D] -> [E, D, I]")
        tab[f"{c}.down_bias"] = copy(f"{x}.down_proj_bias")


DECL = Decl(name="gpt_oss", model_types=("gpt_oss",), title="gpt-oss (checkpoint)", sink_on=(FULL, SLIDING),
            eps=1e-5, theta=150000.0, every=2, token=gpt_oss_token, extra=gpt_oss_experts)

FAMILY = Family(stores=("attention", "window", "moe", "residual"),
                name=DECL.name, model_types=DECL.model_types, to_config=lambda hf: gpt_oss_config(DECL, hf),
                table=lambda hf, cfg, names: table(DECL, hf, cfg, names), ignored=lambda hf: DECL.ignored,
                runs=lambda hf: gpt_oss_runs(DECL, hf))
