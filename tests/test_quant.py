"""Quantised cache entries: round-trip bounds, packing, and the published entry sizes."""

import math

import pytest
import torch

from storelab.ops.quant import FORMATS, decode_entries, dequantize, encode_entries, entry_bytes, quantize


def _blocks(x: torch.Tensor, block: int) -> torch.Tensor:
    n = x.shape[-1]
    nb = math.ceil(n / block)
    return torch.nn.functional.pad(x, (0, nb * block - n)).unflatten(-1, (nb, block))


@pytest.mark.parametrize("bits", [8, 4])
@pytest.mark.parametrize("n,block", [(64, 16), (40, 16), (448, 64), (448, 128), (6, 64)])
def test_round_trip_error_is_half_a_scale_step(bits, n, block):
    gen = torch.Generator().manual_seed(bits * 1000 + n + block)
    # blocks of very different magnitudes, so one scale per block matters
    x = torch.randn(3, 5, n, generator=gen) * torch.exp(4 * torch.randn(3, 5, 1, generator=gen))
    x = x * torch.exp(2 * torch.randn(n, generator=gen))
    codes, scales = quantize(x, bits=bits, block=block)
    assert codes.dtype == torch.uint8 and scales.dtype == torch.uint8
    assert codes.shape[-1] == n * bits // 8                        # 4-bit codes: two per byte
    assert scales.shape[-1] == math.ceil(n / block)
    y = dequantize(codes, scales, bits=bits, block=block, dim=n)
    qmax = 2 ** (bits - 1) - 1
    err_B = _blocks((x - y).abs(), block).amax(-1)
    absmax_B = _blocks(x.abs(), block).amax(-1)
    scale_B = torch.ldexp(torch.ones(scales.shape), scales.to(torch.int32) - 127)
    # the scale is the smallest power of two that fits the block's absmax into qmax
    assert torch.all(scale_B * qmax >= absmax_B)
    assert torch.all(scale_B * qmax / 2 < absmax_B)
    assert torch.all(err_B <= scale_B / 2 * (1 + 1e-6))
    # hence relative to the block's absmax: below 1 / qmax = 1 / (2^(bits-1) - 1)
    assert torch.all(err_B <= absmax_B / qmax)
    # and not trivially: the error is of the order the bound says
    assert (err_B / absmax_B).max() > 0.1 / qmax


def test_exact_values_survive_and_zeros_stay_zero():
    x = torch.tensor([[1.0, -7.0, 3.0, 0.0, 5.0, -2.0, 7.0, 6.0]])     # a 4-bit block with scale 1
    for bits in (8, 4):
        c, s = quantize(x, bits=bits, block=8)
        assert torch.equal(dequantize(c, s, bits=bits, block=8, dim=8), x)
    c, s = quantize(x, bits=4, block=8)
    # packed two per byte: low nibble = even channel, offset by 8
    assert c[0, 0].item() == (1 + 8) | ((-7 + 8) << 4)
    z = torch.zeros(2, 16)
    c, s = quantize(z, bits=8, block=8)
    assert torch.equal(dequantize(c, s, bits=8, block=8, dim=16), z)


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="bits"):
        quantize(torch.randn(4, 8), bits=6, block=8)
    with pytest.raises(ValueError, match="block"):
        quantize(torch.randn(4, 8), bits=8, block=0)
    with pytest.raises(ValueError, match="fmt"):
        entry_bytes(512, 64, "fp16x", 64)
    with pytest.raises(ValueError, match="rope_dim"):
        entry_bytes(64, 128, "fp8", 64)


def test_published_entry_sizes():
    # DeepSeek-V4-Pro: 448 fp8 + 64 bf16 rope + 8 scale bytes (shared/reference/models.md)
    assert entry_bytes(512, 64, "fp8", 64) == 448 + 128 + 8 == 584
    # its indexer entry: 128 dims in fp8 plus scales
    assert entry_bytes(128, 0, "fp8", 64) == 132
    # DeepSeek-V4.1-Flash decoder entry: 448 dims at 4 bits + 64 rope in bf16 + 4 scale bytes
    v41 = entry_bytes(512, 64, "fp4", 128)
    assert v41 == 224 + 128 + 4 == 356
    # ... and per token: 1 decoder entry + 3 encoder caches at compression 2 = 2.5 entries
    assert v41 * (1 + 3 / 2) == 890
    assert entry_bytes(512, 64, "fp32", 64) == 2048 and entry_bytes(512, 64, "bf16", 64) == 1024


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("head_dim,rope_dim,block", [(32, 4, 8), (40, 8, 16), (16, 0, 64)])
def test_entry_rows_have_exactly_the_analytic_bytes(fmt, head_dim, rope_dim, block):
    gen = torch.Generator().manual_seed(head_dim + block)
    x = torch.randn(2, 7, head_dim, generator=gen)
    rows = encode_entries(x, rope_dim=rope_dim, fmt=fmt, block=block)
    assert rows[0, 0].numel() * rows.element_size() == entry_bytes(head_dim, rope_dim, fmt, block)
    y = decode_entries(rows, head_dim=head_dim, rope_dim=rope_dim, fmt=fmt, block=block)
    nope = head_dim - rope_dim
    # rope channels are kept in bf16 (exact for fp32)
    rope_want = x[..., nope:] if fmt == "fp32" else x[..., nope:].to(torch.bfloat16).float()
    assert torch.equal(y[..., nope:], rope_want)
    bits = {"fp32": 24, "bf16": 8, "fp8": 8, "fp4": 4}[fmt]  # mantissa / code bits
    qmax = 2 ** (bits - 1) - 1
    err = _blocks((x[..., :nope] - y[..., :nope]).abs(), block).amax(-1)
    assert torch.all(err <= _blocks(x[..., :nope].abs(), block).amax(-1) / qmax)
