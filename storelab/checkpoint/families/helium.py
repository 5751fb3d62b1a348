"""Helium (Kyutai, 2025; ``helium``): a Llama decoder that rotates interleaved pairs of channels (2i, 2i + 1)
(``rope_interleaved``), with ``attention_bias`` on q, k and v only (the output projection has none) and
``mlp_bias`` on the MLP's three projections (both false by default), ``rms_norm_eps`` 1e-8 by default.

Parameters per layer: the attention's D*(H + 2G)*K + H*K*D (+ (H + 2G)*K biases), the MLP's 3*D*I
(+ 2I + D biases), two d_model norms; the state is the keys and values.

Names: transformers' usual ones (``model.layers.i.self_attn.{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``,
``input_layernorm``, ``post_attention_layernorm``).
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._common import layer_prefix, mlp_bias_entries, with_mlp_biases
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Decl, Fields, _attention, text_fields

__all__ = ["FAMILY"]


def helium_attention(t: Fields, i: int, kind: str, decl: Decl, D: int, eps: float):
    """The shared reader's attention, rotating interleaved pairs, no output bias."""
    return dataclasses.replace(_attention(t, i, kind, decl, D, eps), rope_interleaved=True, out_bias=False)


DECL = Decl(name="helium", model_types=("helium",), title="Helium (checkpoint)", eps=1e-8, token=helium_attention)


def to_config(hf: dict):
    cfg = _reader.to_config(DECL, hf)
    return with_mlp_biases(cfg) if text_fields(hf).bool("mlp_bias", default=False) else cfg


def table(hf: dict, cfg, names: set[str]) -> dict:
    """The reader's names, and the MLP's biases where ``mlp_bias``."""
    tab = _reader.table(DECL, hf, cfg, names)
    mlp_bias_entries(tab, cfg, prefix=layer_prefix(names)[0])
    return tab


FAMILY = Family(stores=("attention", "ffn", "residual"),
                name="helium", model_types=DECL.model_types, to_config=to_config, table=table,
                ignored=lambda hf: DECL.ignored, runs=lambda hf: _reader.runs(DECL, hf))
