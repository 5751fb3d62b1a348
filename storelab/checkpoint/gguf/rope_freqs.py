"""Llama 3's RoPE scaling read back from llama.cpp's ``rope_freqs.weight`` (per-frequency factors).

llama.cpp's converter (``convert_hf_to_gguf.py`` / ``conversion/llama.py``, ``LlamaModel.generate_extra_tensors``)
writes a ``rope_type: llama3`` scaling as no metadata but one F32 tensor of ``head_dim / 2`` factors, one per
rotary frequency ``inv_freq_i = theta^(-2i/d)`` (wavelength ``w_i = 2 pi / inv_freq_i``)::

    f_i = 1                              w_i < old / high   (high frequencies kept)
    f_i = factor                         w_i > old / low    (low frequencies interpolated)
    f_i = 1 / ((1 - s) / factor + s)     otherwise, s = (old / w_i - low) / (high - low) = a / w_i - b

with ``a = old / (high - low)``, ``b = low / (high - low)``; llama.cpp divides each frequency by its factor
(``ggml_rope_ext``'s ``freq_factors``), as transformers' ``_compute_llama3_parameters`` does. With ``s`` clamped
to [0, 1] the three cases are one formula, so only ``(factor, a, b)`` determine the factors: any
``original_max_position_embeddings`` gives the same model once ``low`` and ``high`` are solved for it.
``llama3_scaling`` takes 8192 (Llama 3's pretraining length, the converter's default), solves ``factor``
(the low frequencies' factor), ``a`` and ``b`` (from the middle ones) exactly, rebuilds every factor from
them and refuses the tensor by name when that does not give back what the file stores (an unknown
scaling). Why not the factors themselves: storelab's RoPE (``storelab.ops.rope``) computes published
scalings from their keys and the family reader passes ``rope_scaling`` through; this keeps the GGUF reader
on that one path.
"""

from __future__ import annotations

import math

import torch

from storelab.checkpoint.shards import CheckpointError

__all__ = ["llama3_scaling", "llama3_factors", "OLD_CONTEXT"]

OLD_CONTEXT = 8192   # the original_max_position_embeddings the reconstruction is stated for
RTOL = 1e-5          # rebuilt vs stored factors: fp32 rounding of the converter's double arithmetic, amplified
                     # by solving from two of them


def llama3_factors(inv_freq: list[float], factor: float, a: float, b: float) -> list[float]:
    """The converter's factors for ``(factor, a, b)`` (the three cases as one, ``s`` clamped to [0, 1])."""
    out = []
    for x in inv_freq:
        s = min(max(a * x / (2 * math.pi) - b, 0.0), 1.0)
        out.append(1.0 / ((1.0 - s) / factor + s))
    return out


def _inv_freq(theta: float, dim: int) -> list[float]:
    """As the converter and transformers compute them: fp32 torch."""
    return (1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))).tolist()


def llama3_scaling(f: list[float], *, theta: float, dim: int, where: str) -> dict | None:
    """transformers' ``rope_scaling`` (rope_type llama3, ``original_max_position_embeddings`` ``OLD_CONTEXT``)
    whose factors are ``f``; None when every factor is 1 (no scaling), ``linear`` when all are one factor > 1.
    ``where`` names the file and tensor in errors."""
    n = dim // 2
    if len(f) != n or not all(math.isfinite(v) and v > 0 for v in f):
        raise CheckpointError(f"{where}: {len(f)} factors, must be {n} (head_dim {dim} / 2) finite numbers > 0")
    inv = _inv_freq(theta, dim)
    x = [v / (2 * math.pi) for v in inv]   # 1 / wavelength, falling with i
    F = max(f)
    if _close(F, 1.0):
        return None
    if all(_close(v, F) for v in f):
        return {"rope_type": "linear", "factor": F}
    high = [i for i, v in enumerate(f) if _close(v, 1.0)]
    low = [i for i, v in enumerate(f) if _close(v, F)]
    mid = [i for i in range(n) if i not in high and i not in low]
    if not low:
        raise CheckpointError(f"{where}: no frequency at the largest factor {F}: not Llama 3's scaling (its factor "
                              "cannot be told from the file)")
    s = {i: (1.0 / f[i] - 1.0 / F) / (1.0 - 1.0 / F) for i in mid}   # from 1/f = (1 - s)/F + s
    xl = max(x[i] for i in low)                          # the fastest interpolated frequency: s <= 0 there
    xh = min((x[i] for i in high), default=None)         # the slowest kept one: s >= 1 there
    if len(mid) >= 2:   # the line s = a x - b through the outermost two middle frequencies
        i, j = mid[0], mid[-1]
        a = (s[i] - s[j]) / (x[i] - x[j])
        b = a * x[i] - s[i]
    elif mid:           # one: the line through it, steep enough to keep its neighbours on their sides
        xm, sm = x[mid[0]], s[mid[0]]
        a = max((1.0 - sm) / (xh - xm) if xh is not None else 0.0, sm / (xm - xl))
        b = a * xm - sm
    else:               # none: s = 0 at the fastest interpolated frequency, 1 at the slowest kept one
        a = 1.0 / (xh - xl) if xh is not None else 1.0 / xl
        b = a * xl
    rebuilt = llama3_factors(inv, F, a, b)
    bad = [i for i in range(n) if not _close(rebuilt[i], f[i])]
    if a <= 0 or b <= 0 or bad:
        k = bad[0] if bad else 0
        raise CheckpointError(f"{where}: the factors are not Llama 3's scaling (rope_type llama3): no (factor, "
                              f"low_freq_factor, high_freq_factor) gives them back (factor {k}: stored {f[k]!r}, "
                              f"rebuilt {rebuilt[k]!r}); an unknown RoPE scaling is not read")
    low_ff, high_ff = b * OLD_CONTEXT / a, (1.0 + b) * OLD_CONTEXT / a
    nice = float(f"{low_ff:.6g}"), float(f"{high_ff:.6g}")   # 1.0000000588 -> 1.0 where that changes no factor
    na, nb = OLD_CONTEXT / (nice[1] - nice[0]), nice[0] / (nice[1] - nice[0])
    if all(_close(u, v) for u, v in zip(llama3_factors(inv, F, na, nb), f)):
        low_ff, high_ff = nice
    return {"rope_type": "llama3", "factor": F, "low_freq_factor": low_ff, "high_freq_factor": high_ff,
            "original_max_position_embeddings": OLD_CONTEXT}


def _close(u: float, v: float) -> bool:
    return abs(u - v) <= RTOL * max(abs(u), abs(v))
