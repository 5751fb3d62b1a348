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


def _shifted_sum(full_BLC: Tensor, w_CW: Tensor) -> Tensor:
    """sum_i w[:, i] * full[:, i : i + T]: the convolution's pre-activation [B, T, C]."""
    W = w_CW.shape[-1]
    T = full_BLC.shape[1] - W + 1
    y = full_BLC[:, :T] * w_CW[:, 0]
    for i in range(1, W):
        y.addcmul_(full_BLC[:, i:i + T], w_CW[:, i])
    return y


class _ShortConv(torch.autograd.Function):
    """y = act(sum_i w[:, i] * full[:, i : i + T]) with its backward by hand (module docstring)."""

    @staticmethod
    def forward(ctx, full_BLC: Tensor, w_CW: Tensor, silu: bool) -> Tensor:
        pre = _shifted_sum(full_BLC, w_CW)
        ctx.save_for_backward(full_BLC, w_CW, pre if silu else None)
        ctx.silu = silu
        return F.silu(pre) if silu else pre

    @staticmethod
    def backward(ctx, dy_BTC: Tensor):
        full, w, pre = ctx.saved_tensors
        W, T = w.shape[-1], dy_BTC.shape[1]
        d = torch.ops.aten.silu_backward(dy_BTC, pre) if ctx.silu else dy_BTC.contiguous()  # B T C
        dfull = dw = None
        if ctx.needs_input_grad[0]:
            dfull = full.new_zeros(full.shape)
            for i in range(W):  # the transpose of the shifted sum: each tap sends d back to its input
                dfull[:, i:i + T].addcmul_(d, w[:, i])
        if ctx.needs_input_grad[1]:
            dw = torch.stack([(d * full[:, i:i + T]).sum((0, 1)) for i in range(W)], dim=1)  # (einsum: 18x slower)
        return dfull, dw, None


def causal_conv1d(x_BTC: Tensor, weight_CW: Tensor, *, tail_BWC: Tensor | None = None,
                  activation: str | None = "silu") -> tuple[Tensor, Tensor]:
    """Returns (y_BTC, new tail [B, W-1, C]); ``tail_BWC`` holds the previous W-1 inputs (zeros if None)."""
    B, T, C = x_BTC.shape
    W = weight_CW.shape[-1]
    if weight_CW.shape != (C, W):
        raise ValueError(f"weight_CW: expected shape [{C}, W], got {list(weight_CW.shape)}")
    if tail_BWC is None:
        tail_BWC = x_BTC.new_zeros(B, W - 1, C)
    elif tail_BWC.shape != (B, W - 1, C):
        raise ValueError(f"tail_BWC: expected shape {[B, W - 1, C]}, got {list(tail_BWC.shape)}")
    if T == 0:
        return x_BTC, tail_BWC
    if activation not in ("silu", None):
        raise ValueError(f"activation: expected 'silu' or None, got {activation!r}")
    full_BLC = torch.cat([tail_BWC.to(x_BTC.dtype), x_BTC], dim=1)               # L = T + W - 1
    y_BTC = _ShortConv.apply(full_BLC, weight_CW.to(x_BTC.dtype), activation == "silu")
    # a copy, not a view: the tail kept between calls must not hold the call's [B, T + W - 1, C] input
    return y_BTC, full_BLC[:, full_BLC.shape[1] - (W - 1):].clone()
