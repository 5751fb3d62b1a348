"""Rotary position embedding (Su et al., arXiv 2104.09864) on a fraction of the head.

``apply_rope(x_BTHD, positions_T, rotary_dim=..., theta=...)`` rotates the first
``rotary_dim`` channels of each head by angles ``pos * theta^(-2i/rotary_dim)`` and
leaves the rest unchanged (partial rotary, as in Qwen3-Next and MiMo). The pairing
is "rotate half" (channel i with i + rotary_dim/2) unless ``interleaved`` (channel
2i with 2i+1, DeepSeek's original layout).
"""

from __future__ import annotations

import torch
from torch import Tensor

from storelab.ops.precision import at_least_fp32

__all__ = ["rope_angles", "apply_rope"]


def rope_angles(positions: Tensor, rotary_dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """cos and sin of shape [T, rotary_dim/2] for integer positions [T]."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=positions.device) / rotary_dim))
    ang = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    return ang.cos(), ang.sin()


def apply_rope(x_BTHD: Tensor, positions_T: Tensor, *, rotary_dim: int, theta: float, interleaved: bool = False) -> Tensor:
    if rotary_dim == 0:
        return x_BTHD
    if rotary_dim % 2 or rotary_dim > x_BTHD.shape[-1]:
        raise ValueError(f"rotary_dim: must be even and <= head dim {x_BTHD.shape[-1]}, got {rotary_dim}")
    cos, sin = rope_angles(positions_T, rotary_dim, theta)  # [T, R/2]
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    # split, not two slices: its backward is one cat, where each slice's fills a zero tensor of x's size
    rot, rest = x_BTHD.split([rotary_dim, x_BTHD.shape[-1] - rotary_dim], dim=-1)
    dt = x_BTHD.dtype
    rot = at_least_fp32(rot)
    if interleaved:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
        y = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
    else:
        half = rotary_dim // 2
        x1, x2 = rot.split([half, half], dim=-1)
        y = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return torch.cat([y.to(dt), rest], dim=-1)
