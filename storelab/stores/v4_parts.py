"""What every DeepSeek-V4 attention layer shares (CSA, HCA and the window-only layer, arXiv 2606.19348): the
checks of its widths, its projections and the rotation of its heads' trailing channels.

* ``check_v4_fields(cfg)``: rope_dim even and within head_dim, o_groups dividing the heads' output, a known
  cache format (fp4 packs two codes a byte: an even no-rope width);
* ``add_v4_projections(module, cfg)``: the query's low rank (``q_a``, ``q_a_norm``, ``q_b``), the one shared
  key/value head (``kv_proj``, ``kv_norm``), the grouped low-rank output (``o_a`` [g, r, H C / g], ``o_b``),
  a sink logit per head, and the entry format, under the names the V4 tables map;
* ``v4_rope(x_BTHC, pos_T, rope_dim=, theta=)``: interleaved RoPE on the trailing ``rope_dim`` channels
  (V4 lays a head out [nope | rope]); a negative position undoes it.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from storelab.ops.norm import RMSNorm
from storelab.ops.quant import FORMATS
from storelab.ops.rope import apply_rope
from storelab.stores.compressed_cache import entry_format

__all__ = ["check_v4_fields", "add_v4_projections", "v4_rope"]


def check_v4_fields(cfg) -> None:
    cfg.check(0 <= cfg.rope_dim <= cfg.head_dim and cfg.rope_dim % 2 == 0, "rope_dim",
              f"must be even and between 0 and head_dim {cfg.head_dim}, got {cfg.rope_dim}")
    cfg.check((cfg.n_heads * cfg.head_dim) % cfg.o_groups == 0, "o_groups",
              f"must divide n_heads * head_dim = {cfg.n_heads * cfg.head_dim}, got {cfg.o_groups}")
    cfg.check(cfg.cache_format is None or cfg.cache_format in FORMATS, "cache_format",
              f"must be None or one of {FORMATS}, got {cfg.cache_format!r}")
    if cfg.cache_format == "fp4":
        cfg.check((cfg.head_dim - cfg.rope_dim) % 2 == 0, "head_dim",
                  "fp4 packs two codes per byte: head_dim - rope_dim must be even")


def add_v4_projections(module: nn.Module, cfg) -> None:
    D, H, C, Q = cfg.d_model, cfg.n_heads, cfg.head_dim, cfg.q_lora
    module.q_a = nn.Linear(D, Q, bias=False)
    module.q_a_norm = RMSNorm(Q, cfg.eps)
    module.q_b = nn.Linear(Q, H * C, bias=False)
    module.kv_proj = nn.Linear(D, C, bias=False)
    module.kv_norm = RMSNorm(C, cfg.eps)
    per_group = H * C // cfg.o_groups
    module.o_a = nn.Parameter(torch.randn(cfg.o_groups, cfg.o_lora, per_group) * per_group ** -0.5)  # [g, r, H*C/g]
    module.o_b = nn.Linear(cfg.o_groups * cfg.o_lora, D, bias=False)
    module.sinks = nn.Parameter(torch.zeros(H))
    module.fmt = entry_format(cfg.cache_format, cfg.quant_block)   # how entries are stored, once


def v4_rope(x_BTHC: Tensor, pos_T: Tensor, *, rope_dim: int, theta: float) -> Tensor:
    if rope_dim == 0:
        return x_BTHC
    nope = x_BTHC.shape[-1] - rope_dim
    rot = apply_rope(x_BTHC[..., nope:], pos_T, rotary_dim=rope_dim, theta=theta, interleaved=True)
    return torch.cat([x_BTHC[..., :nope], rot], dim=-1)
