"""``storelab.checkpoint.gguf.quants_torch``: each block format torch dequantizes gives gguf-py 0.19's
``gguf.quants.dequantize`` bit for bit (compared as int32 bit patterns, so -0.0 and infinities count; a NaN need only be a NaN on both sides: an fp16
NaN scale's payload is carried differently by numpy's and torch's fp16 -> fp32 casts)
on random bytes: every byte value, fp16 scales that are NaN, infinite or subnormal included; 1, 7 and 300 blocks;
and on values quantized by gguf-py where it quantizes the type. 300 blocks run in steps of 64 (``CHUNK``)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as Q

from storelab.checkpoint.gguf import quants_torch
from storelab.checkpoint.gguf.quants_torch import TORCH_DEQUANT, dequantize_torch

QUANTIZABLE = (Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0)


def _same_bits(got: torch.Tensor, want: np.ndarray) -> None:
    want_t = torch.from_numpy(np.ascontiguousarray(want, dtype=np.float32))
    assert got.dtype == torch.float32 and got.shape == want_t.shape
    both_nan = got.isnan() & want_t.isnan()
    diff = ((got.view(torch.int32) != want_t.view(torch.int32)) & ~both_nan).nonzero()
    assert diff.numel() == 0, f"{diff.shape[0]} elements differ, first at {diff[0].tolist()}: " \
                              f"{got[tuple(diff[0])].item()!r} vs {want_t[tuple(diff[0])].item()!r}"


def test_sizes_are_ggmls():
    for qtype, (size, _) in TORCH_DEQUANT.items():
        assert GGML_QUANT_SIZES[qtype][1] == size, qtype


@pytest.mark.parametrize("n_blocks", [1, 7, 300])
@pytest.mark.parametrize("qtype", list(TORCH_DEQUANT), ids=lambda q: q.name)
def test_random_blocks_bit_equal(qtype, n_blocks, monkeypatch):
    block, size = GGML_QUANT_SIZES[qtype]
    monkeypatch.setattr(quants_torch, "CHUNK", 64 * block)   # 300 blocks: four whole steps and a part
    rng = np.random.default_rng(n_blocks)
    raw = rng.integers(0, 256, (n_blocks, size), dtype=np.uint8)
    with np.errstate(invalid="ignore", over="ignore"):
        want = gguf.quants.dequantize(raw, qtype)
    shape = (n_blocks, block)
    _same_bits(dequantize_torch(torch.from_numpy(raw.reshape(-1)), qtype, shape), want.reshape(shape))


@pytest.mark.parametrize("qtype", [q for q in QUANTIZABLE if q in TORCH_DEQUANT], ids=lambda q: q.name)
def test_quantized_values_bit_equal(qtype):
    x = np.random.default_rng(0).standard_normal((5, 512)).astype(np.float32)
    raw = gguf.quants.quantize(x, qtype).view(np.uint8)
    want = gguf.quants.dequantize(raw.reshape(5, -1), qtype)
    _same_bits(dequantize_torch(torch.from_numpy(raw.reshape(-1).copy()), qtype, (5, 512)), want)
