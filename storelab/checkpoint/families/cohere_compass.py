"""Cohere Compass's text model (Cohere, 2026; ``cohere_compass_text``, the decoder of the North vision models):
Command R7B's parallel block (``cohere2.py``) with a rotation per layer type of the usual (half-split) kind
(transformers 5.23's ``CohereCompassForCausalLM``).

* one bias-free LayerNorm per layer read by the attention and the MLP in parallel, x + attn(n(x)) + mlp(n(x))
  (``LayerConfig.norms = "parallel"``, ``ModelConfig.norm_kind = "layer"``), eps ``layer_norm_eps`` (1e-5);
* attention: GQA, head size hidden / heads (``CohereCompassTextConfig`` sets ``head_dim`` so), biases with
  ``attention_bias``; ``layer_types`` (default: every layer global) put a window of ``sliding_window`` (counting the
  query itself) on the local layers; each layer type rotates as ``rope_parameters[type]`` says, channel i with
  i + K/2 (Qwen3's rotation, not Command R's interleaved pairs), or not at all where that entry is null (NoPE);
  the multimodal rotation's ``mrope_section`` splits the frequencies among three position axes that a text token
  gives one position, so for text it is plain RoPE;
* a SwiGLU MLP; the logits times ``logit_scale`` (none, 1, by default); tied embeddings by default.

Parameters per layer: the attention's D*(H + 2G)*K + H*K*D, the MLP's 3*D*I, one d_model norm; the state is the
keys and values (W of them on a local layer). Names: transformers' ``CohereCompassForCausalLM``
(``model.layers.i.input_layernorm``, ``self_attn.*``, ``mlp.*``), as Command R7B's.
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families.cohere import parallel_config, parallel_table
from storelab.checkpoint.families._reader import FULL, Decl, Fields, _attention

__all__ = ["FAMILY"]


def compass_attention(t: Fields, i: int, kind: str, decl: Decl, D: int, eps: float):
    """The reader's attention with Cohere's head size; no positions on a layer type whose rotation is null."""
    a = _attention(t, i, kind, decl, D, eps)
    a = dataclasses.replace(a, head_dim=D // a.n_heads)
    rp = t.sub("rope_parameters", default={})
    if kind in rp.d and rp.d[kind] is None:
        a = dataclasses.replace(a, partial_rotary=0.0, rope_scaling=None)
    return a


DECL = Decl(name="cohere_compass", model_types=("cohere_compass_text",), title="Cohere Compass text (checkpoint)",
            eps=1e-5, tied=True, token=compass_attention, stores=("attention", "window", "ffn", "residual"),
            types=lambda t, n: _reader.layer_types(t, n) if t.has("layer_types") else [FULL] * n)


def to_config(hf: dict):
    return parallel_config(DECL, hf, logit_scale=1.0)


def table(hf: dict, cfg, names: set[str]) -> dict:
    return parallel_table(DECL, hf, cfg, names)


FAMILY = Family(stores=DECL.stores, name=DECL.name, model_types=DECL.model_types, to_config=to_config, table=table,
                ignored=lambda hf: DECL.ignored, runs=lambda hf: _reader.runs(DECL, hf))
