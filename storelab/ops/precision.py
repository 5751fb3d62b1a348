"""The compute dtype of the numerically delicate steps (softmaxes, norms, rotations, accumulations).

They run in at least fp32: bf16 / fp16 inputs are widened to fp32, fp32 stays, and fp64 stays
fp64, so a float64 model is float64 throughout (``torch.autograd.gradcheck`` needs it).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["at_least_fp32", "compute_dtype"]


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """fp32 for narrower floats, the dtype itself for fp32 and fp64."""
    return torch.promote_types(dtype, torch.float32)


def at_least_fp32(x: Tensor) -> Tensor:
    """x widened to ``compute_dtype`` (no copy when it already is)."""
    return x.to(compute_dtype(x.dtype))
