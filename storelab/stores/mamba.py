"""Mamba (Gu and Dao, arXiv 2312.00752): a selective state space layer, one row of N numbers per channel.

For each token x_t (d_inner = E channels, N the state width per channel, R the step's rank):

  x, z     = W_in x_t                                         (in_proj: [E, E])
  u        = SiLU(short causal conv_W(x) + b_conv)              (tail of W-1 inputs kept between calls)
  dt_r, B, C = W_x u                                            (x_proj: [R, N, N]; optional RMS norms on each)
  dt       = softplus(W_dt dt_r + b_dt) > 0,  A = -exp(A_log)   (dt per channel; A [E, N])
  h_t      = exp(dt A) * h_{t-1} + dt B_t u_t                   (h [E, N]; storelab.ops.selective_scan)
  y_t      = W_out ((C_t . h_t + D u_t) * SiLU(z_t))

The step dt, B and C depend on the input: that is what makes the state space "selective" (the
paper's S6); A and D are fixed per channel.

Which transformers mixers it reproduces, from their config fields:

* ``mamba`` (``MambaMixer``): every field (d_inner = ``intermediate_size``, d_state = ``state_size``,
  dt_rank = ``time_step_rank``, conv_kernel, use_conv_bias, use_bias; ``bcdt_norm = "none"``).
  Tested on the same weights, with its cache after a prefill (tests/test_mamba.py).
* ``falcon_mamba`` (``FalconMambaMixer``): the same with RMS norms without weights on dt_r, B and C before
  they are used (``bcdt_norm = "weightless"``, ``bcdt_norm_eps`` = ``mixer_rms_eps``). Tested on the same weights.
* ``jamba`` (``JambaMambaMixer``): the same with weighted RMS norms there (``bcdt_norm = "weighted"``,
  ``bcdt_norm_eps`` = ``rms_norm_eps``; fields ``mamba_d_state``, ``mamba_d_conv``, ``mamba_expand``,
  ``mamba_dt_rank``, ``mamba_conv_bias``, ``mamba_proj_bias``). Tested on the same weights.

Parameters, their transformers names (``MambaMixer``; the norms' are Jamba's) and counts (D model
width, E d_inner, N d_state, R dt_rank, W conv width):

  ours          transformers              shape               count
  in_proj       in_proj.weight            [2E, D]             2 D E   (+ 2E: in_proj.bias, use_bias)
  conv_weight   conv1d.weight             [E, W] ([E, 1, W])  E W
  conv_bias     conv1d.bias               [E]                 E       (use_conv_bias)
  x_proj        x_proj.weight             [R + 2N, E]         E (R + 2N)
  dt_proj       dt_proj.weight, .bias     [E, R], [E]         R E + E
  A_log         A_log                     [E, N]              E N
  D             D                         [E]                 E
  out_proj      out_proj.weight           [D, E]              E D     (+ D: out_proj.bias, use_bias)
  dt_norm       dt_layernorm.weight       [R]                 R       (bcdt_norm "weighted")
  b_norm        b_layernorm.weight        [N]                 N       (bcdt_norm "weighted")
  c_norm        c_layernorm.weight        [N]                 N       (bcdt_norm "weighted")

in_proj's rows are [x, z] (transformers' order); x_proj's [dt_r, B, C].

State per layer, whatever the context L: h [E, N] in fp32 plus the conv tail of W - 1 inputs of E
channels in the entry dtype, 4 E N + (W - 1) E e bytes, e bytes per entry (``storelab.state.RecurrentState``:
``S`` [B, E, N], the recurrent state of MambaMixer's cache; ``conv`` [B, W-1, E], its conv state [B, E, W]
without the oldest column). ``footprint`` counts kept = read = E rows; reading costs 2 E N flops per token (C_t . h).

Shape legend: B batch, T tokens, D model width, E d_inner channels, N state width, R dt rank.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from storelab.ops.conv import causal_conv1d
from storelab.ops.norm import rms_norm
from storelab.ops.precision import at_least_fp32
from storelab.ops.selective_scan import MODES, selective_ssm
from storelab.state import RecurrentState
from storelab.stores.base import (TOKEN, DTYPE_BYTES, STATE_DTYPES, Card, Footprint, MemoryTerms, ParamCount,
                                  StoreConfig, Transition, check_input, register)

__all__ = ["MambaConfig", "MambaStore"]

BCDT_NORMS = ("none", "weightless", "weighted")


@register("mamba")
@dataclass(kw_only=True)
class MambaConfig(StoreConfig):
    d_model: int
    d_inner: int | None = None        # E: channels of the state; None = 2 * d_model (Mamba's expand = 2)
    d_state: int = 16                 # N: the state's width per channel, the length of B and C
    dt_rank: int | None = None        # R: rank of the step's projection; None = ceil(d_model / 16)
    conv_kernel: int = 4              # short causal convolution width over x
    use_conv_bias: bool = True
    use_bias: bool = False            # in_proj and out_proj biases
    bcdt_norm: str = "none"           # "none" (Mamba), "weightless" (Falcon-Mamba), "weighted" (Jamba)
    bcdt_norm_eps: float = 1e-6
    dt_min: float = 1e-3              # the step's initialisation range, dt ~ logU(dt_min, dt_max)
    dt_max: float = 0.1
    dt_init_floor: float = 1e-4
    chunk_size: int = 64              # tokens per chunk of the chunked scan
    mode: str = "chunk"               # "chunk" (fast) or "recurrent" (the per-token reference)

    SLOTS, FAMILY, RECURRENT = (TOKEN,), "recurrent", True
    CARD_ORDER = 112
    CARD = Card(
        name="Mamba / S6 (recurrent state)",
        written_by="each token, by adding dt x B to a row of N numbers per channel after a decay exp(dt A)",
        holds="N numbers per channel, d_inner rows; the input chooses what each step writes and keeps",
        reading_costs="a fixed-size state (d_inner rows of N), whatever the context length",
        forgets="by a learned, input-dependent decay exp(dt A), one per channel, state column and token",
        source="arXiv 2312.00752 (Mamba, selective state spaces)",
    )

    def __post_init__(self):
        if self.d_inner is None:
            self.d_inner = 2 * self.d_model
        if self.dt_rank is None:
            self.dt_rank = math.ceil(self.d_model / 16)
        self.check_positive("d_model", "d_inner", "d_state", "dt_rank", "conv_kernel", "chunk_size", "bcdt_norm_eps",
                            "dt_min", "dt_max", "dt_init_floor")
        self.check(self.dt_min <= self.dt_max, "dt_max", f"must be >= dt_min {self.dt_min}, got {self.dt_max}")
        self.check(self.bcdt_norm in BCDT_NORMS, "bcdt_norm", f"must be one of {BCDT_NORMS}, got {self.bcdt_norm!r}")
        for name in ("use_conv_bias", "use_bias"):
            value = getattr(self, name)
            self.check(isinstance(value, bool), name, f"must be true or false, got {value!r}")
        self.check(self.mode in MODES, "mode", f"must be one of {MODES}, got {self.mode!r}")

    @property
    def head_k_dim(self) -> int:
        """The state's key width, N (B_t plays the key and C_t the query of linear attention)."""
        return self.d_state

    def build(self) -> nn.Module:
        return MambaStore(self)

    @classmethod
    def parity_stores(cls, d_model: int, n_heads: int, head_dim: int) -> tuple[dict, ...]:
        """The section-6 parity experiment's table: ``n_heads`` * ``head_dim`` channels of ``head_dim`` numbers
        (the delta rules' state size), the chunked scan (its backward is written by hand)."""
        return ({"kind": cls.KIND, "d_inner": n_heads * head_dim, "d_state": head_dim},)

    def transition(self) -> Transition:
        """A decay per channel and state column: h_t = exp(dt A) * h_{t-1} + dt B u, exp(dt A) in (0, 1)."""
        return Transition("diag(exp(dt A)), one decay in (0, 1) per channel, state column and token",
                          diagonal=True, negative=False)

    def footprint(self, context: int, *, dtype: str = "bf16") -> Footprint:
        E, N = self.d_inner, self.d_state
        S_bytes = E * N * 4  # kept in fp32 whatever the entry dtype (as Mamba's cache keeps it)
        tail_bytes = math.ceil((self.conv_kernel - 1) * E * DTYPE_BYTES[dtype])
        return Footprint(context=context, kept=E, read=E, state_bytes=S_bytes + tail_bytes, read_flops=2 * E * N,
                         note="state rows (one of N per channel) per layer; the conv tail is counted in bytes")

    def conv_width(self) -> int:
        return self.conv_kernel

    def conv_input_bytes(self, fmt: str) -> float:
        """One input of the convolution, E channels (transformers' conv state keeps W of them, ours W - 1)."""
        return self.d_inner * DTYPE_BYTES[fmt]

    def memory_terms(self, *, cache: str = "bf16", state: str = "fp32") -> MemoryTerms:
        """Nothing grows with context: the state h [E, N] and the convolution's last W - 1 inputs, both in
        ``state`` (llama.cpp's s and r tensors of its Mamba layers)."""
        if state not in STATE_DTYPES:
            raise ValueError(f"state dtype: unknown {state!r} (accepted: {', '.join(STATE_DTYPES)})")
        numbers = self.d_inner * self.d_state + (self.conv_kernel - 1) * self.d_inner
        return MemoryTerms(per_sequence=numbers * DTYPE_BYTES[state])

    def num_params(self) -> ParamCount:
        D, E, N, R, W = self.d_model, self.d_inner, self.d_state, self.dt_rank, self.conv_kernel
        n = (2 * D * E + (2 * E if self.use_bias else 0) + E * W + (E if self.use_conv_bias else 0)
             + E * (R + 2 * N) + R * E + E + E * N + E + E * D + (D if self.use_bias else 0)
             + ((R + 2 * N) if self.bcdt_norm == "weighted" else 0))
        return ParamCount(n, n)


def _inverse_softplus(x: Tensor) -> Tensor:
    return x + torch.log(-torch.expm1(-x))


def _no_norm(x: Tensor, weight: Tensor | None, eps: float) -> Tensor:
    return x


class MambaStore(nn.Module):
    """One Mamba mixer; ``forward(x, state) -> (y, RecurrentState)`` (module docstring: the update, the
    parameters and their transformers names)."""

    def __init__(self, cfg: MambaConfig):
        super().__init__()
        self.cfg = cfg
        D, E, N, R, W = cfg.d_model, cfg.d_inner, cfg.d_state, cfg.dt_rank, cfg.conv_kernel
        self.in_proj = nn.Linear(D, 2 * E, bias=cfg.use_bias)
        self.conv_weight = nn.Parameter(torch.randn(E, W) / math.sqrt(W))
        self.conv_bias = nn.Parameter(torch.zeros(E)) if cfg.use_conv_bias else None
        self.x_proj = nn.Linear(E, R + 2 * N, bias=False)
        # Mamba's initialisation: W_dt ~ U(+-R^-1/2), dt ~ logU(dt_min, dt_max) kept as softplus^-1(dt),
        # A = -(1, 2, ..., N) per channel (S4D-real) kept as log(-A), D = 1
        self.dt_proj = nn.Linear(R, E, bias=True)
        with torch.no_grad():
            self.dt_proj.weight.uniform_(-R ** -0.5, R ** -0.5)
            dt = torch.empty(E).uniform_(math.log(cfg.dt_min), math.log(cfg.dt_max)).exp().clamp(min=cfg.dt_init_floor)
            self.dt_proj.bias.copy_(_inverse_softplus(dt))
        self.A_log = nn.Parameter(torch.arange(1, N + 1, dtype=torch.float32).log().expand(E, N).clone())
        self.D = nn.Parameter(torch.ones(E))
        self.out_proj = nn.Linear(E, D, bias=cfg.use_bias)
        weighted = cfg.bcdt_norm == "weighted"
        self.dt_norm = nn.Parameter(torch.ones(R)) if weighted else None
        self.b_norm = nn.Parameter(torch.ones(N)) if weighted else None
        self.c_norm = nn.Parameter(torch.ones(N)) if weighted else None
        self._norm = _no_norm if cfg.bcdt_norm == "none" else rms_norm   # chosen once

    def _dt_B_C(self, u_BTE: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """dt = softplus(W_dt dt_r + b_dt) [B, T, E] and B, C [B, T, N] from the convolved input, in at least fp32."""
        cfg = self.cfg
        dt_r, B_BTN, C_BTN = self.x_proj(u_BTE).split([cfg.dt_rank, cfg.d_state, cfg.d_state], dim=-1)
        eps = cfg.bcdt_norm_eps
        dt_r = self._norm(dt_r, self.dt_norm, eps)
        B_BTN, C_BTN = self._norm(B_BTN, self.b_norm, eps), self._norm(C_BTN, self.c_norm, eps)
        dt_BTE = F.softplus(at_least_fp32(F.linear(dt_r, self.dt_proj.weight)) + at_least_fp32(self.dt_proj.bias))
        return dt_BTE, at_least_fp32(B_BTN), at_least_fp32(C_BTN)

    def _conv(self, x_BTE: Tensor, tail: Tensor | None) -> tuple[Tensor, Tensor]:
        """u = SiLU(conv(x) + b_conv) and the new tail."""
        if self.conv_bias is None:
            return causal_conv1d(x_BTE, self.conv_weight, tail_BWC=tail, activation="silu")
        pre, tail = causal_conv1d(x_BTE, self.conv_weight, tail_BWC=tail, activation=None)
        return F.silu(pre + self.conv_bias.to(pre.dtype)), tail

    def _log_decay(self, x_BTD: Tensor) -> Tensor:
        """g = dt A <= 0, the log of what each step keeps, per channel and state column: [B, T, E, N]
        (the forgetting probes ask for it; the convolution reads x from a fresh context)."""
        x_BTE, _ = self.in_proj(x_BTD).chunk(2, dim=-1)
        u_BTE, _ = self._conv(x_BTE, None)
        dt_BTE, _, _ = self._dt_B_C(u_BTE)
        return dt_BTE[..., None] * -at_least_fp32(self.A_log).exp()

    def gate_params(self) -> dict[str, str]:
        """What ``_log_decay`` reads at x = 0 (parameter -> "zero" | "read", as ``RecurrentStore.gate_params``):
        in_proj's weight meets x, so it is zero there; the rest of the way to dt (in_proj's bias, the
        convolution, x_proj, dt_proj, the dt norm) and A_log are read: dt depends on u = SiLU(conv_bias) even
        at x = 0."""
        own = {n for n, p in self.named_parameters()}
        read = ("in_proj.bias", "conv_weight", "conv_bias", "x_proj.weight", "x_proj.bias", "dt_proj.weight",
                "dt_proj.bias", "dt_norm", "b_norm", "c_norm", "A_log")
        return {"in_proj.weight": "zero", **{n: "read" for n in read if n in own}}

    def forward(self, x_BTD: Tensor, state: RecurrentState | None = None, *, token_ids=None):
        cfg = self.cfg
        check_input(x_BTD, cfg.d_model)
        B, T, _ = x_BTD.shape
        state = state if state is not None else RecurrentState()
        x_BTE, z_BTE = self.in_proj(x_BTD).chunk(2, dim=-1)
        u_BTE, tail = self._conv(x_BTE, state.conv)
        dt_BTE, B_BTN, C_BTN = self._dt_B_C(u_BTE)
        u = at_least_fp32(u_BTE)
        o_BTE, S = selective_ssm(u, dt_BTE, -at_least_fp32(self.A_log).exp(), B_BTN, C_BTN, initial_state=state.S,
                                 output_final_state=True, chunk_size=cfg.chunk_size, mode=cfg.mode)
        o_BTE = (o_BTE + u * at_least_fp32(self.D)) * F.silu(at_least_fp32(z_BTE))
        y_BTD = self.out_proj(o_BTE.to(x_BTD.dtype))
        return y_BTD, RecurrentState(seen=state.seen + T, S=S, conv=tail)
