"""One token's products with the weights, y = W x, for the decode step: fp32, bf16 or int8 weights.

Decoding one token reads every weight once, and does two flops per weight read, so its time is the
weights' bytes over the memory rate (docs/bench.md measures it). Narrower weights are read faster:

* ``fp32``: the weight as it is;
* ``bf16``: the weight rounded to bfloat16 (its top 16 bits, round to nearest even), widened back to fp32
  exactly inside the product, so x is not rounded and the sums stay fp32;
* ``int8``: weight-only quantisation with one scale per output channel (row),
  s_r = max_k |W[r, k]| / 127,  q[r, k] = round(W[r, k] / s_r) in [-127, 127],  y_r = s_r sum_k q[r, k] x_k.

``pack(weight, fmt)`` makes a ``PackedWeight``; ``matvec(pw, x_K, out_N)`` writes W x into ``out`` with the
C kernel of its format (``kernels/matvec.c``, built by ``storelab.ops.compiled``), four rows per pass. The
choice of kernel is made once, by the format, at ``pack``. Where the library cannot be built the same
products run as tensor operations (slower, not different in meaning). ``PackedWeight.dequantize()`` is
the fp32 weight the format stands for: a prefill (many tokens) multiplies by it with torch's matmul.

Why C for bf16 and int8, and not for fp32 (measured, docs/bench.md): torch's bf16 matrix-vector product on
this CPU ran at about a third of its fp32 rate, and ``aten._weight_int8pack_mm`` at under a tenth of it,
where the point of a narrower weight is to be faster; a dequantize-then-multiply writes the fp32 weight
every step. For fp32 torch's own product (MKL's) was about 10 % faster than the C kernel, and still 1-3 %
faster once the kernel prefetched its next rows (a SmolLM2 step, 2026-12-07: 54.2 against 55.0 ms on one
thread, 29.8 against 30.9 on two), so a product called alone with an fp32 weight goes through ``torch.mv`` (its
threads are torch's). Inside a run of layers in one C call (``storelab.models.decode``, ``layer_run_f32``) the fp32
form runs, from ``kernels/matvec_body.h``: there the products share one OpenMP region with the rest of the layer,
which saved more than MKL's edge (docs/bench.md, 2026-12-07).

Threads: ``RowSplit(threads)`` cuts the rows between the threads of the OpenMP runtime torch loaded (the kernels
are built with OpenMP, ``storelab.ops.compiled.OPENMP``); a Python pool's threads had waited for cores that
torch's OpenMP threads spin on.

Shape legend: N output rows, K input width.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from storelab.ops.compiled import compiled_library, compiled_unavailable

__all__ = ["FORMATS", "PackedWeight", "pack", "matvec", "bind", "RowSplit", "kernels_available"]

FORMATS = ("fp32", "bf16", "int8")
INT8_MAX = 127

_P, _L = ctypes.c_void_p, ctypes.c_long
_SIGNATURES = {f"matvec_{s}": ([_P, _P, _P, _P, _L, _L, _L], None) for s in ("f32", "bf16", "i8")}
_SIGNATURES.update({f"matvec_threads_{s}": ([_P, _P, _P, _P, _L, _L, ctypes.c_int], None)
                    for s in ("f32", "bf16", "i8")})
_SUFFIX = {"fp32": "f32", "bf16": "bf16", "int8": "i8"}


def _library() -> ctypes.CDLL | None:
    return compiled_library("matvec", _SIGNATURES)


def kernels_available() -> str | None:
    """None when the C kernels are built and loaded, else why not (the tensor form then runs)."""
    return None if _library() is not None else (compiled_unavailable("matvec") or "not built")


@dataclass
class PackedWeight:
    """A linear layer's weight [N, K] in one of ``FORMATS``, its scale per row (int8) and bias [N] (fp32)."""

    fmt: str
    data_NK: Tensor
    scale_N: Tensor | None = None
    bias_N: Tensor | None = None

    @property
    def rows(self) -> int:
        return self.data_NK.shape[0]

    @property
    def cols(self) -> int:
        return self.data_NK.shape[1]

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.data_NK, self.scale_N, self.bias_N) if t is not None)

    def dequantize(self) -> Tensor:
        """The fp32 weight this format stands for."""
        if self.fmt == "int8":
            return self.data_NK.float() * self.scale_N[:, None]
        return self.data_NK.float()

    def kernel(self):
        """The C function for this format, or None where the library is not built."""
        lib = _library()
        if lib is None:
            return None
        return getattr(lib, f"matvec_threads_{_SUFFIX[self.fmt]}")


def pack(weight_NK: Tensor, fmt: str, bias_N: Tensor | None = None) -> PackedWeight:
    """The weight in format ``fmt`` (module docstring); a copy for bf16 and int8, the tensor itself for fp32."""
    if fmt not in FORMATS:
        raise ValueError(f"weights: must be one of {', '.join(FORMATS)}, got {fmt!r}")
    w = weight_NK.detach()
    if w.dim() != 2 or w.device.type != "cpu":
        raise ValueError(f"weight: a matrix on the CPU is packed, got {list(w.shape)} on {w.device}")
    bias = None if bias_N is None else bias_N.detach().float().contiguous()
    if fmt == "fp32":
        return PackedWeight("fp32", w.float().contiguous(), None, bias)
    if fmt == "bf16":
        return PackedWeight("bf16", w.to(torch.bfloat16).contiguous(), None, bias)
    wf = w.float()
    amax = wf.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / INT8_MAX, torch.ones_like(amax))  # a zero row: any scale, q = 0
    q = torch.round(wf / scale[:, None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return PackedWeight("int8", q.contiguous(), scale.contiguous(), bias)


class RowSplit:
    """How many threads a weight's rows are cut between: the kernels' own (``matvec_threads_*``, on the OpenMP
    runtime torch loaded), whole groups of four rows each; under 64 rows a thread, one thread."""

    def __init__(self, threads: int):
        self.threads = max(1, int(threads))


_ONE = RowSplit(1)


def bind(pw: PackedWeight, split: RowSplit = _ONE):
    """``f(x_K, out_N) -> out_N``: out = W x (+ bias) for contiguous fp32 vectors, its kernel and the weight's
    pointers taken once here (the decode step calls it for every weight of every token)."""
    fn = None if pw.fmt == "fp32" else pw.kernel()  # fp32: torch's (MKL's) product was faster (module docstring)
    bias = pw.bias_N
    if fn is None:  # fp32, or no C library: the product as tensors
        w = pw.data_NK if pw.fmt == "fp32" else pw.dequantize()

        def run(x_K: Tensor, out_N: Tensor) -> Tensor:
            torch.mv(w, x_K, out=out_N)
            return out_N if bias is None else out_N.add_(bias)
        return run
    held = (pw.data_NK, pw.scale_N)  # the closure keeps the tensors behind its pointers alive
    wp, K, N, threads = pw.data_NK.data_ptr(), pw.cols, pw.rows, split.threads
    sp = None if pw.scale_N is None else pw.scale_N.data_ptr()

    def run(x_K: Tensor, out_N: Tensor, held=held) -> Tensor:
        fn(x_K.data_ptr(), wp, sp, out_N.data_ptr(), K, N, threads)
        return out_N if bias is None else out_N.add_(bias)
    return run


def matvec(pw: PackedWeight, x_K: Tensor, out_N: Tensor, split: RowSplit = _ONE) -> Tensor:
    """out = W x (+ bias) for a contiguous fp32 vector x [K]; returns ``out`` ([N], contiguous fp32)."""
    return bind(pw, split)(x_K, out_N)
