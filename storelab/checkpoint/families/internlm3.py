"""InternLM 3 (Shanghai AI Laboratory, 2025; ``internlm3``) and IQuest-Coder (``iquestcoder``): Llama decoders
written under their own names, with ``attention_bias`` on all four attention projections and ``mlp_bias`` on
the MLP's three (InternLM 3's ``qkv_bias`` / ``bias``), both false by default; ``head_dim`` 128 by default.

Parameters per layer: the attention's D*(H + 2G)*K + H*K*D (+ biases), the MLP's 3*D*I (+ 2I + D biases), two
d_model norms; the state is the keys and values. Names: transformers' usual ones.
"""

from __future__ import annotations

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._common import layer_prefix, mlp_bias_entries, with_mlp_biases
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Decl, text_fields

__all__ = ["FAMILY"]

DECL = Decl(name="internlm3", model_types=("internlm3", "iquestcoder"), title="InternLM 3 (checkpoint)", eps=1e-6)


def _defaults(hf: dict) -> dict:
    """``head_dim`` 128 when the file names none (``InternLM3Config``, ``IQuestCoderConfig``)."""
    return hf if "head_dim" in hf else dict(hf, head_dim=128)


def to_config(hf: dict):
    cfg = _reader.to_config(DECL, _defaults(hf))
    return with_mlp_biases(cfg) if text_fields(hf).bool("mlp_bias", "bias", default=False) else cfg


def table(hf: dict, cfg, names: set[str]) -> dict:
    tab = _reader.table(DECL, _defaults(hf), cfg, names)
    mlp_bias_entries(tab, cfg, prefix=layer_prefix(names)[0])
    return tab


FAMILY = Family(stores=("attention", "ffn", "residual"),
                name="internlm3", model_types=DECL.model_types, to_config=to_config, table=table,
                ignored=lambda hf: DECL.ignored, runs=lambda hf: _reader.runs(DECL, hf))
