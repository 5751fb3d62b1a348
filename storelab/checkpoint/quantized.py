"""Quantized weights as released: block-scaled FP8 and packed FP4 (DeepSeek-V3/V4, GLM-5, MiMo, MiniMax).

A quantized weight ``<name>`` comes with ``<name>_scale_inv``, one scale per block of its last
two axes: w = q * scale, block by block.

* ``q``: ``F8_E4M3`` / ``F8_E5M2``, or ``I8`` holding two FP4 (e2m1) values per byte, low
  nibble first (DeepSeek-V4's experts), which unpacks to twice the width;
* ``scale``: fp32/bf16, ``F8_E8M0`` (a power of two), or ``U8`` exponent bytes, 2^(b - 127);
* blocks: ``quantization_config.weight_block_size`` (default 128 x 128) when the scale grid is
  its ceil-division of the weight, otherwise the grid's exact division (FP4's 1 x 32).

``dequantize_table`` rewrites a family's table so that each such piece is read with its scale
and multiplied out before the family's own transform; the loader then checks and reads as
usual (on ``meta`` only the shapes are computed). A quantized weight without its scale, or a
grid that fits neither rule, is an error naming the tensor.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch import Tensor

from storelab.checkpoint.shards import CheckpointError, Shards
from storelab.checkpoint.table import Src

__all__ = ["dequantize", "unpack_fp4", "dequantize_table", "QUANTIZED", "SCALES"]

QUANTIZED = ("F8_E4M3", "F8_E5M2", "I8")     # I8: packed FP4, only with a scale beside it
SCALES = ("F8_E8M0", "U8")                     # besides fp32/bf16
SCALE_SUFFIX = "_scale_inv"
FP4_E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def unpack_fp4(packed: Tensor) -> Tensor:
    """int8 [..., n] holding two e2m1 codes per byte (low nibble first) -> fp32 [..., 2n]."""
    if packed.device.type == "meta":
        return torch.empty(*packed.shape[:-1], 2 * packed.shape[-1], device="meta")
    lut = torch.tensor(FP4_E2M1, dtype=torch.float32, device=packed.device)
    u8 = packed.contiguous().view(torch.uint8)
    codes = torch.stack([(u8 & 0xF).long(), (u8 >> 4).long()], dim=-1)
    return lut[codes].reshape(*packed.shape[:-1], 2 * packed.shape[-1])


def _scales(s: Tensor) -> Tensor:
    if s.dtype == torch.uint8:
        return (s.float() - 127.0).exp2()
    return s.float()


def dequantize(q: Tensor, scale_inv: Tensor, block: tuple[int, int] = (128, 128), name: str = "weight") -> Tensor:
    """Quantized [..., O, I] (FP4-packed: [..., O, I/2]) times its block scales -> fp32 [..., O, I]."""
    w = unpack_fp4(q) if q.dtype == torch.int8 else q.float()
    O, I = w.shape[-2:]
    sr, sc = scale_inv.shape[-2:] if scale_inv.dim() >= 2 else (1, 1)
    bo, bi = block
    if (math.ceil(O / bo), math.ceil(I / bi)) != (sr, sc):
        if O % sr or I % sc:
            raise CheckpointError(f"{name}: shape [{O}, {I}] fits neither {bo}x{bo} blocks nor its "
                                  f"[{sr}, {sc}] scale grid")
        bo, bi = O // sr, I // sc
    s = _scales(scale_inv).reshape(*w.shape[:-2], sr, sc)
    s = s.repeat_interleave(bo, dim=-2)[..., :O, :].repeat_interleave(bi, dim=-1)[..., :I]
    return w * s


def _block(hf: dict) -> tuple[int, int]:
    q = hf.get("quantization_config") or (hf.get("text_config") or {}).get("quantization_config") or {}
    b = q.get("weight_block_size") or [128, 128]
    return int(b[0]), int(b[1])


def dequantize_table(tab: dict[str, Src], shards: Shards, hf: dict) -> dict[str, Src]:
    """The table with every quantized piece read beside its scale and dequantized first."""
    block = _block(hf)
    out = {}
    for mine, src in tab.items():
        quant = [n in shards.info and shards.info[n][1] in QUANTIZED and not src.integer
                 and (shards.info[n][1] != "I8" or n + SCALE_SUFFIX in shards.info) for n in src.names]
        if not any(quant):
            out[mine] = src
            continue
        names: list[str] = []
        for n, q in zip(src.names, quant):
            names.append(n)
            if q:
                if n + SCALE_SUFFIX not in shards.info:
                    raise CheckpointError(f"tensor {n!r} in {shards.where[n]}: dtype {shards.info[n][1]} but no "
                                          f"scale tensor {n + SCALE_SUFFIX!r} in any shard")
                names.append(n + SCALE_SUFFIX)

        def make(*pieces, src=src, quant=tuple(quant), names=tuple(n for n in src.names)):
            it, vals = iter(pieces), []
            for q, n in zip(quant, names):
                w = next(it)
                vals.append(dequantize(w, next(it), block, n) if q else w)
            return src.make(*vals)

        what = "dequantized" + (f", then {src.what}" if src.what else "")
        out[mine] = dataclasses.replace(src, names=tuple(names), fn=make, what=what, quantized=True)
    return out
