"""The gated short convolution (``short_conv``): LFM2's convolution layer, the smallest window there is.

LFM2 (Liquid AI, arXiv 2511.23404) mixes tokens in most of its layers with a gated, depthwise,
causal convolution of a few taps, after the gated short convolutions of H3 (Fu et al.,
arXiv 2212.14052) and Hyena (Poli et al., arXiv 2302.10866). For each token x_t:

  (b_t, c_t, u_t) = W_in x_t (+ bias)                  three D-vectors (LFM2's B, C, x, in that order)
  z_t = b_t * u_t                                      the input gate
  s_t = sum_{i=0}^{W-1} w[:, i] * z_{t-W+1+i} (+ bias) depthwise causal convolution of W taps
  y_t = W_out (c_t * s_t) (+ bias)                     the output gate, then the projection

Update rule: tail <- the last W - 1 gated inputs z (zeros before the first token). That tail is all
the store keeps between calls: W - 1 vectors of D whatever the context (LFM2: W = 3, so 2 vectors),
so chunked prefill then steps equals one pass. Nothing older than W - 1 tokens can be read.

``kernel``: "fused" is ``storelab.ops.conv.causal_conv1d`` (its C form on the CPU where it builds,
else W shifted multiply-adds with a hand-written backward), "reference" the plain depthwise
``F.conv1d`` over the tail and the new inputs; taken once at construction.

Parameters (D = d_model, W = conv_kernel): 3 D^2 + D W + D^2, plus 3D + D + D biases with ``bias``
(LFM2's ``conv_bias`` puts a bias on all three: in_proj, the convolution and out_proj).
State: (W - 1) D numbers per sequence, nothing per token.

Module parameters and transformers' names (``Lfm2ShortConv`` at ``model.layers.i.conv``):

  in_proj.weight  [3D, D]   conv.in_proj.weight (rows: B, C, x)
  in_proj.bias    [3D]      conv.in_proj.bias               (conv_bias)
  conv_weight     [D, W]    conv.conv.weight [D, 1, W] -> [D, W]
  conv_bias       [D]       conv.conv.bias                  (conv_bias)
  out_proj.weight [D, D]    conv.out_proj.weight
  out_proj.bias   [D]       conv.out_proj.bias              (conv_bias)

LFM2's ``conv_L_cache`` is ``conv_kernel`` here.

Shape legend: B batch, T tokens, D model width, W kernel width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from storelab.ops.conv import causal_conv1d
from storelab.state import State
from storelab.stores.base import (DTYPE_BYTES, STATE_DTYPES, TOKEN, Card, Footprint, MemoryTerms, ParamCount,
                                  StoreConfig, check_input, register)

__all__ = ["ShortConvConfig", "ShortConv", "ShortConvState", "short_conv_reference", "SHORT_CONV_KERNELS"]


def short_conv_reference(z_BTD: Tensor, weight_DW: Tensor, *, tail_BWC: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """The plain form: depthwise ``F.conv1d`` over [tail (zeros if None); z], no activation.
    Returns (s_BTD, the new tail [B, W - 1, D], a copy)."""
    B, T, D = z_BTD.shape
    W = weight_DW.shape[-1]
    tail = z_BTD.new_zeros(B, W - 1, D) if tail_BWC is None else tail_BWC.to(z_BTD.dtype)
    u_BLD = torch.cat([tail, z_BTD], dim=1)                                         # L = W - 1 + T
    s_BDT = F.conv1d(u_BLD.transpose(1, 2), weight_DW.to(z_BTD.dtype).unsqueeze(1), groups=D)
    return s_BDT.transpose(1, 2), u_BLD[:, u_BLD.shape[1] - (W - 1):].clone()


def _fused(z_BTD: Tensor, weight_DW: Tensor, *, tail_BWC: Tensor | None = None) -> tuple[Tensor, Tensor]:
    return causal_conv1d(z_BTD, weight_DW, tail_BWC=tail_BWC, activation=None)


SHORT_CONV_KERNELS = {"fused": _fused, "reference": short_conv_reference}


@dataclass
class ShortConvState(State):
    """The last W - 1 gated inputs, ``conv`` [B, W - 1, D] (zeros before the first token)."""

    conv: Tensor | None = None

    @property
    def entries(self) -> int:
        return 0 if self.conv is None else self.conv.shape[1]


@register("short_conv")
@dataclass(kw_only=True)
class ShortConvConfig(StoreConfig):
    """LFM2's gated short convolution (see the module docstring)."""

    d_model: int
    conv_kernel: int = 3                 # taps W (LFM2's conv_L_cache); keeps W - 1 inputs
    bias: bool = False                   # LFM2's conv_bias: in_proj, convolution and out_proj
    kernel: str = "fused"                # "fused" or "reference" (SHORT_CONV_KERNELS)

    SLOTS, FAMILY, CARD_ORDER = (TOKEN,), "window", 58
    CARD = Card(
        name="Short convolution (gated)",
        written_by="each token, through its input gate",
        holds="the last W - 1 gated inputs (2 in LFM2)",
        reading_costs="W - 1 vectors, one weight per channel each",
        forgets="everything older than W - 1 tokens",
        source="arXiv 2511.23404 (LFM2), 2212.14052 (H3), 2302.10866 (Hyena)",
    )

    def __post_init__(self):
        self.check_positive("d_model")
        self.check(isinstance(self.conv_kernel, int) and self.conv_kernel >= 2, "conv_kernel",
                   f"must be an int >= 2 (a kernel of 1 keeps nothing), got {self.conv_kernel!r}")
        self.check(self.kernel in SHORT_CONV_KERNELS, "kernel",
                   f"must be one of {tuple(SHORT_CONV_KERNELS)}, got {self.kernel!r}")

    def build(self) -> "ShortConv":
        return ShortConv(self)

    def footprint(self, context: int, *, dtype: str = "bf16") -> Footprint:
        # from the first token on, the tail holds W - 1 rows (zeros until W - 1 tokens have passed)
        kept = 0 if context == 0 else self.conv_kernel - 1
        return Footprint(context=context, kept=kept, read=kept,
                         state_bytes=math.ceil(kept * self.d_model * DTYPE_BYTES[dtype]),
                         read_flops=2 * kept * self.d_model, note="the last W - 1 gated inputs")

    def conv_input_bytes(self, fmt: str) -> float:
        return self.d_model * DTYPE_BYTES[fmt]

    def conv_width(self) -> int:
        return self.conv_kernel

    def memory_terms(self, *, cache: str = "bf16", state: str = "fp32") -> MemoryTerms:
        """Nothing grows with context: the W - 1 inputs of the tail, in ``state`` (as the recurrent stores' tails)."""
        self.check(state in STATE_DTYPES, "state dtype", f"unknown {state!r} (accepted: {', '.join(STATE_DTYPES)})")
        return MemoryTerms(per_sequence=(self.conv_kernel - 1) * self.d_model * DTYPE_BYTES[state])

    def num_params(self) -> ParamCount:
        D, W = self.d_model, self.conv_kernel
        n = 4 * D * D + D * W + (5 * D if self.bias else 0)
        return ParamCount(n, n)


class ShortConv(nn.Module):
    """y = W_out (c * conv(b * u)); ``forward(x, state) -> (y, ShortConvState)``."""

    def __init__(self, cfg: ShortConvConfig):
        super().__init__()
        self.cfg = cfg
        D, W = cfg.d_model, cfg.conv_kernel
        self.in_proj = nn.Linear(D, 3 * D, bias=cfg.bias)
        self.conv_weight = nn.Parameter(torch.randn(D, W) / math.sqrt(W))
        self.conv_bias = nn.Parameter(torch.zeros(D)) if cfg.bias else None
        self.out_proj = nn.Linear(D, D, bias=cfg.bias)
        self.conv = SHORT_CONV_KERNELS[cfg.kernel]

    def forward(self, x_BTD: Tensor, state: ShortConvState | None = None, *, token_ids: Tensor | None = None):
        check_input(x_BTD, self.cfg.d_model)
        state = ShortConvState() if state is None else state
        b_BTD, c_BTD, u_BTD = self.in_proj(x_BTD).chunk(3, dim=-1)
        s_BTD, tail = self.conv(b_BTD * u_BTD, self.conv_weight, tail_BWC=state.conv)
        if self.conv_bias is not None:
            s_BTD = s_BTD + self.conv_bias.to(s_BTD.dtype)
        y_BTD = self.out_proj(c_BTD * s_BTD)
        state.conv, state.seen = tail, state.seen + x_BTD.shape[1]
        return y_BTD, state
