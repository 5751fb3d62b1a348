"""Short causal depthwise convolution, the token shift in front of the recurrent stores.

Mamba (Gu and Dao, arXiv 2312.00752), GLA/DeltaNet (arXiv 2406.06484), Gated DeltaNet
(arXiv 2412.06464) and Kimi Linear (arXiv 2510.26692) pass q, k and v through a per-channel
causal convolution of width 4, followed by SiLU, before the recurrence:

    y_t[c] = act( sum_{i=0}^{W-1} w[c, i] * x_{t-W+1+i}[c] ).

Between calls the last W - 1 inputs are kept (the ``tail``), so a chunked prefill or a
token-by-token decode gives the same outputs as one pass; a fresh context starts from zeros.

The sum runs as W shifted multiply-adds in the [B, T, C] layout, with its backward written by hand
(``_ShortConv``): the input's gradient is the same sum shifted the other way, the weight's the W
channel-wise dot products, and SiLU's derivative is applied from the saved pre-activation. Depthwise
``F.conv1d`` wants [B, C, T] and, for a kernel this short, spends more on the two layout copies and
its own backward than on the arithmetic (docs/bench.md).

Shape legend: B batch, T tokens, C channels, W kernel width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

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
    y_BTC = _ShortConv.apply(u_BLC, weight_CW.to(x_BTC.dtype), T, activation == "silu")
    if u_BLC.shape[1] < W - 1:
        u_BLC = F.pad(u_BLC, (0, 0, W - 1 - u_BLC.shape[1], 0))
    # a copy, not a view: the tail kept between calls must not hold the call's input
    return y_BTC, u_BLC[:, u_BLC.shape[1] - (W - 1):].clone()
