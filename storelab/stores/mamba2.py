"""Mamba-2 (Dao and Gu, arXiv 2405.21060): a scalar-decay recurrent state per head, written by an outer product.

For each token x_t (d_inner = H * P channels, G groups sharing B and C, N the state width):

  z, xBC, dt_raw = W_in x_t                                    (one projection: [d_inner, d_inner + 2 G N, H])
  x, B, C        = SiLU(short causal conv_W(xBC) + b_conv)     (tail of W-1 inputs kept between calls)
  dt             = clamp(softplus(dt_raw + dt_bias), dt_limit)  (per head; A = -exp(A_log))
  S_t            = exp(dt A) S_{t-1} + dt x_t B_t^T             (S [P, N] per head; storelab.ops.ssd)
  o_t            = S_t C_t + D x_t
  y_t            = W_out (w * RMSNorm_groups(o_t * SiLU(z_t)))  (the gate before the norm, as in Mamba-2)

The norm (``norm``) is transformers' ``MambaRMSNormGated``: an RMS over each group of d_inner / G channels
("group"), or over all d_inner ("full"), or none, the output then o * SiLU(z) (Falcon-H1's
``mamba_rms_norm = false``); ``norm_before_gate = true`` gates after the norm instead (Falcon-H1's option).

Which transformers mixers it reproduces, from their config fields:

* ``mamba2`` (``Mamba2Mixer``): every field (d_inner = expand * hidden = num_heads * head_dim; norm "group";
  dt_limit = ``time_step_limit``). Tested on the same weights (tests/test_mamba2.py).
* ``nemotron_h`` (``NemotronHMamba2Mixer``): the same, with dt_limit = (time_step_min, inf). Tested.
* ``bamba`` (``BambaMixer``), ``granitemoehybrid`` (``GraniteMoeHybridMambaLayer``): the same mixer under
  ``mamba_*`` names (eps = rms_norm_eps, dt_limit = time_step_limit). Tested.
* ``zamba2`` (``Zamba2MambaMixer``): the same with conv bias always, norm_eps 1e-5, dt_limit =
  (time_step_min, inf), in_proj / out_proj bias = ``add_bias_linear``. Tested.
* ``falcon_h1`` (``FalconH1Mixer``): the mixer's own fields fit (norm "none" or "group",
  ``mamba_norm_before_gate``, ``mamba_d_ssm`` = n_heads * head_dim), but its muP multipliers
  (``ssm_in_multiplier``, the per-section ``ssm_multipliers`` on in_proj's output) are not fields here: a
  reader folds them into in_proj's rows (and its bias) at load, W'[rows] = m_in * m_section * W[rows].
  Its out_proj bias (``projectors_bias``) differs from in_proj's (``mamba_proj_bias``): one ``use_bias``
  here, so a checkpoint with only one of the two needs the other zero.
Not covered: mamba_ssm's D per channel (``D_has_hdim``), and transformers' one-token step, which does not
clamp dt (ours clamps at every call, so with a lower limit above the step's dt the two differ there).

Parameters, their transformers names (``Mamba2Mixer``, for the checkpoint families) and counts
(D model width, H heads, P head width, N state width, G groups, W conv width, d_inner = H P,
C = d_inner + 2 G N conv channels, E = 2 d_inner + 2 G N + H):

  ours          transformers         shape               count
  in_proj       in_proj.weight       [E, D]              D E      (+ E: in_proj.bias, use_bias)
  conv_weight   conv1d.weight        [C, W] ([C, 1, W])  C W
  conv_bias     conv1d.bias          [C]                 C        (use_conv_bias)
  dt_bias       dt_bias              [H]                 H
  A_log         A_log                [H]                 H
  D             D                    [H]                 H
  norm_weight   norm.weight          [d_inner]           d_inner  (norm "group" or "full")
  out_proj      out_proj.weight      [D, d_inner]        d_inner D (+ D: out_proj.bias, use_bias)

In all D E + C W + 3 H + d_inner + d_inner D, plus the biases where configured (``num_params``).
in_proj's rows are in transformers' order [z, x, B, C, dt]; conv channels [x, B, C].

State per layer, whatever the context L: H matrices P x N in fp32 plus the conv tail of W - 1 inputs of
C channels in the entry dtype, 4 H P N + (W - 1) C e bytes, e the entry's bytes (``storelab.state.RecurrentState``:
``S`` [B, H, P, N], transformers' ``ssm_state``; ``conv`` [B, W-1, C], its ``conv_state`` [B, C, W] without the
oldest column). Reading costs 2 H P N flops per token (S C_t).

Shape legend: B batch, T tokens, D model width, H heads, P head width, G groups, N state width, C conv channels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from storelab.ops.conv import causal_conv1d
from storelab.ops.precision import at_least_fp32
from storelab.ops.ssd import MODES, ssd
from storelab.state import RecurrentState
from storelab.stores.base import (TOKEN, DTYPE_BYTES, STATE_DTYPES, Card, Footprint, MemoryTerms, ParamCount,
                                  StoreConfig, Transition, check_input, register)

__all__ = ["Mamba2Config", "Mamba2Store"]

NORMS = ("group", "full", "none")


@register("mamba2")
@dataclass(kw_only=True)
class Mamba2Config(StoreConfig):
    d_model: int
    n_heads: int
    head_dim: int = 64                # P: each head's width (its state is P x N)
    d_state: int = 128                # N: the state width, the length of B and C
    n_groups: int = 1                 # G: groups of heads sharing B and C (and the norm's groups)
    conv_kernel: int = 4              # short causal convolution width over [x, B, C]
    chunk_size: int = 64              # tokens per chunk of the chunked form
    norm_eps: float = 1e-5
    use_conv_bias: bool = True
    use_bias: bool = False            # in_proj and out_proj biases
    dt_min: float = 1e-3              # the step's initialisation range, dt ~ logU(dt_min, dt_max)
    dt_max: float = 0.1
    dt_init_floor: float = 1e-4
    # the step is clamped to [low, high] at every call; high may be inf (transformers' time_step_limit, no
    # upper limit), so the field is a plain tuple, checked here, not a tuple of the file format's finite floats
    dt_limit: tuple = (0.0, math.inf)
    norm: str = "group"               # "group" (RMS per group of d_inner / G), "full", "none" (o * SiLU(z))
    norm_before_gate: bool = False    # True: RMSNorm(o) * SiLU(z) (Falcon-H1's option); False: RMSNorm(o * SiLU(z))
    mode: str = "chunk"               # "chunk" (fast) or "recurrent" (the per-token reference)

    SLOTS, FAMILY, RECURRENT = (TOKEN,), "recurrent", True
    CARD_ORDER = 115
    CARD = Card(
        name="Mamba-2 / SSD (recurrent state)",
        written_by="each token, by adding an outer product dt x B^T after a scalar decay",
        holds="about N associations per head (a P x N matrix), B and C shared by a group of heads",
        reading_costs="a fixed-size matrix per head, whatever the context length",
        forgets="by a learned decay exp(dt A), one number per head and token; competitors pile up",
        source="arXiv 2405.21060 (Mamba-2, state space duality)",
    )

    def __post_init__(self):
        self.check_positive("d_model", "n_heads", "head_dim", "d_state", "n_groups", "conv_kernel", "chunk_size",
                            "norm_eps", "dt_min", "dt_max", "dt_init_floor")
        self.check(self.n_heads % self.n_groups == 0, "n_groups",
                   f"{self.n_groups} groups do not divide {self.n_heads} heads")
        self.check(self.dt_min <= self.dt_max, "dt_max", f"must be >= dt_min {self.dt_min}, got {self.dt_max}")
        lim = self.dt_limit
        numbers = isinstance(lim, tuple) and len(lim) == 2 and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in lim)
        self.check(numbers and math.isfinite(lim[0]) and 0.0 <= lim[0] < lim[1], "dt_limit",
                   f"must be [low, high] with 0 <= low < high (high may be inf), got {lim!r}")
        self.check(self.norm in NORMS, "norm", f"must be one of {NORMS}, got {self.norm!r}")
        for name in ("use_conv_bias", "use_bias", "norm_before_gate"):
            value = getattr(self, name)
            self.check(isinstance(value, bool), name, f"must be true or false, got {value!r}")
        self.check(self.mode in MODES, "mode", f"must be one of {MODES}, got {self.mode!r}")

    @property
    def d_inner(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def conv_channels(self) -> int:
        return self.d_inner + 2 * self.n_groups * self.d_state

    @property
    def in_width(self) -> int:
        """in_proj's rows: [z, x, B, C, dt]."""
        return self.d_inner + self.conv_channels + self.n_heads

    @property
    def head_k_dim(self) -> int:
        """The state's key width, N (B_t plays the key and C_t the query of linear attention)."""
        return self.d_state

    def build(self) -> nn.Module:
        return Mamba2Store(self)

    @classmethod
    def parity_stores(cls, d_model: int, n_heads: int, head_dim: int) -> tuple[dict, ...]:
        """The section-6 parity experiment's table: ``n_heads`` heads of P x N = ``head_dim`` x ``head_dim``
        (the delta rules' state size), one group, the chunked form (its backward is written by hand)."""
        return ({"kind": cls.KIND, "n_heads": n_heads, "head_dim": head_dim, "d_state": head_dim},)

    def transition(self) -> Transition:
        """A scalar decay per head: S_t = exp(dt A) S_{t-1} + dt x B^T, exp(dt A) in (0, 1)."""
        return Transition("exp(dt A) I, one decay in (0, 1) per head and token", diagonal=True, negative=False)

    def footprint(self, context: int, *, dtype: str = "bf16") -> Footprint:
        H, P, N = self.n_heads, self.head_dim, self.d_state
        S_bytes = H * P * N * 4  # kept in fp32 whatever the entry dtype (as Mamba-2's cache keeps it)
        tail_bytes = math.ceil((self.conv_kernel - 1) * self.conv_channels * DTYPE_BYTES[dtype])
        return Footprint(context=context, kept=H, read=H, state_bytes=S_bytes + tail_bytes,
                         read_flops=2 * H * P * N, note="matrices per layer; the conv tail is counted in bytes")

    def conv_width(self) -> int:
        return self.conv_kernel

    def conv_input_bytes(self, fmt: str) -> float:
        """One input of the convolution, C channels (transformers' conv state keeps W of them, ours W - 1)."""
        return self.conv_channels * DTYPE_BYTES[fmt]

    def memory_terms(self, *, cache: str = "bf16", state: str = "fp32") -> MemoryTerms:
        """Nothing grows with context: the matrices S [H, P, N] and the convolution's last W - 1 inputs,
        both in ``state`` (llama.cpp's s and r tensors of its Mamba-2 layers)."""
        if state not in STATE_DTYPES:
            raise ValueError(f"state dtype: unknown {state!r} (accepted: {', '.join(STATE_DTYPES)})")
        numbers = self.n_heads * self.head_dim * self.d_state + (self.conv_kernel - 1) * self.conv_channels
        return MemoryTerms(per_sequence=numbers * DTYPE_BYTES[state])

    def num_params(self) -> ParamCount:
        D, E, C, H, di = self.d_model, self.in_width, self.conv_channels, self.n_heads, self.d_inner
        n = (D * E + (E if self.use_bias else 0) + C * self.conv_kernel + (C if self.use_conv_bias else 0)
             + 3 * H + (di if self.norm != "none" else 0) + di * D + (D if self.use_bias else 0))
        return ParamCount(n, n)


def _inverse_softplus(x: Tensor) -> Tensor:
    return x + torch.log(-torch.expm1(-x))


class Mamba2Store(nn.Module):
    """One Mamba-2 mixer; ``forward(x, state) -> (y, RecurrentState)`` (module docstring: the update, the
    parameters and their transformers names)."""

    def __init__(self, cfg: Mamba2Config):
        super().__init__()
        self.cfg = cfg
        D, H, C, W = cfg.d_model, cfg.n_heads, cfg.conv_channels, cfg.conv_kernel
        self.in_proj = nn.Linear(D, cfg.in_width, bias=cfg.use_bias)
        self.conv_weight = nn.Parameter(torch.randn(C, W) / math.sqrt(W))
        self.conv_bias = nn.Parameter(torch.zeros(C)) if cfg.use_conv_bias else None
        # Mamba-2's initialisation: dt ~ logU(dt_min, dt_max) kept as softplus^-1(dt), A ~ U(1, 16) as log A, D = 1
        dt = torch.empty(H).uniform_(math.log(cfg.dt_min), math.log(cfg.dt_max)).exp().clamp(min=cfg.dt_init_floor)
        self.dt_bias = nn.Parameter(_inverse_softplus(dt))
        self.A_log = nn.Parameter(torch.empty(H).uniform_(1, 16).log())
        self.D = nn.Parameter(torch.ones(H))
        self.norm_weight = nn.Parameter(torch.ones(cfg.d_inner)) if cfg.norm != "none" else None
        self.out_proj = nn.Linear(cfg.d_inner, D, bias=cfg.use_bias)

    def _dt(self, dt_raw_BTH: Tensor) -> Tensor:
        """dt = clamp(softplus(dt_raw + dt_bias), dt_limit) > 0, in at least fp32: [B, T, H]."""
        lo, hi = self.cfg.dt_limit
        return F.softplus(at_least_fp32(dt_raw_BTH) + self.dt_bias).clamp(min=lo, max=hi)

    def _log_decay(self, x_BTD: Tensor) -> Tensor:
        """g = dt A <= 0, the log of what each step keeps of the state, one per head: [B, T, H]
        (the forgetting probes ask for it; only dt's rows of in_proj are computed)."""
        H = self.cfg.n_heads
        bias = None if self.in_proj.bias is None else self.in_proj.bias[-H:]
        return self._dt(F.linear(x_BTD, self.in_proj.weight[-H:], bias)) * -at_least_fp32(self.A_log).exp()

    def gate_params(self) -> dict[str, str]:
        """What ``_log_decay`` reads at x = 0 (parameter -> "zero" | "read", as ``RecurrentStore.gate_params``):
        in_proj's weight meets x, so it is zero there; its bias, dt_bias and A_log give the decay per head,
        -exp(A_log) clamp(softplus(dt_bias), dt_limit)."""
        return {"in_proj.weight": "zero", **({"in_proj.bias": "read"} if self.in_proj.bias is not None else {}),
                "dt_bias": "read", "A_log": "read"}

    def _gated_norm(self, o_BTI: Tensor, z_BTI: Tensor) -> Tensor:
        """transformers' MambaRMSNormGated (gate first unless norm_before_gate), in at least fp32."""
        cfg = self.cfg
        o, gate = at_least_fp32(o_BTI), F.silu(at_least_fp32(z_BTI))
        if cfg.norm == "none":
            return o * gate
        if not cfg.norm_before_gate:
            o = o * gate
        groups = cfg.n_groups if cfg.norm == "group" else 1
        o_BTgc = o.unflatten(-1, (groups, cfg.d_inner // groups))
        o = (o_BTgc * torch.rsqrt(o_BTgc.pow(2).mean(-1, keepdim=True) + cfg.norm_eps)).flatten(-2)
        o = o * at_least_fp32(self.norm_weight)
        return o * gate if cfg.norm_before_gate else o

    def forward(self, x_BTD: Tensor, state: RecurrentState | None = None, *, token_ids=None):
        cfg = self.cfg
        check_input(x_BTD, cfg.d_model)
        B, T, _ = x_BTD.shape
        H, P, G, N, di = cfg.n_heads, cfg.head_dim, cfg.n_groups, cfg.d_state, cfg.d_inner
        state = state if state is not None else RecurrentState()
        z_BTI, xBC_BTC, dt_raw_BTH = self.in_proj(x_BTD).split([di, cfg.conv_channels, H], dim=-1)
        xBC_BTC, tail = causal_conv1d(xBC_BTC, self.conv_weight, tail_BWC=state.conv, activation=None)
        if self.conv_bias is not None:
            xBC_BTC = xBC_BTC + self.conv_bias.to(xBC_BTC.dtype)
        xs_BTI, B_BTGN, C_BTGN = F.silu(xBC_BTC).split([di, G * N, G * N], dim=-1)
        o_BTHP, S = ssd(xs_BTI.reshape(B, T, H, P), self._dt(dt_raw_BTH), -at_least_fp32(self.A_log).exp(),
                        B_BTGN.reshape(B, T, G, N), C_BTGN.reshape(B, T, G, N), D=self.D, initial_state=state.S,
                        output_final_state=True, chunk_size=cfg.chunk_size, mode=cfg.mode)
        o_BTI = self._gated_norm(o_BTHP.reshape(B, T, di), z_BTI)
        y_BTD = self.out_proj(o_BTI.to(x_BTD.dtype))
        return y_BTD, RecurrentState(seen=state.seen + T, S=at_least_fp32(S), conv=tail)
