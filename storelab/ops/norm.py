"""RMSNorm (Zhang and Sennrich, arXiv 1910.07467), a LayerNorm without bias (Ba et al., arXiv 1607.06450;
Cohere's) and L2 normalisation."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from storelab.ops.precision import at_least_fp32

__all__ = ["rms_norm", "layer_norm", "l2_norm", "RMSNorm", "LayerNorm"]


def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """x / rms(x) * weight, computed in at least fp32 and cast back."""
    dt = x.dtype
    xf = at_least_fp32(x)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * at_least_fp32(weight)
    return y.to(dt)


def layer_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-5, bias: Tensor | None = None) -> Tensor:
    """(x - mean(x)) / sqrt(var(x) + eps) * weight (+ bias: GPT-NeoX, StarCoder2; Cohere's has none); at least
    fp32, cast back."""
    dt = x.dtype
    xf = at_least_fp32(x)
    xc = xf - xf.mean(-1, keepdim=True)
    y = xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * at_least_fp32(weight)
    if bias is not None:
        y = y + at_least_fp32(bias)
    return y.to(dt)


def l2_norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    """x / sqrt(sum x^2 + eps) along the last axis (the convention of fla and transformers)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)


class LayerNorm(nn.Module):
    """A LayerNorm with a weight and, with ``bias``, a bias: D parameters (as an RMSNorm), or 2D."""

    def __init__(self, dim: int, eps: float = 1e-5, bias: bool = False):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.bias = nn.Parameter(torch.zeros(dim)) if bias else None
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return layer_norm(x, self.weight, self.eps, self.bias)
