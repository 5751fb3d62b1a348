"""Baichuan / Baichuan 2 (Baichuan Inc., arXiv 2309.10305; ``baichuan``, remote code ``modeling_baichuan.py``):
Llama decoders with the query, key and value projections packed in one ``W_pack``.

* 7B (``hidden_size`` 4096: Baichuan-7B, Baichuan2-7B): multi-head attention with RoPE on whole heads as halves,
  base 10000; 13B (``hidden_size`` 5120: Baichuan-13B, Baichuan2-13B): ALiBi (arXiv 2108.12409), a fixed linear
  bias per head on the scores and no rotation. No field says which: the width tells the two remote codes apart
  (vLLM reads it so too); ALiBi is accounted (its state is the same keys and values) and refused for running:
  storelab's attention has no position bias;
* ``W_pack``: query rows, then key rows, then value rows (D each), no biases; ``o_proj`` without one;
* a SwiGLU MLP; RMSNorms (``rms_norm_eps``); untied embeddings;
* Baichuan 2 (``vocab_size`` 125696, as vLLM tells the two apart) keeps a ``NormHead``: the logits are read through
  each vocabulary row scaled to unit length, so the table scales ``lm_head``'s rows at load.

Parameters per layer: 4*D*D + 3*D*I, two d_model norms; the state is the keys and values, 2*D per token per layer.
Names: transformers' Llama names, ``self_attn.W_pack`` in place of q/k/v.
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import FULL, Decl, Fields, _attention, text_fields
from storelab.checkpoint.table import Src, rows

__all__ = ["FAMILY"]

ALIBI_WIDTH = 5120        # the 13B models add ALiBi biases; the 7B ones (4096) rotate
NORM_HEAD_VOCAB = 125696  # Baichuan 2's vocabulary: its head is read with unit rows


def _alibi(t: Fields) -> bool:
    return t.int("hidden_size", minimum=1) == ALIBI_WIDTH


def baichuan_attention(t: Fields, i: int, kind: str, decl: Decl, D: int, eps: float):
    a = _attention(t, i, kind, decl, D, eps)
    return dataclasses.replace(a, head_dim=D // a.n_heads, n_kv_heads=a.n_heads, qkv_bias=False, out_bias=False,
                               partial_rotary=0.0 if _alibi(t) else 1.0)


DECL = Decl(name="baichuan", model_types=("baichuan",), title="Baichuan / Baichuan 2 (checkpoint)",
            token=baichuan_attention, types=lambda t, n: [FULL] * n)


def runs(hf: dict) -> None:
    t = text_fields(hf)
    if _alibi(t):
        raise t._err("hidden_size", f"{t.int('hidden_size')}: the 13B models' ALiBi position biases are accounted, not "
                                    f"run (storelab's attention has no position bias)")
    _reader.runs(DECL, hf)


def _unit_rows(w):
    return w / w.float().norm(dim=-1, keepdim=True).clamp_min(1e-12).to(w.dtype)


def table(hf: dict, cfg, names: set[str]) -> dict:
    tab = _reader.table(DECL, hf, cfg, names)
    for i in range(cfg.n_layers):
        o, w = f"blocks.{i}.token", f"model.layers.{i}.self_attn.W_pack.weight"
        for j, part in enumerate(("q", "k", "v")):
            tab[f"{o}.{part}_proj.weight"] = rows(w, j * cfg.d_model, (j + 1) * cfg.d_model)
    if cfg.vocab_size == NORM_HEAD_VOCAB and not cfg.tie_embeddings:
        tab["lm_head.weight"] = Src(("lm_head.weight",), _unit_rows, "each row scaled to unit length (NormHead)")
    return tab


FAMILY = Family(stores=("attention", "ffn", "residual"), name="baichuan", model_types=DECL.model_types,
                to_config=lambda hf: _reader.to_config(DECL, hf), table=table, ignored=lambda hf: DECL.ignored,
                runs=runs,
                oracle="transformers 5.23's llama: logits (fp32, bf16), prefill-then-step, cache bytes and parameters "
                       "of its tiny model saved under Baichuan's names (W_pack packed; a unit-row head); the 13B "
                       "models' ALiBi: accounting only")
