"""Block-quantized FP8 checkpoints (DeepSeek-V3/V4, GLM-5, MiMo, MiniMax releases).

A weight stored as ``F8_E4M3`` (or ``F8_E5M2``) comes with ``<name>_scale_inv``, one fp32
scale per block of ``weight_block_size`` (config.json ``quantization_config``, default
128 x 128) over its last two axes: w = fp8 * scale, block by block. ``dequantize_table``
rewrites a family's table so that each such piece is read together with its scale and
multiplied out before the family's own transform; the loader then checks and reads as usual.
A quantized weight without its scale is an error naming both.
"""

from __future__ import annotations

import dataclasses

from torch import Tensor

from storelab.checkpoint.shards import CheckpointError, Shards
from storelab.checkpoint.table import Src

__all__ = ["dequantize", "dequantize_table", "FP8"]

FP8 = ("F8_E4M3", "F8_E5M2")
SCALE_SUFFIX = "_scale_inv"


def dequantize(w: Tensor, scale_inv: Tensor, block: tuple[int, int]) -> Tensor:
    """fp8 [..., O, I] times its per-block scales [..., ceil(O/bo), ceil(I/bi)] -> fp32."""
    bo, bi = block
    O, I = w.shape[-2:]
    s = scale_inv.float().repeat_interleave(bo, dim=-2)[..., :O, :].repeat_interleave(bi, dim=-1)[..., :I]
    return w.float() * s


def _block(hf: dict) -> tuple[int, int]:
    q = hf.get("quantization_config") or (hf.get("text_config") or {}).get("quantization_config") or {}
    b = q.get("weight_block_size") or [128, 128]
    return int(b[0]), int(b[1])


def dequantize_table(tab: dict[str, Src], shards: Shards, hf: dict) -> dict[str, Src]:
    """The table with every FP8 piece read beside its scale and dequantized first."""
    block = _block(hf)
    out = {}
    for mine, src in tab.items():
        quant = [n in shards.info and shards.info[n][1] in FP8 for n in src.names]
        if not any(quant):
            out[mine] = src
            continue
        names: list[str] = []
        for n, q in zip(src.names, quant):
            names.append(n)
            if q:
                scale = n + SCALE_SUFFIX
                if scale not in shards.info:
                    raise CheckpointError(f"tensor {n!r} in {shards.where[n]}: dtype {shards.info[n][1]} but no "
                                          f"scale tensor {scale!r} in any shard")
                names.append(scale)

        def make(*pieces, src=src, quant=tuple(quant)):
            it, vals = iter(pieces), []
            for q in quant:
                w = next(it)
                vals.append(dequantize(w, next(it), block) if q else w)
            return src.make(*vals)

        what = f"fp8 blocks {block[0]}x{block[1]} dequantized" + (f", then {src.what}" if src.what else "")
        out[mine] = dataclasses.replace(src, names=tuple(names), fn=make, what=what, quantized=True)
    return out
