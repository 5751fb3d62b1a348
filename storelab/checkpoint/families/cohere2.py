"""Cohere's Command R7B and Command A (``cohere2``; Command A report, arXiv 2504.00698): a parallel block
(the attention and the MLP read one LayerNorm of the stream, both outputs added to it), local layers
that rotate and global layers that do not, a scaled LM head.

* one norm per layer, read by both mixers: x + attn(n(x)) + mlp(n(x)) (``LayerConfig.norms =
  "parallel"``); n and the final norm are LayerNorms with a weight and no bias, (x - mean) /
  sqrt(var + eps) * w (``ModelConfig.norm_kind = "layer"``; ``CohereLayerNorm``), eps
  ``layer_norm_eps`` (1e-5);
* local layers: a sliding window (``sliding_window``, which counts the query itself, so our
  ``window`` is one less) with RoPE on interleaved pairs of channels (2i, 2i + 1)
  (``rope_interleaved``); global layers: full attention with no positions (NoPE); ``layer_types``,
  else every ``sliding_window_pattern``-th layer global (transformers' default 4: three local to one
  global);
* the head size is ``hidden_size / num_attention_heads`` whatever ``head_dim`` says
  (``Cohere2Config`` sets it so);
* a SwiGLU MLP; the logits times ``logit_scale`` (0.0625 by default); tied embeddings by default.

Parameters per layer: the attention's D*(H + 2G)*K + H*K*D (biases with ``attention_bias``), the MLP's
3*D*I, one d_model norm; the state is the keys and values (W of them on a local layer).

Names (transformers' ``Cohere2ForCausalLM``; ``a`` = ``model.layers.i``):

| ours                                 | transformers               |
|--------------------------------------|----------------------------|
| blocks.i.norm_token                  | a.input_layernorm          |
| blocks.i.token.{q,k,v,o}_proj        | a.self_attn.{q,k,v,o}_proj |
| blocks.i.channel.{gate,up,down}_proj | a.mlp.{gate,up,down}_proj  |
| norm.weight                          | model.norm.weight          |
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families.cohere import parallel_config, parallel_table
from storelab.checkpoint.families._reader import FULL, Decl, Fields, _attention

__all__ = ["FAMILY"]


def cohere_attention(t: Fields, i: int, kind: str, decl: Decl, D: int, eps: float):
    """The shared reader's attention with Cohere's head size and interleaved rotation; no positions
    on a global layer."""
    a = _attention(t, i, kind, decl, D, eps)
    a = dataclasses.replace(a, head_dim=D // a.n_heads, rope_interleaved=True)
    if kind == FULL:
        a = dataclasses.replace(a, partial_rotary=0.0, rope_scaling=None)
    return a


DECL = Decl(name="cohere2", model_types=("cohere2",), title="Command R7B / A (checkpoint)", eps=1e-5, every=4,
            tied=True, token=cohere_attention)


def to_config(hf: dict):
    return parallel_config(DECL, hf, logit_scale=0.0625)


def table(hf: dict, cfg, names: set[str]) -> dict:
    return parallel_table(DECL, hf, cfg, names)


FAMILY = Family(stores=("attention", "window", "ffn", "residual"),
                name="cohere2", model_types=DECL.model_types, to_config=to_config, table=table,
                ignored=lambda hf: DECL.ignored, runs=lambda hf: _reader.runs(DECL, hf))
