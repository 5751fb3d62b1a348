"""GLM-4 dense (Zhipu AI / THUDM, arXiv 2406.12793; ``glm``: GLM-4-9B's hf files; ``glm4``: GLM-4-0414): a
GQA decoder that rotates half of each head, biases on the query, key and value projections, a fused SwiGLU
MLP; GLM-4-0414 adds a second RMSNorm after each mixer.

* RoPE on the first ``partial_rotary_factor`` (0.5) of each head's channels, on interleaved pairs
  (2i, 2i + 1) within them (``rope_interleaved``); the rest pass unrotated;
* ``attention_bias`` (true by default) on q, k and v; none on the output projection;
* the MLP's ``gate_up_proj`` holds the gate's rows then the up projection's (split in the table);
* ``glm``: pre norms (``input_layernorm``, ``post_attention_layernorm``); ``glm4``: sandwich norms
  (``LayerConfig.norms = "sandwich"``, x + norm2(f(norm1(x)))) with ``post_self_attn_layernorm`` and
  ``post_mlp_layernorm`` after the attention and the MLP, their weights used as stored (not 1 + w);
* ``rms_norm_eps`` 1.5625e-07 by default; untied embeddings.

Parameters per layer: the attention's D*(H + 2G)*K + H*K*D + (H + 2G)*K biases, the MLP's 3*D*I, two
d_model norms (four in ``glm4``); the state is the keys and values.

Names (transformers' ``GlmForCausalLM`` / ``Glm4ForCausalLM``; ``a`` = ``model.layers.i``): the usual
``a.self_attn.{q,k,v,o}_proj``, ``a.mlp.gate_up_proj`` -> ``blocks.i.channel.gate_proj`` / ``up_proj``,
``a.mlp.down_proj``; ``a.post_self_attn_layernorm`` -> ``blocks.i.post_norm_token``,
``a.post_mlp_layernorm`` -> ``blocks.i.post_norm_channel`` (``glm4``).
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._common import layer_prefix
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Decl, Fields, _attention
from storelab.checkpoint.table import copy

__all__ = ["FAMILY"]


def glm_attention(t: Fields, i: int, kind: str, decl: Decl, D: int, eps: float):
    """The shared reader's attention with GLM's interleaved half rotation and q/k/v biases by default."""
    return dataclasses.replace(_attention(t, i, kind, decl, D, eps), rope_interleaved=True,
                               qkv_bias=t.bool("attention_bias", default=True), out_bias=False)


DECL = Decl(name="glm", model_types=("glm", "glm4"), title="GLM-4 dense (checkpoint)", partial=0.5, eps=1.5625e-07,
            token=glm_attention)


def _sandwich(hf: dict) -> bool:
    return Fields(hf).str("model_type") == "glm4"


def to_config(hf: dict):
    cfg = _reader.to_config(DECL, hf)
    if not _sandwich(hf):
        return cfg
    return dataclasses.replace(cfg, name="glm4",
                               layers=[dataclasses.replace(lay, norms="sandwich") for lay in cfg.layers])


def table(hf: dict, cfg, names: set[str]) -> dict:
    """The reader's names; ``glm4``'s norms after each mixer."""
    tab = _reader.table(DECL, hf, cfg, names)
    if _sandwich(hf):
        pre = layer_prefix(names)[0]
        for i in range(cfg.n_layers):
            tab[f"blocks.{i}.post_norm_token.weight"] = copy(f"{pre}layers.{i}.post_self_attn_layernorm.weight")
            tab[f"blocks.{i}.post_norm_channel.weight"] = copy(f"{pre}layers.{i}.post_mlp_layernorm.weight")
    return tab


FAMILY = Family(stores=("attention", "ffn", "residual"),
                name="glm", model_types=DECL.model_types, to_config=to_config, table=table,
                ignored=lambda hf: DECL.ignored, runs=lambda hf: _reader.runs(DECL, hf))
