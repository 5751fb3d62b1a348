"""Short causal depthwise convolution, the token shift in front of the recurrent stores.

Mamba (Gu and Dao, arXiv 2312.00752), GLA/DeltaNet (arXiv 2406.06484), Gated DeltaNet
(arXiv 2412.06464) and Kimi Linear (arXiv 2510.26692) pass q, k and v through a per-channel
causal convolution of width 4, followed by SiLU, before the recurrence:

    y_t[c] = act( sum_{i=0}^{W-1} w[c, i] * x_{t-W+1+i}[c] ).

Between calls the last W - 1 inputs are kept (the ``tail``), so a chunked prefill or a
token-by-token decode gives the same outputs as one pass; a fresh context starts from zeros.

Two forms compute it, with the same sums. On a CPU in float32 / float64, a C kernel
(``kernels/short_conv.c``, built by ``storelab.ops.compiled``) makes the pre-activation in one pass over
the rows each way, SiLU then applied by torch: one GDN layer's convolution, forward + backward at
[4, 2,048, 128], 7.9 -> 2.3 ms (best of 12, one thread, the two forms interleaved). Elsewhere (or where it does not build) the sum runs as W shifted
multiply-adds in the [B, T, C] layout, with its backward written by hand (``_ShortConv``): the input's
gradient is the same sum shifted the other way, the weight's the W channel-wise dot products, and
SiLU's derivative is applied from the saved pre-activation. Depthwise ``F.conv1d`` wants [B, C, T]
and, for a kernel this short, spends more on the two layout copies and its own backward than on the
arithmetic (docs/bench.md).

Shape legend: B batch, T tokens, C channels, W kernel width.
"""

from __future__ import annotations

import ctypes

import torch
import torch.nn.functional as F
from torch import Tensor

from storelab.ops.compiled import compiled_library, in_threads

__all__ = ["causal_conv1d"]


def _taps(W: int, p: int, T: int):
    """Per tap i: (lo, s), the first output row it reaches and its shift. The input u holds p rows of
    history before the T new ones (p = 0: none, zeros before the start; p = W - 1: the tail), so output
    row t reads u[t + s] with s = i - (W - 1) + p, for the rows t >= lo where that index exists."""
    return [(max(0, -(i - (W - 1) + p)), i - (W - 1) + p) for i in range(W)]


class _ShortConv(torch.autograd.Function):
    """y_t = act(sum_i w[:, i] * u[t + s_i]) over an input u [B, p + T, C] (``_taps``), by hand both ways:
    the input's gradient is the same sum shifted the other way, the weight's W channel-wise dot products."""

    @staticmethod
    def forward(ctx, u_BLC: Tensor, w_CW: Tensor, T: int, silu: bool) -> Tensor:
        W, p = w_CW.shape[-1], u_BLC.shape[1] - T
        taps = _taps(W, p, T)
        pre = u_BLC[:, p:] * w_CW[:, W - 1]                                           # the last tap: s = p, every row
        for i, (lo, s) in enumerate(taps[:-1]):
            if lo < T:
                pre[:, lo:].addcmul_(u_BLC[:, lo + s:T + s], w_CW[:, i])
        ctx.save_for_backward(u_BLC, w_CW, pre if silu else None)
        ctx.T, ctx.silu = T, silu
        return F.silu(pre) if silu else pre

    @staticmethod
    def backward(ctx, dy_BTC: Tensor):
        u, w, pre = ctx.saved_tensors
        T, W = ctx.T, w.shape[-1]
        p = u.shape[1] - T
        taps = _taps(W, p, T)
        d = torch.ops.aten.silu_backward(dy_BTC, pre) if ctx.silu else dy_BTC.contiguous()  # B T C
        du = dw = None
        if ctx.needs_input_grad[0]:
            du = u.new_empty(u.shape)
            du[:, :p].zero_()
            torch.mul(d, w[:, W - 1], out=du[:, p:])                                  # the last tap writes every row
            for i, (lo, s) in enumerate(taps[:-1]):  # the others add, each into the input rows it read
                if lo < T:
                    du[:, lo + s:T + s].addcmul_(d[:, lo:], w[:, i])
        if ctx.needs_input_grad[1]:  # (einsum for these dot products is 18x slower)
            dw = torch.stack([(d[:, lo:] * u[:, lo + s:T + s]).sum((0, 1)) if lo < T else w.new_zeros(w.shape[0])
                              for lo, s in taps], dim=1)
        return du, dw, None, None


_P, _L = ctypes.c_void_p, ctypes.c_long
_SIGNATURES = {fn + suf: ([_P] * 3 + [_L] * 7, None) for suf in ("f32", "f64")
               for fn in ("conv_forward_", "conv_input_grad_", "conv_weight_grad_")}


def _library() -> ctypes.CDLL | None:
    return compiled_library("short_conv", _SIGNATURES)


def _compiled_fits(u: Tensor) -> bool:
    return u.device.type == "cpu" and u.dtype in (torch.float32, torch.float64) and _library() is not None


class _CompiledConv(torch.autograd.Function):
    """pre_t = sum_i w[:, i] * u[t + s_i] over u [B, p + T, C] (``_taps``), in C both ways (module docstring)."""

    @staticmethod
    def forward(ctx, u_BLC: Tensor, w_CW: Tensor, T: int) -> Tensor:
        lib, suf = _library(), "f64" if u_BLC.dtype == torch.float64 else "f32"
        u, wT = u_BLC.contiguous(), w_CW.t().contiguous()                            # wT [W, C]
        B, L, C = u.shape
        W = wT.shape[0]
        pre = u.new_empty(B, T, C)
        fn = getattr(lib, "conv_forward_" + suf)
        in_threads(lambda r0, r1: fn(u.data_ptr(), wT.data_ptr(), pre.data_ptr(), B, L, T, C, W, r0, r1), B * T,
                   torch.get_num_threads())
        ctx.save_for_backward(u, wT)
        ctx.suf = suf
        return pre

    @staticmethod
    def backward(ctx, d_BTC: Tensor):
        u, wT = ctx.saved_tensors
        lib, suf = _library(), ctx.suf
        d = d_BTC.to(u.dtype).contiguous()
        B, L, C = u.shape
        W, T = wT.shape[0], d.shape[1]
        threads = torch.get_num_threads()
        du = dw = None
        if ctx.needs_input_grad[0]:
            du = u.new_empty(B, L, C)
            fn = getattr(lib, "conv_input_grad_" + suf)
            in_threads(lambda r0, r1: fn(d.data_ptr(), wT.data_ptr(), du.data_ptr(), B, L, T, C, W, r0, r1), B * L,
                       threads)
        if ctx.needs_input_grad[1]:
            n = max(1, min(threads, B * T))
            parts = torch.zeros(n, W, C, dtype=torch.float64)                       # one sum per thread
            fn, cuts = getattr(lib, "conv_weight_grad_" + suf), [B * T * i // n for i in range(n + 1)]
            in_threads(lambda i, _: fn(u.data_ptr(), d.data_ptr(), parts[i].data_ptr(), B, L, T, C, W, cuts[i],
                                       cuts[i + 1]), n, n)
            dw = parts.sum(0).t().to(u.dtype)
        return du, dw, None


def causal_conv1d(x_BTC: Tensor, weight_CW: Tensor, *, tail_BWC: Tensor | None = None,
                  activation: str | None = "silu") -> tuple[Tensor, Tensor]:
    """Returns (y_BTC, new tail [B, W-1, C]); ``tail_BWC`` holds the previous W-1 inputs (zeros if None)."""
    B, T, C = x_BTC.shape
    W = weight_CW.shape[-1]
    if weight_CW.shape != (C, W):
        raise ValueError(f"weight_CW: expected shape [{C}, W], got {list(weight_CW.shape)}")
    if tail_BWC is not None and tail_BWC.shape != (B, W - 1, C):
        raise ValueError(f"tail_BWC: expected shape {[B, W - 1, C]}, got {list(tail_BWC.shape)}")
    if activation not in ("silu", None):
        raise ValueError(f"activation: expected 'silu' or None, got {activation!r}")
    if T == 0:
        return x_BTC, (x_BTC.new_zeros(B, W - 1, C) if tail_BWC is None else tail_BWC)
    # a fresh context reads zeros before its start, so it needs no history rows (no copy of x)
    u_BLC = x_BTC if tail_BWC is None else torch.cat([tail_BWC.to(x_BTC.dtype), x_BTC], dim=1)
    w_CW = weight_CW.to(x_BTC.dtype)
    if _compiled_fits(u_BLC):
        pre_BTC = _CompiledConv.apply(u_BLC, w_CW, T)
        y_BTC = F.silu(pre_BTC) if activation == "silu" else pre_BTC
    else:
        y_BTC = _ShortConv.apply(u_BLC, w_CW, T, activation == "silu")
    if u_BLC.shape[1] < W - 1:
        u_BLC = F.pad(u_BLC, (0, 0, W - 1 - u_BLC.shape[1], 0))
    # a copy, not a view: the tail kept between calls must not hold the call's input
    return y_BTC, u_BLC[:, u_BLC.shape[1] - (W - 1):].clone()
