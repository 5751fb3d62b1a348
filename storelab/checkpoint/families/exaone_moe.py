"""K-EXAONE (LG AI Research, 2025; ``exaone_moe``): EXAONE 4.0's attention in a pre-norm block with DeepSeek-V3's
experts.

* attention (``Exaone4Attention``): GQA with per-head q/k RMSNorms; ``layer_types`` (else every
  ``sliding_window_pattern``-th layer, 4, global and the rest within ``sliding_window``, 4096; transformers'
  defaults when the file names neither); with a window, the global layers use no positions (exaone4.py's
  ``exaone_attention``);
* channel per ``mlp_layer_types`` (else the first ``first_k_dense_replace``, 1, dense): a SwiGLU MLP of
  ``intermediate_size``, or ``num_experts`` experts of ``moe_intermediate_size`` chosen by sigmoid scores plus the
  routing bias among ``topk_group`` of ``n_group`` groups, renormalised (``norm_topk_prob``) and times
  ``routed_scaling_factor`` (2.5), beside one shared MLP of ``num_shared_experts`` x ``moe_intermediate_size``;
* pre-norms (``OlmoeDecoderLayer``: ``input_layernorm``, ``post_attention_layernorm`` before the MLP), unlike
  EXAONE 4.0's post-norms; untied embeddings; the MTP module (``mtp.*``) is ignored.

Parameters per layer: the attention's D*(H + 2G)*K + H*K*D + 2K, the MLP's 3*D*I or the experts' E*3*D*I + E*D
router + E bias + the shared 3*D*S; the state is the keys and values (a window's last W on local layers).
Names: transformers' usual ones.
"""

from __future__ import annotations

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Decl
from storelab.checkpoint.families.exaone4 import exaone_attention

__all__ = ["FAMILY"]

DECL = Decl(name="exaone_moe", model_types=("exaone_moe",), title="K-EXAONE (checkpoint)", qk_norm=True, eps=1e-5,
            router="sigmoid", router_bias=True, every=4, token=exaone_attention,
            ignored=Decl.ignored + (r"^mtp\.",), stores=("attention", "window", "ffn", "moe", "residual"))


def _defaults(hf: dict) -> dict:
    """``ExaoneMoeConfig``'s defaults where the file is silent: a 4096-token window on three layers of four, the
    first layer dense."""
    t = _reader.text_fields(hf)
    out = dict(hf)
    if "sliding_window" not in hf:
        out["sliding_window"] = 4096
    if "layer_types" not in hf and out["sliding_window"] is not None:
        pattern = t.int("sliding_window_pattern", default=4, minimum=1)
        out["layer_types"] = [_reader.FULL if (i + 1) % pattern == 0 else _reader.SLIDING
                              for i in range(t.int("num_hidden_layers", minimum=1))]
    if "mlp_layer_types" not in hf:
        first = t.int("first_k_dense_replace", default=1)
        out["mlp_layer_types"] = ["dense" if i < first else "sparse" for i in range(t.int("num_hidden_layers"))]
    return out


FAMILY = Family(stores=DECL.stores, name=DECL.name, model_types=DECL.model_types,
                to_config=lambda hf: _reader.to_config(DECL, _defaults(hf)),
                table=lambda hf, cfg, names: _reader.table(DECL, _defaults(hf), cfg, names),
                ignored=lambda hf: DECL.ignored, runs=lambda hf: _reader.runs(DECL, _defaults(hf)))
