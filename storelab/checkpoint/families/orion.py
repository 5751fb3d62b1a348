"""Orion (OrionStar, arXiv 2401.12246; ``orion``, remote code ``modeling_orion.py``: Orion-14B): a Llama decoder
whose norms are LayerNorms with biases.

* norms: ``nn.LayerNorm`` with a bias (``norm_kind = "layer_bias"``), eps ``rms_norm_eps`` (1e-5), before the
  attention, before the MLP and at the end;
* attention: GQA (``num_key_value_heads``; Orion-14B: 40 of 40), head size hidden / heads, RoPE on whole heads
  rotated as halves, base ``rope_theta``; ``attention_bias`` (false) on all four projections;
* a SwiGLU MLP without biases; untied embeddings.

Parameters per layer: D*(H + 2G)*K + H*K*D, 3*D*I, two norms of 2*D; the state is the keys and values.
Names: transformers' Llama names, each LayerNorm with its ``.bias``.
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import FULL, Decl
from storelab.checkpoint.table import copy

__all__ = ["FAMILY"]

DECL = Decl(name="orion", model_types=("orion",), title="Orion (checkpoint)", eps=1e-5,
            types=lambda t, n: [FULL] * n)


def to_config(hf: dict):
    return dataclasses.replace(_reader.to_config(DECL, hf), norm_kind="layer_bias")


def table(hf: dict, cfg, names: set[str]) -> dict:
    """The reader's names and each LayerNorm's bias."""
    tab = _reader.table(DECL, hf, cfg, names)
    tab["norm.bias"] = copy("model.norm.bias")
    for i in range(cfg.n_layers):
        a, b = f"model.layers.{i}", f"blocks.{i}"
        tab[f"{b}.norm_token.bias"] = copy(f"{a}.input_layernorm.bias")
        tab[f"{b}.norm_channel.bias"] = copy(f"{a}.post_attention_layernorm.bias")
    return tab


FAMILY = Family(stores=("attention", "ffn", "residual"), name="orion", model_types=DECL.model_types,
                to_config=to_config, table=table, ignored=lambda hf: DECL.ignored,
                runs=lambda hf: _reader.runs(DECL, hf),
                oracle="transformers 5.23's stablelm (whole heads rotated, no q/k/v bias): logits (fp32, bf16), "
                       "prefill-then-step, cache bytes and parameters of its tiny model, saved under Orion's names "
                       "and fields")
