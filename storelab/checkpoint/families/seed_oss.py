"""Seed-OSS (ByteDance Seed, 2025; ``seed_oss``): a Llama decoder (GQA, RoPE, SwiGLU MLP, pre-norm RMSNorms)
whose biases are named apart: ``attention_bias`` on the query, key and value projections (true by
default, as in Seed-OSS-36B), ``attention_out_bias`` on the output projection (false by default) and
``mlp_bias`` on the MLP's three projections (false by default; storelab's ``ffn`` has them as ``bias``).
``attention_dropout`` and ``residual_dropout`` act in training only and change nothing at inference.

Parameters per layer: the attention's D*(H + 2G)*K + H*K*D (+ (H + 2G)*K and D with the biases), the MLP's
3*D*I (+ 2I + D), two d_model norms; the state is the keys and values.

Names: transformers' usual ones (``model.layers.i.self_attn.{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``
with their ``.bias`` where the file says so, ``input_layernorm``, ``post_attention_layernorm``).
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._common import layer_prefix, mlp_bias_entries, with_mlp_biases
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Decl, Fields, _attention, text_fields

__all__ = ["FAMILY"]


def seed_attention(t: Fields, i: int, kind: str, decl: Decl, D: int, eps: float):
    """The shared reader's attention with Seed-OSS's two bias fields and their defaults."""
    return dataclasses.replace(_attention(t, i, kind, decl, D, eps),
                               qkv_bias=t.bool("attention_bias", default=True),
                               out_bias=t.bool("attention_out_bias", default=False))


DECL = Decl(name="seed_oss", model_types=("seed_oss",), title="Seed-OSS (checkpoint)", token=seed_attention)


def to_config(hf: dict):
    cfg = _reader.to_config(DECL, hf)
    return with_mlp_biases(cfg) if text_fields(hf).bool("mlp_bias", default=False) else cfg


def table(hf: dict, cfg, names: set[str]) -> dict:
    """The reader's names, and the MLP's biases where ``mlp_bias``."""
    tab = _reader.table(DECL, hf, cfg, names)
    mlp_bias_entries(tab, cfg, prefix=layer_prefix(names)[0])
    return tab


FAMILY = Family(stores=("attention", "window", "ffn", "residual"),
                name="seed_oss", model_types=DECL.model_types, to_config=to_config, table=table,
                ignored=lambda hf: DECL.ignored, runs=lambda hf: _reader.runs(DECL, hf))
