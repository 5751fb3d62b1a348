"""Rotary position embedding (Su et al., arXiv 2104.09864) on a fraction of the head.

``apply_rope(x_BTHD, positions_T, rotary_dim=..., theta=...)`` rotates the first
``rotary_dim`` channels of each head by angles ``pos * theta^(-2i/rotary_dim)`` and
leaves the rest unchanged (partial rotary, as in Qwen3-Next and MiMo). The pairing
is "rotate half" (channel i with i + rotary_dim/2) unless ``interleaved`` (channel
2i with 2i+1, DeepSeek's original layout).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from storelab.ops.precision import at_least_fp32

__all__ = ["rope_angles", "apply_rope", "rotate", "rope_frequencies", "check_scaling", "SCALINGS"]

# Context-extension rules for the frequencies, by the ``rope_type`` published configs use, with the keys each needs:
# "linear" (position interpolation, arXiv 2306.15595): every frequency / factor;
# "llama3" (Llama 3.1, arXiv 2407.21783): low frequencies / factor, high ones kept, a smooth ramp between;
# "yarn" (arXiv 2309.00071): the NTK-by-parts ramp between interpolation and extrapolation, and cos / sin times an
#   attention factor (0.1 ln(factor) + 1, or DeepSeek's ratio of two mscales);
# "proportional" (Gemma 4's global layers): the whole head is paired as halves and keeps the frequencies
#   theta^(-2i/K) of full RoPE, but only the first int(partial_rotary_factor K / 2) pairs turn; the rest have
#   frequency 0 (cos 1, sin 0: unchanged), all divided by an optional ``factor``.
SCALINGS = {"linear": ("factor",), "llama3": ("factor", "low_freq_factor", "high_freq_factor",
                                              "original_max_position_embeddings"),
            "yarn": ("factor", "original_max_position_embeddings"),
            "proportional": ("partial_rotary_factor",)}


def check_scaling(scaling: dict | None) -> None:
    """A ValueError naming the key when ``scaling`` (a published ``rope_scaling``) is not one we compute."""
    if scaling is None:
        return
    if not isinstance(scaling, dict):
        raise ValueError(f"rope_scaling: must be a table of the published keys, got {scaling!r}")
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return
    if kind not in SCALINGS:
        raise ValueError(f"rope_scaling.rope_type: {kind!r} is not implemented (implemented: default, "
                         f"{', '.join(SCALINGS)})")
    for key in SCALINGS[kind]:
        v = scaling.get(key)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise ValueError(f"rope_scaling.{key}: must be a number > 0 for {kind!r}, got {v!r}")


def _yarn_mscale(scale: float, m: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def rope_frequencies(rotary_dim: int, theta: float, scaling: dict | None = None, *,
                     device=None) -> tuple[Tensor, float]:
    """(inverse frequencies [rotary_dim/2], factor on cos and sin) of plain RoPE or a published scaling."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim))
    kind = "default" if scaling is None else scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv_freq, 1.0
    if kind == "proportional":
        turning = int(float(scaling["partial_rotary_factor"]) * rotary_dim // 2)
        inv_freq[turning:] = 0.0
        return inv_freq / float(scaling.get("factor") or 1.0), 1.0
    factor = float(scaling["factor"])
    if kind == "linear":
        return inv_freq / factor, 1.0
    if kind == "llama3":
        old = scaling["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old / scaling["low_freq_factor"], old / scaling["high_freq_factor"]
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - scaling["low_freq_factor"]) / (scaling["high_freq_factor"] - scaling["low_freq_factor"])
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return torch.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled), 1.0
    # yarn: per pair, a ramp from extrapolation (fast pairs, beta_fast rotations) to interpolation (slow ones)
    old, dim = scaling["original_max_position_embeddings"], rotary_dim
    fast, slow = scaling.get("beta_fast") or 32, scaling.get("beta_slow") or 1

    def correction(rotations: float) -> float:
        return dim * math.log(old / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction(fast), correction(slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    ramp = ((torch.arange(dim // 2, dtype=torch.float32, device=device) - low) / (high - low if high != low else 0.001)
            ).clamp(0, 1)
    extrapolate = 1 - ramp
    inv = inv_freq / factor * (1 - extrapolate) + inv_freq * extrapolate
    att = scaling.get("attention_factor")
    if att is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        att = _yarn_mscale(factor, m) / _yarn_mscale(factor, m_all) if m and m_all else _yarn_mscale(factor)
    return inv, float(att)


def rope_angles(positions: Tensor, rotary_dim: int, theta: float, scaling: dict | None = None
                ) -> tuple[Tensor, Tensor]:
    """cos and sin of shape [T, rotary_dim/2] for integer positions [T] (times yarn's attention factor)."""
    inv_freq, att = rope_frequencies(rotary_dim, theta, scaling, device=positions.device)
    ang = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    if att != 1.0:
        return ang.cos() * att, ang.sin() * att
    return ang.cos(), ang.sin()


def apply_rope(x_BTHD: Tensor, positions_T: Tensor, *, rotary_dim: int, theta: float, interleaved: bool = False,
               scaling: dict | None = None) -> Tensor:
    if rotary_dim == 0:
        return x_BTHD
    if rotary_dim % 2 or rotary_dim > x_BTHD.shape[-1]:
        raise ValueError(f"rotary_dim: must be even and <= head dim {x_BTHD.shape[-1]}, got {rotary_dim}")
    return rotate(x_BTHD, *rope_angles(positions_T, rotary_dim, theta, scaling), interleaved=interleaved)


def rotate(x_BTHD: Tensor, cos_TR: Tensor, sin_TR: Tensor, *, interleaved: bool = False) -> Tensor:
    """``apply_rope`` with its angles already computed (``rope_angles``: [T, R/2] each, R = rotary_dim); a
    decode step computes them once for all its layers."""
    rotary_dim = 2 * cos_TR.shape[-1]
    cos, sin = cos_TR[None, :, None, :], sin_TR[None, :, None, :]
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
