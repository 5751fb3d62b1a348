"""Ministral 3 (Mistral AI, 2025; ``ministral3``, and the text model of the ``mistral3`` image-text wrapper): Mistral's
decoder (GQA, RoPE with YaRN, a SwiGLU MLP, a window on every layer with ``sliding_window``) whose queries are
scaled per position, as Llama 4's NoPE layers (after Scalable-Softmax, arXiv 2501.19399), on every layer:

    q_p <- q_p (1 + beta log(1 + floor(p / original_max_position_embeddings)))

with beta ``rope_parameters.llama_4_scaling_beta`` (our ``attn_temperature_tuning`` with ``floor_scale`` the
pretraining length, ``attn_temperature_scale`` beta and ``floor_offset`` 0: Ministral counts p, Llama 4 p + 1).
A config without ``rope_parameters`` takes ``Ministral3Config``'s: YaRN x16 from 16,384 tokens, theta 1e6,
beta 0.1.

Parameters per layer: the attention's D*(H + 2G)*K + H*K*D, the MLP's 3*D*I, two d_model norms; the state is
the keys and values. Names: transformers' usual ones (``model.language_model.*`` in the wrapper, whose vision
tower and projector are left out).
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Decl, Fields, _attention

__all__ = ["FAMILY"]

DEFAULT_ROPE = {"rope_type": "yarn", "rope_theta": 1000000.0, "factor": 16.0, "original_max_position_embeddings": 16384,
                "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0, "llama_4_scaling_beta": 0.1}


def ministral3_attention(t: Fields, i: int, kind: str, decl: Decl, D: int, eps: float):
    """The shared reader's attention, queries scaled by the position's temperature when beta > 0."""
    a = _attention(t, i, kind, decl, D, eps)
    rp = t.sub("rope_parameters", "rope_scaling", default={})
    beta = rp.float("llama_4_scaling_beta", default=0.0, minimum=0.0)
    if not beta:
        return a
    floor = rp.int("original_max_position_embeddings", minimum=1)
    return dataclasses.replace(a, attn_temperature_tuning=True, floor_scale=floor, attn_temperature_scale=beta,
                               floor_offset=0)


DECL = Decl(name="ministral3", model_types=("ministral3", "mistral3"), title="Ministral 3 (checkpoint)", eps=1e-5,
            token=ministral3_attention)


def _with_default_rope(hf: dict) -> dict:
    """``Ministral3Config``'s rope when the file gives none."""
    t = _reader.text_fields(hf)
    if t.has("rope_parameters", "rope_scaling") or t.str("model_type", default="ministral3") != "ministral3":
        return hf
    text = dict(t.d, rope_parameters=dict(DEFAULT_ROPE))
    return dict(hf, text_config=text) if t.d is not hf else text


def to_config(hf: dict):
    return _reader.to_config(DECL, _with_default_rope(hf))


FAMILY = Family(stores=("attention", "window", "ffn", "residual"),
                name="ministral3", model_types=DECL.model_types, to_config=to_config,
                table=lambda hf, cfg, names: _reader.table(DECL, hf, cfg, names),
                ignored=lambda hf: DECL.ignored, runs=lambda hf: _reader.runs(DECL, _with_default_rope(hf)))
