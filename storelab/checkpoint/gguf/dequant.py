"""One GGUF tensor's stored bytes -> an fp32 torch tensor in torch order (``read_tensor``).

``DEQUANTIZED``: every GGML type gguf-py 0.19's ``gguf.quants.dequantize`` implements (a test holds this to
gguf-py's own list); a tensor of any other type (I8, I32 ...) is refused naming the file and the tensor.
Each read is one seek and one ``readinto`` of exactly the tensor's bytes (no mmap kept); the common block
types (F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K, Q6_K) are dequantized by ``quants_torch`` (bit for bit
gguf-py's, several times faster), the others by ``gguf.quants.dequantize``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from gguf.constants import GGMLQuantizationType as Q
from gguf.quants import dequantize, quant_shape_to_byte_shape

from storelab.checkpoint.gguf.header import TensorInfo
from storelab.checkpoint.gguf.quants_torch import TORCH_DEQUANT, dequantize_torch
from storelab.checkpoint.shards import CheckpointError

__all__ = ["DEQUANTIZED", "INTEGER", "INTEGER_NAMES", "read_raw", "read_tensor", "dequantize_raw"]

DEQUANTIZED = (Q.F32, Q.F16, Q.BF16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K,
               Q.Q6_K, Q.TQ1_0, Q.TQ2_0, Q.MXFP4, Q.NVFP4, Q.IQ2_XXS, Q.IQ2_XS, Q.IQ2_S, Q.IQ3_XXS, Q.IQ3_S,
               Q.IQ1_S, Q.IQ1_M, Q.IQ4_NL, Q.IQ4_XS)


# integer tables (DeepSeek-V4's hash router ``tid2eid``, written I32 by llama.cpp's converter), read as integers
INTEGER = {Q.I8: torch.int8, Q.I16: torch.int16, Q.I32: torch.int32, Q.I64: torch.int64}
INTEGER_NAMES = {Q.I8: "I8", Q.I16: "I16", Q.I32: "I32", Q.I64: "I64"}   # their safetensors-style names


def read_raw(folder: Path, t: TensorInfo) -> np.ndarray:
    """The tensor's stored bytes (uint8, ``t.nbytes`` of them); a type storelab does not dequantize (or read as
    integers) or a short read is a CheckpointError naming the file and the tensor."""
    if t.qtype not in DEQUANTIZED and t.qtype not in INTEGER:
        raise CheckpointError(f"{folder / t.file}: tensor {t.name!r}: GGML type {t.qtype.name} is not a weight "
                              f"type storelab dequantizes (gguf.quants: {', '.join(q.name for q in DEQUANTIZED)})")
    raw = np.empty(t.nbytes, dtype=np.uint8)
    with open(folder / t.file, "rb") as f:
        f.seek(t.offset)
        got = f.readinto(memoryview(raw))
    if got != t.nbytes:
        raise CheckpointError(f"{folder / t.file}: tensor {t.name!r}: read {got} of its {t.nbytes} bytes (truncated)")
    return raw


def dequantize_raw(raw: np.ndarray, t: TensorInfo) -> torch.Tensor:
    """The stored bytes of ``t`` as fp32 in torch order: F32 as it is, the common block types by torch
    (``quants_torch.TORCH_DEQUANT``, bit for bit gguf-py's), the rest by ``gguf.quants.dequantize``."""
    if t.qtype == Q.F32:
        return torch.from_numpy(raw).view(torch.float32).reshape(t.shape)
    if t.qtype in INTEGER:   # an integer table, as stored
        return torch.from_numpy(raw).view(INTEGER[t.qtype]).reshape(t.shape)
    if t.qtype in TORCH_DEQUANT:
        return dequantize_torch(torch.from_numpy(raw), t.qtype, t.shape)
    shape = t.shape or (1,)
    w = dequantize(raw.reshape(quant_shape_to_byte_shape(shape, t.qtype)), t.qtype)
    return torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32)).reshape(t.shape)


def read_tensor(folder: Path, t: TensorInfo) -> torch.Tensor:
    """One GGUF tensor's bytes, dequantized to fp32 in torch order."""
    return dequantize_raw(read_raw(folder, t), t)
