"""Gated stores over depth: a learned gate on the residual sum (``gated_residual``, Muse Spark) and
hyper-connections with sigmoid gates and no stream mixing (``hyper_connection``, Hunyuan V4).

Both follow the depth-mixer protocol of ``storelab.stores.depth`` (``init``, ``read``, ``write``,
``build_head``; a block is "read, normalise, mix, write"); like every depth store they keep nothing
from one token to the next, so ``footprint(L)`` is 0 at every context and what one token's pass
holds is ``depth_state_bytes``.

gated_residual (Meta's Muse Spark Open; transformers' ``MuseSparkResidualGate``)
--------------------------------------------------------------------------------
One running sum, as the plain residual, but each sublayer's write is weighed per channel by a
learned gate g [D] at temperature tau (``residual_gate_temperature``, 0.3):

  w = g / tau,  beta = sigmoid(w),  alpha = sqrt(max(sigmoid(-w) (1 + beta), eps))
  h_{l+1} = alpha * h_l + beta * F_l(h_l)

Unclamped, alpha^2 + beta^2 = (1 - beta)(1 + beta) + beta^2 = 1: the write is a rotation between
keeping the sum and taking the new output, so the sum's scale is preserved, not grown by each
block (eps = 1e-3 only keeps the square root's gradient finite). The gate is computed in fp32 (Muse
Spark keeps it in fp32) and the sum cast back. The head is the plain residual's (h itself). Muse
Spark also normalises each sublayer's output before the gate (``post_attention_layernorm``,
``post_feedforward_layernorm``): that norm belongs to the block, not to this store.
Parameters: D per sublayer (g; zero at the start: beta = 1/2, alpha = sqrt(3/4)); head none.
Per token the pass holds one vector of D.

  blocks.i.depth_token.gate    [D]  model.layers.i.post_attention_residual_gate.gate
  blocks.i.depth_channel.gate  [D]  model.layers.i.post_feedforward_residual_gate.gate
  (residual_gate_temperature -> temperature)

hyper_connection (Hyper-Connections, Zhu et al., arXiv 2409.19606; Tencent's Hunyuan V4, ``HYV4HyperConnection``)
-----------------------------------------------------------------------------------------------------------------
N residual streams X_l [N, D] (``hc_mult``), started as N copies of the embedding. Around each
sublayer, from z = RMSNorm(flatten X_l) W_l (no norm weight; W_l [2N, N D]):

  a = sigmoid(z_a * s_a + b_a) + eps                      (pre: the read's weights, N of them)
  c = magnitude * sigmoid(z_c * s_c + b_c) + eps          (post: the write's weights, N of them)
  x_l = sum_n a_n X_l[n];   X_{l+1}[n] = X_l[n] + c_n F_l(x_l)

This is DeepSeek-V4's mHC (``mhc``, arXiv 2512.24880) without its third output, the Sinkhorn mix
between streams: here each stream keeps itself whole and only adds the block's output, so the
streams differ only by how much of each output they took. ``magnitude`` (``hc_magnitude``, 2 as
in mHC) bounds c. Coefficients and sums in fp32, streams cast back. The head reads
h = sum_n a_n X_L[n] with its own a = sigmoid(z s + b) + eps, as mHC's head (``MHCHead``).
Parameters per mixer: 2N (N D + 1) + 2; head N (N D + 1) + 1. The start is Hunyuan V4's
(b_a = -log(N - 1), so a = 1/N and each read averages the streams, N >= 2; s = 0.01; W ~ 0.02 N(0, 1)).
Per token the pass holds N vectors of D.

  blocks.i.depth_token.weight   [2N, N D]  model.layers.i.attn_hc.fn
  blocks.i.depth_token.bias     [2N]       model.layers.i.attn_hc.base
  blocks.i.depth_token.scale    [2]        model.layers.i.attn_hc.scale
  blocks.i.depth_channel.*                 model.layers.i.ffn_hc.{fn, base, scale}
  depth_head.weight             [N, N D]   model.hc_head.hc_fn
  depth_head.bias               [N]        model.hc_head.hc_base
  depth_head.scale              [1]        model.hc_head.hc_scale
  (hc_mult -> n_streams, hc_magnitude -> magnitude, hc_eps -> eps, rms_norm_eps -> norm_eps)

Shape legend: B batch, T tokens, N streams, D model width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor, nn

from storelab.ops.precision import at_least_fp32
from storelab.stores.base import Card, ParamCount, check_input, register
from storelab.stores.depth import (DepthConfig, DepthMixer, DepthState, MHCHead, ResidualHead, ResidualState,
                                   mhc_coefficients, mhc_collapse)

__all__ = ["GatedResidualConfig", "GatedResidualMixer", "HyperConnectionConfig", "HyperConnectionMixer",
           "HyperState", "residual_gate"]


# ====================================================================== gated residual
def residual_gate(gate_D: Tensor, temperature: float, eps: float) -> tuple[Tensor, Tensor]:
    """(alpha, beta) of Muse Spark's gate, in at least fp32: beta = sigmoid(g / tau) on the output,
    alpha = sqrt(max(sigmoid(-g / tau) (1 + beta), eps)) on the sum."""
    w = at_least_fp32(gate_D) / temperature
    beta = torch.sigmoid(w)
    return torch.sqrt(torch.clamp(torch.sigmoid(-w) * (1.0 + beta), min=eps)), beta


class GatedResidualMixer(DepthMixer):
    """h_{l+1} = alpha * h_l + beta * F_l(h_l), alpha and beta per channel from the gate ``gate`` [D]."""

    def __init__(self, cfg: "GatedResidualConfig", sublayer: int, n_sublayers: int):
        super().__init__(cfg.d_model, sublayer, n_sublayers)
        self.cfg = cfg
        self.gate = nn.Parameter(torch.zeros(cfg.d_model))

    def init(self, h_BTD: Tensor) -> ResidualState:
        self._check_first(h_BTD)
        return ResidualState(h=h_BTD)

    def read(self, ds: ResidualState) -> Tensor:
        return ds.h

    def write(self, ds: ResidualState, y_BTD: Tensor) -> ResidualState:
        check_input(y_BTD, self.d_model, "y")
        alpha_D, beta_D = residual_gate(self.gate, self.cfg.temperature, self.cfg.eps)
        return ResidualState(h=(alpha_D * ds.h + beta_D * y_BTD).to(ds.h.dtype))


@register("gated_residual")
@dataclass(kw_only=True)
class GatedResidualConfig(DepthConfig):
    """Muse Spark's gated residual sum (see the module docstring)."""

    d_model: int
    temperature: float = 0.3             # Muse Spark's residual_gate_temperature
    eps: float = 1e-3                    # floor under alpha^2 (MuseSparkResidualGate's residual_gate_eps)

    CARD_ORDER = 185
    CARD: ClassVar[Card] = Card(
        name="Gated residual", written_by="each block, within one token's pass, through a learned gate per channel",
        holds="one running sum, of fixed scale", reading_costs="one vector",
        forgets="a learned share of the sum at every block (alpha^2 = 1 - beta^2)",
        source="Muse Spark Open (Meta; transformers' MuseSparkResidualGate)")

    def __post_init__(self):
        self.check_positive("d_model", "temperature", "eps")

    def build(self, *, sublayer: int, n_sublayers: int) -> GatedResidualMixer:
        self._check_build(sublayer, n_sublayers)
        return GatedResidualMixer(self, sublayer, n_sublayers)

    def build_head(self, *, n_sublayers: int) -> ResidualHead:
        self._check_build(0, n_sublayers)
        return ResidualHead()

    def num_params(self, *, n_sublayers: int | None = None) -> ParamCount:
        n = self.d_model * (1 if n_sublayers is None else n_sublayers)
        return ParamCount(n, n)

    def depth_state_bytes(self, d_model: int | None = None, dtype: str = "bf16", *, n_layers: int | None = None) -> int:
        return math.ceil(self._vector_bytes(d_model, dtype))


# ==================================================================== hyper-connections
@dataclass
class HyperState(DepthState):
    streams: Tensor                 # B T N D
    # this sublayer's (sublayer, pre, post), cached by read() for write(); not part of the held state
    pending: tuple | None = field(default=None, repr=False)

    def _tensors(self):
        return [self.streams]


class HyperConnectionMixer(DepthMixer):
    """X_{l+1} = X_l + c F_l(a X_l), a and c from X_l: ``weight`` [2N, N D], ``bias`` [2N], ``scale`` [2]."""

    def __init__(self, cfg: "HyperConnectionConfig", sublayer: int, n_sublayers: int):
        super().__init__(cfg.d_model, sublayer, n_sublayers)
        N = cfg.n_streams
        self.cfg = cfg
        self.weight = nn.Parameter(torch.randn(2 * N, N * cfg.d_model) * 0.02)
        self.bias = nn.Parameter(torch.cat([torch.full((N,), -math.log(max(N - 1, 1))), torch.zeros(N)]))
        self.scale = nn.Parameter(torch.full((2,), 0.01))

    def coefficients(self, streams_BTND: Tensor) -> tuple[Tensor, Tensor]:
        """(pre a [B, T, N], post c [B, T, N]) for these streams, in at least fp32."""
        c, N = self.cfg, self.cfg.n_streams
        a, p = mhc_coefficients(streams_BTND, self.weight, self.bias, self.scale, n_coef=(N, N), norm_eps=c.norm_eps)
        return torch.sigmoid(a) + c.eps, c.magnitude * torch.sigmoid(p) + c.eps

    def init(self, h_BTD: Tensor) -> HyperState:
        self._check_first(h_BTD)
        return HyperState(streams=h_BTD.unsqueeze(2).expand(-1, -1, self.cfg.n_streams, -1).contiguous())

    def _pending(self, ds: HyperState) -> tuple[Tensor, Tensor]:
        if ds.pending is None or ds.pending[0] != self.sublayer:
            ds.pending = (self.sublayer, *self.coefficients(ds.streams))
        return ds.pending[1:]

    def read(self, ds: HyperState) -> Tensor:
        pre_BTN, _ = self._pending(ds)
        return mhc_collapse(ds.streams, pre_BTN)

    def write(self, ds: HyperState, y_BTD: Tensor) -> HyperState:
        check_input(y_BTD, self.d_model, "y")
        _, post_BTN = self._pending(ds)
        s = at_least_fp32(ds.streams) + post_BTN.unsqueeze(-1) * at_least_fp32(y_BTD).unsqueeze(-2)
        return HyperState(streams=s.to(ds.streams.dtype))


@register("hyper_connection")
@dataclass(kw_only=True)
class HyperConnectionConfig(DepthConfig):
    """Hyper-connections with sigmoid gates, as in Hunyuan V4 (see the module docstring)."""

    d_model: int
    n_streams: int = 4                   # Hunyuan V4's hc_mult
    magnitude: float = 2.0               # hc_magnitude: c in (eps, magnitude + eps)
    eps: float = 1e-6                    # hc_eps, added to both gates
    norm_eps: float = 1e-5               # the coefficients' RMSNorm (Hunyuan V4's rms_norm_eps)

    CARD_ORDER = 190
    CARD: ClassVar[Card] = Card(
        name="Hyper-connection streams", written_by="each block, within one token's pass, gated per stream",
        holds="four running sums", reading_costs="a learned mix of the four",
        forgets="nothing is removed; each stream adds its share of every block",
        source="arXiv 2409.19606 (Hyper-Connections); Hunyuan V4 (Tencent; transformers' HYV4HyperConnection)")

    def __post_init__(self):
        self.check_positive("d_model", "n_streams", "magnitude")
        self.check(self.eps >= 0, "eps", f"must be >= 0, got {self.eps}")
        self.check(self.norm_eps >= 0, "norm_eps", f"must be >= 0, got {self.norm_eps}")

    def build(self, *, sublayer: int, n_sublayers: int) -> HyperConnectionMixer:
        self._check_build(sublayer, n_sublayers)
        return HyperConnectionMixer(self, sublayer, n_sublayers)

    def build_head(self, *, n_sublayers: int) -> MHCHead:
        """mHC's head: h = a X_L, a = sigmoid(RMSNorm(flatten X_L) W^T * s + b) + eps (Hunyuan V4's HYV4HyperHead)."""
        self._check_build(0, n_sublayers)
        return MHCHead(self)

    def num_params(self, *, n_sublayers: int | None = None) -> ParamCount:
        N, D = self.n_streams, self.d_model
        mixer = 2 * N * (N * D + 1) + 2
        if n_sublayers is None:
            return ParamCount(mixer, mixer)
        total = n_sublayers * mixer + N * (N * D + 1) + 1
        return ParamCount(total, total)

    def depth_state_bytes(self, d_model: int | None = None, dtype: str = "bf16", *, n_layers: int | None = None) -> int:
        return math.ceil(self.n_streams * self._vector_bytes(d_model, dtype))
