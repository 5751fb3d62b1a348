"""MiniCPM (OpenBMB; remote code ``MiniCPMForCausalLM``, ``model_type`` "minicpm": MiniCPM-1B / 2B, MiniCPM4): a Llama
decoder trained with muP (Tensor Programs V, arXiv 2203.03466; MiniCPM, arXiv 2404.06395), its three multipliers
applied in the forward pass:

* ``scale_emb`` s: the embeddings times s -> our ``embed_scale``;
* ``scale_depth`` d: each sublayer's output times d / sqrt(num_hidden_layers) before its residual add,
  x + (d / sqrt(L)) f(x): folded into the rows of every output projection at load (``o_proj``, ``mlp.down_proj``;
  ``Src`` "x scale_depth / sqrt(layers)"), so the loaded tensors are not the file's but the function is;
* ``dim_model_base`` b: the final hidden state divided by hidden_size / b before the LM head -> our
  ``logit_scale`` = b / hidden_size (the head has no bias, so dividing its input divides the logits).

Everything else is Llama's and read by the shared reader: GQA with RoPE (``rope_scaling`` linear / dynamic /
longrope accounted; running needs one storelab implements), a SwiGLU MLP, pre-norm RMSNorms, tied embeddings by
default (MiniCPM-2B ties them). Names are transformers' Llama names (``model.layers.i.self_attn.q_proj`` ...).

Refused by name: MiniCPM-MoE's ``num_experts`` (its experts are not read), MiniCPM4's ``sparse_config`` (InfLLM v2
trainable sparse attention, arXiv 2506.07900: block selection over compressed keys, no store for it),
``use_mup`` false (the multipliers would not apply; no published config to check it against).

Parameters per layer: Llama's D*(H + 2G)*K + H*K*D + 3*D*F + 2D; the state is the keys and values.
"""

from __future__ import annotations

import dataclasses
import math

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Decl, Fields, text_fields
from storelab.checkpoint.table import Src

__all__ = ["FAMILY"]

DECL = Decl(name="minicpm", model_types=("minicpm",), title="MiniCPM (checkpoint)", eps=1e-6, tied=True,
            stores=("attention", "ffn", "residual"))


def _mup(t: Fields) -> tuple[float, float, float]:
    """(scale_emb, scale_depth, dim_model_base), refusing the fields no store reads."""
    for key, why in (("num_experts", "MiniCPM-MoE's experts are not read yet"),
                     ("sparse_config", "InfLLM v2 sparse attention (arXiv 2506.07900) has no store")):
        if t.has(key) and t.d[key] not in (0, 1, {}):
            raise t._err(key, f"{t.d[key]!r}: {why}")
    if not t.bool("use_mup", default=True):
        raise t._err("use_mup", "false is not supported (the muP multipliers are always applied here)")
    return (t.float("scale_emb", default=1.0, positive=True), t.float("scale_depth", default=1.0, positive=True),
            t.float("dim_model_base", default=float(t.int("hidden_size", minimum=1)), positive=True))


def to_config(hf: dict):
    t = text_fields(hf)
    emb, _, base = _mup(t)
    cfg = _reader.to_config(DECL, hf)
    return dataclasses.replace(cfg, embed_scale=emb, logit_scale=base / cfg.d_model)


def _times(src: Src, m: float) -> Src:
    return Src(src.names, lambda w: src.make(w) * m, f"x scale_depth / sqrt(layers) = {m:g}")


def table(hf: dict, cfg, names: set[str]) -> dict:
    t = text_fields(hf)
    m = _mup(t)[1] / math.sqrt(len(cfg.layers))
    tab = _reader.table(DECL, hf, cfg, names)
    for i in range(len(cfg.layers)):
        for ours in (f"blocks.{i}.token.o_proj.weight", f"blocks.{i}.channel.down_proj.weight"):
            tab[ours] = _times(tab[ours], m)
    return tab


FAMILY = Family(name=DECL.name, model_types=DECL.model_types, to_config=to_config, table=table,
                ignored=lambda hf: DECL.ignored, runs=lambda hf: _reader.runs(DECL, hf), stores=DECL.stores,
                oracle="transformers 5.23's granite with MiniCPM's multipliers (embedding, residual, logits) saved under "
                       "MiniCPM's fields: logits (fp32, bf16), prefill-then-step, cache bytes, parameters; MiniCPM-2B "
                       "counted by hand")
