"""Short causal depthwise convolution, the token shift in front of the recurrent stores.

Mamba (Gu and Dao, arXiv 2312.00752), GLA/DeltaNet (arXiv 2406.06484), Gated DeltaNet
(arXiv 2412.06464) and Kimi Linear (arXiv 2510.26692) pass q, k and v through a per-channel
causal convolution of width 4, followed by SiLU, before the recurrence:

    y_t[c] = act( sum_{i=0}^{W-1} w[c, i] * x_{t-W+1+i}[c] ).

Between calls the last W - 1 inputs are kept (the ``tail``), so a chunked prefill or a
token-by-token decode gives the same outputs as one pass; a fresh context starts from zeros.

Shape legend: B batch, T tokens, C channels, W kernel width.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["causal_conv1d"]


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
    full_BLC = torch.cat([tail_BWC.to(x_BTC.dtype), x_BTC], dim=1)               # L = T + W - 1
    y = F.conv1d(full_BLC.transpose(1, 2), weight_CW.to(x_BTC.dtype)[:, None, :], groups=C)  # B C T
    y_BTC = y.transpose(1, 2)
    if activation == "silu":
        y_BTC = F.silu(y_BTC)
    elif activation is not None:
        raise ValueError(f"activation: expected 'silu' or None, got {activation!r}")
    # a copy, not a view: the tail kept between calls must not hold the call's [B, T + W - 1, C] input
    return y_BTC, full_BLC[:, full_BLC.shape[1] - (W - 1):].clone()
