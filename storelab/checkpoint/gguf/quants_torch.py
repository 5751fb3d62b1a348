"""The common GGML block formats dequantized with torch: the same arithmetic as gguf-py 0.19's ``gguf.quants``
(``dequantize_blocks`` of each class), in the same order, so the result is bit for bit gguf-py's
(``tests/test_gguf_quants_torch.py`` holds it on random blocks, NaN and infinite scales included).

Why: gguf-py's numpy runs a tensor 16 rows at a time through ``np.array_split`` and a dozen temporaries per
group; these torch ops on the uint8 bytes, ``CHUNK`` elements at a time, take 1.3-3x less (measured on a
busy machine: SmolLM2-135M's tensors 2.5-3.8 s -> 1.8-2.3 s, Gemma 3 270M's 4.2-4.5 s -> 3.2-3.3 s). The other types (Q2_K, Q3_K, Q5_1, the IQ and ternary formats, MXFP4, NVFP4) stay with
gguf-py (``storelab.checkpoint.gguf.dequant``).

The layouts (ggml ``ggml-common.h``; every scale ``d``/``dmin`` an fp16, little-endian; QK_K = 256):

| type | block | bytes | layout -> value                                                              |
|------|-------|-------|------------------------------------------------------------------------------|
| F16  | 1     | 2     | fp16                                                                        |
| BF16 | 1     | 2     | the top half of an fp32                                                     |
| Q8_0 | 32    | 34    | d, qs int8[32] -> q * d                                                     |
| Q4_0 | 32    | 18    | d, qs[16] (elements 0-15 low nibbles, 16-31 high) -> d * (q - 8)            |
| Q4_1 | 32    | 20    | d, m, qs[16] -> d * q + m                                                   |
| Q5_0 | 32    | 22    | d, qh u32 (bit j: element j's fifth bit), qs[16] -> d * (q - 16)            |
| Q4_K | 256   | 144   | d, dmin, 12 bytes of 8 6-bit (scale, min), qs[128] -> d sc * q - dmin m     |
| Q5_K | 256   | 176   | d, dmin, scales[12], qh[32] (bit k of byte i: element 32k + i), qs[128]     |
| Q6_K | 256   | 210   | ql[128], qh[64], scales int8[16], d -> d * scale * (q - 32)                 |

Blocks are ``[n_blocks, bytes]`` uint8 (names: ``_NB`` a per-block count); out ``[n_blocks, block]`` fp32.
"""

from __future__ import annotations

import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as Q
from torch import Tensor

__all__ = ["TORCH_DEQUANT", "dequantize_torch"]

QK_K = 256


def _f16(b: Tensor, at: int) -> Tensor:
    """The fp16 at byte ``at`` of each block (contiguous [N, bytes], ``at`` and bytes even) -> [N, 1] fp32."""
    return b.view(torch.float16)[:, at // 2:at // 2 + 1].to(torch.float32)


def _nibbles(qs: Tensor, group: int) -> Tensor:
    """[N, G*group] packed bytes -> [N, G, 2, group] values: per group of ``group`` bytes, the low nibbles then
    the high ones (gguf-py's ``>> [0, 4]`` on a ``(N, -1, 1, group)`` view)."""
    q = qs.reshape(qs.shape[0], -1, 1, group)
    return torch.cat([q & 0x0F, q >> 4], dim=2)


def _scale_min(scales: Tensor) -> tuple[Tensor, Tensor]:
    """Q4_K / Q5_K's 12 bytes -> 8 six-bit scales and 8 six-bit mins (gguf-py ``Q4_K.get_scale_min``)."""
    s = scales.reshape(-1, 3, 4)
    d, m, m_d = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (m_d & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (m_d >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def _f16_blocks(b: Tensor) -> Tensor:
    return b.view(torch.float16).to(torch.float32).reshape(-1, 1)


def _bf16(b: Tensor) -> Tensor:
    return (b.contiguous().view(torch.int16).to(torch.int32) << 16).view(torch.float32).reshape(-1, 1)


def _q8_0(b: Tensor) -> Tensor:
    d, x = _f16(b, 0), b[:, 2:].contiguous().view(torch.int8).to(torch.float32)
    return x * d


def _q4_0(b: Tensor) -> Tensor:
    d = _f16(b, 0)
    q = _nibbles(b[:, 2:], 16).reshape(b.shape[0], -1).view(torch.int8) - 8
    return d * q.to(torch.float32)


def _q4_1(b: Tensor) -> Tensor:
    d, m = _f16(b, 0), _f16(b, 2)
    q = _nibbles(b[:, 4:], 16).reshape(b.shape[0], -1).to(torch.float32)
    return (d * q) + m


def _q5_0(b: Tensor) -> Tensor:
    d = _f16(b, 0)
    shifts = torch.arange(8, dtype=torch.uint8)
    qh = ((b[:, 2:6].unsqueeze(-1) >> shifts) & 1).reshape(b.shape[0], 32)   # bit j of the u32, little-endian
    ql = _nibbles(b[:, 6:], 16).reshape(b.shape[0], -1)
    q = (ql | (qh << 4)).view(torch.int8) - 16
    return d * q.to(torch.float32)


def _k_scales(b: Tensor) -> tuple[Tensor, Tensor]:
    """Q4_K / Q5_K: (d * sc, dmin * m) as [N, 8, 1]."""
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, m = _scale_min(b[:, 4:16])
    return (d * sc.to(torch.float32)).reshape(-1, 8, 1), (dmin * m.to(torch.float32)).reshape(-1, 8, 1)


def _q4_k(b: Tensor) -> Tensor:
    d, dm = _k_scales(b)
    q = _nibbles(b[:, 16:], 32).reshape(b.shape[0], -1, 32).to(torch.float32)
    return (d * q - dm).reshape(b.shape[0], QK_K)


def _q5_k(b: Tensor) -> Tensor:
    d, dm = _k_scales(b)
    qh, qs = b[:, 16:48], b[:, 48:]
    ql = _nibbles(qs, 32).reshape(b.shape[0], -1, 32)
    shifts = torch.arange(8, dtype=torch.uint8).reshape(1, 1, 8, 1)
    hi = ((qh.reshape(b.shape[0], -1, 1, 32) >> shifts) & 1).reshape(b.shape[0], -1, 32)
    q = (ql | (hi << 4)).to(torch.float32)
    return (d * q - dm).reshape(b.shape[0], QK_K)


def _q6_k(b: Tensor) -> Tensor:
    n = b.shape[0]
    ql, qh, scales = b[:, :128], b[:, 128:192], b[:, 192:208]
    scales = scales.contiguous().view(torch.int8).to(torch.float32)
    d = (_f16(b, 208) * scales).reshape(n, QK_K // 16, 1)
    lo = _nibbles(ql, 64).reshape(n, -1, 32)
    shifts = torch.tensor([0, 2, 4, 6], dtype=torch.uint8).reshape(1, 1, 4, 1)
    hi = ((qh.reshape(n, -1, 1, 32) >> shifts) & 3).reshape(n, -1, 32)
    q = ((lo | (hi << 4)).view(torch.int8) - 32).reshape(n, QK_K // 16, -1).to(torch.float32)
    return (d * q).reshape(n, QK_K)


# type -> (bytes per block, fn [n_blocks, bytes] uint8 -> [n_blocks, block] fp32)
TORCH_DEQUANT = {Q.F16: (2, _f16_blocks), Q.BF16: (2, _bf16), Q.Q8_0: (34, _q8_0), Q.Q4_0: (18, _q4_0),
                 Q.Q4_1: (20, _q4_1), Q.Q5_0: (22, _q5_0), Q.Q4_K: (144, _q4_k), Q.Q5_K: (176, _q5_k),
                 Q.Q6_K: (210, _q6_k)}


CHUNK = (1 << 15) - 1   # elements per step: below torch's parallel grain (32768), so every op runs on this thread
                        # (whole-tensor ops on a busy 2-core machine paid 10-40 ms a parallel region: 48 s for SmolLM2)


def dequantize_torch(raw: Tensor, qtype: Q, shape: tuple[int, ...]) -> Tensor:
    """A tensor's stored bytes (uint8, 1-D) of a ``TORCH_DEQUANT`` type -> fp32 of ``shape``, ``CHUNK`` elements
    at a time into the one output tensor."""
    size, fn = TORCH_DEQUANT[qtype]
    block = GGML_QUANT_SIZES[qtype][0]
    blocks = raw.reshape(-1, size)
    n, step = blocks.shape[0], max(1, CHUNK // block)
    if n <= step:
        return fn(blocks).reshape(shape)
    out = torch.empty(n, block, dtype=torch.float32)
    for i in range(0, n, step):
        out[i:i + step] = fn(blocks[i:i + step])
    return out.reshape(shape)
