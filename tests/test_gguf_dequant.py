"""Dequantization of every GGML type storelab reads (``storelab.checkpoint.gguf.tensors.DEQUANTIZED``): a tensor
written into a GGUF file and read back by storelab equals ``gguf.quants.dequantize`` of the same bytes, in
torch's shape. Types gguf-py can quantize are quantized from random floats; the others (K-quants, IQ, MXFP4,
NVFP4 ...) are random blocks of the type's size, each checked bit for bit (NaN where the bytes say NaN)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType as Q

from storelab.checkpoint import CheckpointError
from storelab.checkpoint.gguf import DEQUANTIZED, gguf_stored_bytes, read_header
from storelab.checkpoint.gguf.tensors import read_tensor

QUANTIZABLE = (Q.F32, Q.F16, Q.BF16, Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.TQ1_0, Q.TQ2_0, Q.MXFP4)
SHAPE = (3, 512)   # rows a multiple of every block (32, 256)


def test_declared_types_are_gguf_pys():
    import gguf.quants as quants

    assert set(DEQUANTIZED) == set(quants._type_traits) | {Q.F32, Q.F16}


def _bytes_of(qtype: Q, rng: np.random.Generator) -> np.ndarray:
    """The stored bytes of a SHAPE tensor of this type."""
    x = rng.standard_normal(SHAPE).astype(np.float32)
    if qtype in QUANTIZABLE:
        q = gguf.quants.quantize(x, qtype)
        return q.view(np.uint8).reshape(SHAPE[0], -1)
    block, size = GGML_QUANT_SIZES[qtype]
    return rng.integers(0, 256, (SHAPE[0], SHAPE[1] // block * size), dtype=np.uint8)


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    rng = np.random.default_rng(0)
    path = tmp_path_factory.mktemp("dq") / "types.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    stored = {}
    for qtype in DEQUANTIZED:
        raw = _bytes_of(qtype, rng)
        stored[qtype] = raw
        w.add_tensor(f"t.{qtype.name}", raw, raw_dtype=qtype)
    w.add_tensor("t.I32", np.arange(8, dtype=np.int32))
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    return path, stored


@pytest.mark.parametrize("qtype", DEQUANTIZED, ids=lambda q: q.name)
def test_read_equals_gguf_dequantize(written, qtype):
    path, stored = written
    h = read_header(path)
    t = h.tensors[f"t.{qtype.name}"]
    assert t.shape == SHAPE and t.qtype == qtype and t.nbytes == stored[qtype].nbytes
    got = read_tensor(h.folder, t)
    want = torch.from_numpy(gguf.quants.dequantize(stored[qtype], qtype).astype(np.float32)).reshape(SHAPE)
    assert got.dtype == torch.float32 and got.shape == SHAPE
    torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)


def test_stored_bytes_and_an_unread_type(written):
    path, stored = written
    by_type = gguf_stored_bytes(path)
    assert by_type["Q4_K"] == stored[Q.Q4_K].nbytes and by_type["I32"] == 32
    assert sum(by_type.values()) == sum(t.nbytes for t in read_header(path).tensors.values())
    h = read_header(path)
    t = read_tensor(h.folder, h.tensors["t.I32"])   # an integer table (V4's tid2eid) is read as integers
    assert t.dtype == torch.int32 and t.numel() * 4 == 32
