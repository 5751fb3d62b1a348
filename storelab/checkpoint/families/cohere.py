"""Command R / R+ (Cohere, 2024; ``cohere``): Command R7B's parallel block without its windows, every layer
rotating.

* one bias-free LayerNorm per layer read by the attention and the MLP in parallel, x + attn(n(x)) + mlp(n(x))
  (``LayerConfig.norms = "parallel"``, ``ModelConfig.norm_kind = "layer"``; ``CohereLayerNorm``), eps
  ``layer_norm_eps`` (1e-5);
* full attention on every layer with RoPE on interleaved pairs of channels (2i, 2i + 1) (``rope_interleaved``;
  transformers repeats each frequency twice), head size hidden / heads; ``attention_bias`` on all four
  projections;
* a SwiGLU MLP; the logits times ``logit_scale`` (0.0625 by default); tied embeddings by default.

``use_qk_norm`` (Command R+: a LayerNorm over each query and key head, one weight per head and channel) has no
norm of that shape in storelab's attention and is refused, naming the field.

Parameters per layer: the attention's D*(H + 2G)*K + H*K*D, the MLP's 3*D*I, one d_model norm; the state is the
keys and values. Names: transformers' ``CohereForCausalLM`` (``model.layers.i.input_layernorm``, ``self_attn.*``,
``mlp.*``), as Command R7B's (``cohere2.py``).
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Decl, Fields, _attention, text_fields

__all__ = ["FAMILY"]


def cohere_attention(t: Fields, i: int, kind: str, decl: Decl, D: int, eps: float):
    if t.bool("use_qk_norm", default=False):
        raise t._err("use_qk_norm", "true is not supported (a LayerNorm per query/key head with a weight per head "
                                    "and channel: storelab's attention has no such norm yet)")
    a = _attention(t, i, kind, decl, D, eps)
    return dataclasses.replace(a, head_dim=D // a.n_heads, rope_interleaved=True)


DECL = Decl(name="cohere", model_types=("cohere",), title="Command R (checkpoint)", eps=1e-5, tied=True,
            token=cohere_attention, types=lambda t, n: [_reader.FULL] * n)


def parallel_config(decl: Decl, hf: dict, *, logit_scale: float):
    """Cohere's layout for any of its families: one LayerNorm (no bias) per layer read by the attention and the MLP
    side by side (``norms = "parallel"``), the logits times ``logit_scale`` (the file's, else the family's)."""
    t = text_fields(hf)
    scale = t.float("logit_scale", default=logit_scale)
    if not scale > 0:
        raise t._err("logit_scale", f"must be > 0, got {scale!r}")
    cfg = _reader.to_config(decl, hf)
    layers = [dataclasses.replace(lay, norms="parallel") for lay in cfg.layers]
    return dataclasses.replace(cfg, layers=layers, norm_kind="layer", logit_scale=scale)


def parallel_table(decl: Decl, hf: dict, cfg, names: set[str]) -> dict:
    """The reader's names, without a second norm per layer (the one norm is ``input_layernorm``)."""
    tab = _reader.table(decl, hf, cfg, names)
    for i in range(cfg.n_layers):
        del tab[f"blocks.{i}.norm_channel.weight"]
    return tab


def to_config(hf: dict):
    return parallel_config(DECL, hf, logit_scale=0.0625)


def table(hf: dict, cfg, names: set[str]) -> dict:
    return parallel_table(DECL, hf, cfg, names)


FAMILY = Family(stores=("attention", "ffn", "residual"),
                name="cohere", model_types=DECL.model_types, to_config=to_config, table=table,
                ignored=lambda hf: DECL.ignored, runs=lambda hf: _reader.runs(DECL, hf))
