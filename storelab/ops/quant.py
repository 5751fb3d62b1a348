"""Quantised cache entries: integer codes with one power-of-two scale per block.

DeepSeek-V4 (arXiv 2606.19348) stores each compressed-attention cache entry as
its no-rope channels in 8 bits (V4-Pro) or 4 bits (V4.1-Flash), one 1-byte
power-of-two scale per block of channels (the UE8M0 format of the DeepSeek-V3
report, arXiv 2412.19437), and its rope channels in bf16: rotated channels
carry the position and lose it when rounded coarsely.

* ``quantize(x, bits=8|4, block=...)  -> (codes, scales)``: per block of ``block``
  channels along the last axis, ``scale = 2^ceil(log2(absmax / qmax))`` with
  ``qmax = 2^(bits-1) - 1`` (127 or 7), ``code = round(x / scale)``. 8-bit codes are
  int8 stored as uint8; 4-bit codes are offset by 8 and packed two per byte (low
  nibble = even channel). ``scales`` holds the exponent plus 127, one uint8 per block.
  Error bound: ``|x - dequantize(...)| <= scale / 2 < absmax / qmax`` per block.
* ``dequantize(codes, scales, bits=..., block=..., dim=...) -> x`` (fp32).
* ``entry_bytes(head_dim, rope_dim, fmt, block)``: bytes of one entry in a format.
* ``encode_entries`` / ``decode_entries``: entries [..., head_dim] <-> rows of exactly
  ``entry_bytes`` bytes, laid out as ``codes | scales (padded to 4 bytes) | rope in bf16``.

* ``fake_quantize_entries(x, *, rope_dim, fmt, block)``: the training form, float rows equal to
  ``decode_entries(encode_entries(x))`` whose gradient is the straight-through estimator's
  (identity; Bengio et al., arXiv 1308.3432), so a model trains through its quantised cache.
  ``decode_entries`` returns such float rows as they are.

Formats: "fp32" and "bf16" keep the entry as a float row; "fp8" and "fp4" are the
quantised layouts (integer codes, not e4m3/e2m1 floats: the byte count is the
same and the error bound is simpler; see the report).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["FORMATS", "FORMAT_BITS", "quantize", "dequantize", "entry_bytes", "encode_entries", "decode_entries",
           "fake_quantize_entries"]

FORMATS = ("fp32", "bf16", "fp8", "fp4")
FORMAT_BITS = {"fp32": 32, "bf16": 16, "fp8": 8, "fp4": 4}
_SCALE_BIAS = 127   # scale byte = exponent + 127 (UE8M0)
_SCALE_ALIGN = 4    # scale bytes of an entry are padded to a multiple of 4


def _check_bits(bits: int) -> int:
    if bits not in (8, 4):
        raise ValueError(f"bits: must be 8 or 4, got {bits!r}")
    return (1 << (bits - 1)) - 1


def quantize(x: Tensor, *, bits: int, block: int) -> tuple[Tensor, Tensor]:
    """(codes uint8 [..., ceil(n * bits / 8)], scales uint8 [..., ceil(n / block)])."""
    qmax = _check_bits(bits)
    if block <= 0:
        raise ValueError(f"block: must be > 0, got {block}")
    n = x.shape[-1]
    if bits == 4 and n % 2:
        raise ValueError(f"x: 4-bit codes pack two per byte, so the last axis must be even, got {n}")
    nb = math.ceil(n / block)
    xf = torch.nn.functional.pad(x.float(), (0, nb * block - n)).unflatten(-1, (nb, block))  # [..., nb, block]
    absmax = xf.abs().amax(-1)
    exp = torch.ceil(torch.log2(absmax / qmax)).nan_to_num(0.0)      # absmax 0 -> log2(0) = -inf
    exp = exp.clamp(-_SCALE_BIAS, _SCALE_BIAS)
    q = torch.round(xf / torch.ldexp(torch.ones_like(exp), exp.to(torch.int32))[..., None])
    q = q.clamp(-qmax, qmax).flatten(-2)[..., :n].to(torch.int8)      # [..., n]
    if bits == 8:
        codes = q.view(torch.uint8)
    else:
        u = (q + 8).to(torch.uint8)                                   # 1..15
        codes = u[..., 0::2] | (u[..., 1::2] << 4)
    scales = (exp + _SCALE_BIAS).to(torch.uint8)
    return codes, scales


def dequantize(codes: Tensor, scales: Tensor, *, bits: int, block: int, dim: int) -> Tensor:
    """The fp32 values [..., dim] the codes stand for."""
    _check_bits(bits)
    if bits == 8:
        q = codes.view(torch.int8).float()
    else:
        lo = (codes & 0x0F).to(torch.int16) - 8
        hi = (codes >> 4).to(torch.int16) - 8
        q = torch.stack([lo, hi], dim=-1).flatten(-2).float()
    scale = torch.ldexp(torch.ones(scales.shape, device=codes.device), scales.to(torch.int32) - _SCALE_BIAS)
    scale = scale.repeat_interleave(block, dim=-1)[..., :dim]
    return q[..., :dim] * scale


def _scale_bytes(nope: int, block: int) -> int:
    n = math.ceil(nope / block)
    return -(-n // _SCALE_ALIGN) * _SCALE_ALIGN


def entry_bytes(head_dim: int, rope_dim: int, fmt: str, block: int) -> int:
    """Bytes of one cache entry of ``head_dim`` channels, the last ``rope_dim`` rotary.

    fp32 / bf16: ``head_dim * (4 | 2)``. fp8 / fp4: the ``head_dim - rope_dim`` no-rope
    channels at 8 or 4 bits, plus the rope channels in bf16, plus one scale byte per
    block of ``block`` no-rope channels padded to a multiple of 4 bytes. Published
    checks (shared/reference/models.md): DeepSeek-V4-Pro ``entry_bytes(512, 64, "fp8",
    64) = 448 + 128 + 8 = 584``; V4.1-Flash decoder ``entry_bytes(512, 64, "fp4", 128)
    = 224 + 128 + 4 = 356``; the V4-Pro indexer entry ``entry_bytes(128, 0, "fp8", 64) = 132``.
    """
    if fmt not in FORMATS:
        raise ValueError(f"fmt: must be one of {FORMATS}, got {fmt!r}")
    if not 0 <= rope_dim <= head_dim:
        raise ValueError(f"rope_dim: must be between 0 and head_dim {head_dim}, got {rope_dim}")
    bits = FORMAT_BITS[fmt]
    if bits >= 16:
        return head_dim * bits // 8
    nope = head_dim - rope_dim
    if (nope * bits) % 8:
        raise ValueError(f"head_dim: {nope} no-rope channels at {bits} bits do not fill whole bytes")
    return nope * bits // 8 + _scale_bytes(nope, block) + 2 * rope_dim


def encode_entries(x: Tensor, *, rope_dim: int, fmt: str, block: int) -> Tensor:
    """Entries [..., head_dim] -> stored rows: float rows for fp32/bf16, uint8 rows for fp8/fp4."""
    if fmt == "fp32":
        return x.float()
    if fmt == "bf16":
        return x.to(torch.bfloat16)
    bits = FORMAT_BITS[fmt]
    head_dim = x.shape[-1]
    nope = head_dim - rope_dim
    codes, scales = quantize(x[..., :nope], bits=bits, block=block)
    pad = _scale_bytes(nope, block) - scales.shape[-1]
    scales = torch.nn.functional.pad(scales, (0, pad))
    rope = x[..., nope:].to(torch.bfloat16).contiguous().view(torch.uint8)
    return torch.cat([codes, scales, rope], dim=-1)


def decode_entries(rows: Tensor, *, head_dim: int, rope_dim: int, fmt: str, block: int,
                   dtype: torch.dtype = torch.float32) -> Tensor:
    """Stored rows -> entries [..., head_dim] in ``dtype`` (float rows: the training form, as they are)."""
    if fmt in ("fp32", "bf16") or rows.is_floating_point():
        return rows.to(dtype)
    bits = FORMAT_BITS[fmt]
    nope = head_dim - rope_dim
    n_code = nope * bits // 8
    n_scale = math.ceil(nope / block)
    codes = rows[..., :n_code]
    scales = rows[..., n_code:n_code + n_scale]
    rope = rows[..., n_code + _scale_bytes(nope, block):].contiguous().view(torch.bfloat16)
    nope_x = dequantize(codes, scales, bits=bits, block=block, dim=nope)
    return torch.cat([nope_x, rope.float()], dim=-1).to(dtype)


def fake_quantize_entries(x: Tensor, *, rope_dim: int, fmt: str, block: int) -> Tensor:
    """decode(encode(x)) in x's dtype, with the straight-through gradient (identity)."""
    rows = encode_entries(x.detach(), rope_dim=rope_dim, fmt=fmt, block=block)
    q = decode_entries(rows, head_dim=x.shape[-1], rope_dim=rope_dim, fmt=fmt, block=block, dtype=x.dtype)
    return x + (q - x).detach()
