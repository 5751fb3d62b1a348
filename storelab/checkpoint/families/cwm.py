"""Code World Model (Meta FAIR, 2025; ``cwm``): Llama 3's decoder with sliding-window layers.

* attention: GQA, ``head_dim`` 128 by default, no biases (``attention_bias`` is not a field of ``CwmConfig``);
  ``layer_types``, else layers 0, 4, 8, ... full and the rest within ``sliding_window`` (8192; transformers'
  window counts the query itself: our ``window`` is one less);
* rope: ``rope_parameters``, else transformers' default, Llama 3's scaling (base 1,000,000, factor 16, low / high
  frequency factors 1 / 4, 8192 pretraining tokens);
* a SwiGLU MLP (``mlp_bias``), pre-norm RMSNorms (eps 1e-5), untied embeddings.

Parameters per layer: the attention's D*(H + 2G)*K + H*K*D, the MLP's 3*D*I, two norms; the state is the keys and
values (a window's W on sliding layers). Names: transformers' usual ones.
"""

from __future__ import annotations

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._common import layer_prefix, mlp_bias_entries, with_mlp_biases
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import FULL, SLIDING, Decl, text_fields

__all__ = ["FAMILY"]

DECL = Decl(name="cwm", model_types=("cwm",), title="Code World Model (checkpoint)", qkv_bias=False, o_bias=False,
            eps=1e-5, theta=1_000_000.0, stores=("attention", "window", "ffn", "residual"))
LLAMA3 = dict(rope_type="llama3", rope_theta=1_000_000.0, factor=16.0, high_freq_factor=4.0, low_freq_factor=1.0,
              original_max_position_embeddings=8192)


def _defaults(hf: dict) -> dict:
    """``CwmConfig``'s defaults where the file is silent."""
    t = text_fields(hf)
    out = dict(hf, head_dim=hf.get("head_dim") or 128)
    out.setdefault("sliding_window", 8192)
    if "rope_parameters" not in hf and "rope_scaling" not in hf and "rope_theta" not in hf:
        out["rope_parameters"] = LLAMA3
    if "layer_types" not in hf:
        out["layer_types"] = [FULL if i % 4 == 0 else SLIDING for i in range(t.int("num_hidden_layers", minimum=1))]
    return out


def to_config(hf: dict):
    cfg = _reader.to_config(DECL, _defaults(hf))
    return with_mlp_biases(cfg) if text_fields(hf).bool("mlp_bias", default=False) else cfg


def table(hf: dict, cfg, names: set[str]) -> dict:
    tab = _reader.table(DECL, _defaults(hf), cfg, names)
    mlp_bias_entries(tab, cfg, prefix=layer_prefix(names)[0])
    return tab


FAMILY = Family(stores=DECL.stores, name=DECL.name, model_types=DECL.model_types, to_config=to_config, table=table,
                ignored=lambda hf: DECL.ignored, runs=lambda hf: _reader.runs(DECL, _defaults(hf)))
