"""Sinkhorn-Knopp projection onto doubly stochastic matrices (Sinkhorn and Knopp, 1967),
as used by Manifold-Constrained Hyper-Connections (Xie et al., arXiv 2512.24880).

``sinkhorn(logits, iters, eps)`` takes square ``[..., n, n]`` logits and returns a
non-negative matrix whose columns sum to 1 (up to ``eps``) and whose rows sum to 1
approximately, closer with every round. The schedule is DeepSeek-V4's:

    M = softmax(logits, over the last axis) + eps     # round 1's row step
    M = M / (column sums + eps)                        # round 1's column step
    repeat iters - 1 times:
        M = M / (row sums + eps)
        M = M / (column sums + eps)

so ``iters`` counts row/column rounds, the softmax standing in for the first row
normalisation. Rows index the last-but-one axis, columns the last axis: a "row sum"
is ``M.sum(-1)``, a "column sum" ``M.sum(-2)``. The last step normalises columns,
so after any number of rounds the columns are exact and the rows approximate.
"""

from __future__ import annotations

import torch
from torch import Tensor

from storelab.ops.precision import at_least_fp32

__all__ = ["sinkhorn"]


def sinkhorn(logits: Tensor, iters: int, eps: float = 1e-6) -> Tensor:
    """Doubly stochastic ``[..., n, n]`` matrix from ``logits`` in ``iters`` rounds (computed in fp32)."""
    if iters < 1:
        raise ValueError(f"iters: must be >= 1, got {iters}")
    if logits.dim() < 2 or logits.shape[-1] != logits.shape[-2]:
        raise ValueError(f"logits: expected shape [..., n, n], got {list(logits.shape)}")
    m = torch.softmax(at_least_fp32(logits), dim=-1) + eps
    m = m / (m.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        m = m / (m.sum(dim=-1, keepdim=True) + eps)
        m = m / (m.sum(dim=-2, keepdim=True) + eps)
    return m
