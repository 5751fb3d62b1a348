"""Phi-3 (Microsoft, arXiv 2404.14219; ``phi3``; Phi-4-mini reads the same): a Llama decoder whose query, key
and value projections are one matrix (``qkv_proj``: H*K query rows, then G*K key rows, then G*K value
rows) and whose MLP's gate and up projections are one (``gate_up_proj``: the gate's rows first), split in
the table; RoPE on the first ``partial_rotary_factor`` of each head (1.0 in Phi-3, 0.75 in Phi-4-mini);
``sliding_window`` (Phi-3-mini: 2047, counting the query itself) windows every layer. ``longrope``
scaling (the 128k releases) is read for accounting and refused for running by the shared reader.

Parameters per layer: D*(H + 2G)*K + H*K*D + 3*D*I and two d_model norms; the state is the keys and values
(W of them per layer with a window).
"""

from __future__ import annotations

from storelab.checkpoint.families._common import layer_prefix
from storelab.checkpoint.families._reader import Decl, family
from storelab.checkpoint.table import rows


def fused_qkv(tab: dict, hf: dict, cfg, names: set[str]) -> None:
    """Our q/k/v projections as row blocks of ``self_attn.qkv_proj``."""
    pre = layer_prefix(names)[0]
    for i, lay in enumerate(cfg.layers):
        a, o = f"{pre}layers.{i}.self_attn.qkv_proj.weight", f"blocks.{i}.token"
        q, kv = lay.token.n_heads * lay.token.head_dim, lay.token.n_kv_heads * lay.token.head_dim
        tab[f"{o}.q_proj.weight"] = rows(a, 0, q)
        tab[f"{o}.k_proj.weight"] = rows(a, q, q + kv)
        tab[f"{o}.v_proj.weight"] = rows(a, q + kv, q + 2 * kv)


FAMILY = family(Decl(stores=("attention", "window", "ffn", "residual"),
                     name="phi3", model_types=("phi3",), title="Phi-3 (checkpoint)", eps=1e-5, qkv_bias=False,
                     o_bias=False, extra=fused_qkv))
