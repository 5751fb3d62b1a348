"""EXAONE 4.0 (LG AI Research, arXiv 2507.11407; ``exaone4``): a GQA decoder with post norms, per-head
q/k RMSNorms and, in the 32B model, a hybrid of local and global attention.

* post norms (``LayerConfig.norms = "post"``): x + norm(f(x)) around the attention and the MLP
  (``post_attention_layernorm``, ``post_feedforward_layernorm``), no norm before either;
* an RMSNorm on each query and key head (K wide, shared by the heads), before RoPE;
* local layers: a sliding window (``sliding_window``, which counts the query itself, so our
  ``window`` is one less) where ``layer_types`` says "sliding_attention", or, without them, every
  ``sliding_window_pattern``-th layer global and the rest local (transformers' default pattern 4);
  ``sliding_window: null`` makes every layer global (EXAONE 4.0 1.2B);
* positions: with a window in the file, only the local layers rotate and the global ones use none
  (NoPE, ``partial_rotary = 0``: ``Exaone4Attention`` applies RoPE when ``sliding_window`` is null or
  the layer is local); without one, every layer rotates. ``rope_scaling`` (llama3 in the published
  files) applies wherever RoPE does;
* a SwiGLU MLP, no biases; ``tie_word_embeddings`` as the file says (1.2B tied, 32B not).

Parameters per layer: the attention's D*(H + 2G)*K + H*K*D and its two K-wide norms, the MLP's 3*D*I,
two d_model norms; the state is the keys and values (W of them on a local layer).

Names (transformers' ``Exaone4ForCausalLM``; ``a`` = ``model.layers.i``): those of OLMo 2
(``olmo2.py``): ``a.post_attention_layernorm`` -> ``blocks.i.norm_token``,
``a.post_feedforward_layernorm`` -> ``blocks.i.norm_channel``, ``a.self_attn.{q,k,v,o}_proj`` and
``q_norm`` / ``k_norm``, ``a.mlp.{gate,up,down}_proj``, ``model.norm``.
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._common import layer_prefix, post_norm_entries
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import FULL, Decl, Fields, _attention

__all__ = ["FAMILY"]


def exaone_attention(t: Fields, i: int, kind: str, decl: Decl, D: int, eps: float):
    """The shared reader's attention; a global layer of a model with a window uses no positions."""
    a = _attention(t, i, kind, decl, D, eps)
    if kind == FULL and t.has("sliding_window"):
        a = dataclasses.replace(a, partial_rotary=0.0, rope_scaling=None)
    return a


DECL = Decl(name="exaone4", model_types=("exaone4",), title="EXAONE 4.0 (checkpoint)", qk_norm=True, eps=1e-5,
            every=4, token=exaone_attention)


def to_config(hf: dict):
    cfg = _reader.to_config(DECL, hf)
    return dataclasses.replace(cfg, layers=[dataclasses.replace(lay, norms="post") for lay in cfg.layers])


def table(hf: dict, cfg, names: set[str]) -> dict:
    tab = _reader.table(DECL, hf, cfg, names)
    post_norm_entries(tab, cfg, prefix=layer_prefix(names)[0])
    return tab


FAMILY = Family(stores=("attention", "window", "ffn", "residual"),
                name="exaone4", model_types=DECL.model_types, to_config=to_config, table=table,
                ignored=lambda hf: DECL.ignored, runs=lambda hf: _reader.runs(DECL, hf))
