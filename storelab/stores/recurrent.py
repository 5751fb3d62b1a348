"""The recurrent stores: a fixed-size matrix per head that every token updates (essay section 3).

Four kinds, one pipeline. For each token x_t:

  q, k, v = SiLU(short causal conv_4([W_q x; W_k x; W_v x]))   (tail of 3 inputs kept between calls)
  q, k    = L2-normalised per head
  S_t     = update(S_{t-1}; k_t, v_t, gates)                       (storelab.ops.delta)
  o_t     = S_t^T q_t / sqrt(K),  y_t = W_o norm(o_t) [* output gate]

* ``linear_attention`` (Katharopoulos et al., arXiv 2006.16236): S_t = a S_{t-1} + k_t v_t^T,
  with ``decay = "none"`` (a = 1) or ``"fixed"`` (RetNet's per-head a_h = 1 - 2^(-5-h), arXiv 2307.08621).
* ``deltanet`` (Schlag, Irie and Schmidhuber, arXiv 2102.11174; chunked as in arXiv 2406.06484):
  S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T, beta_t = beta_max * sigmoid(W_b x_t).
* ``gated_deltanet`` (Yang, Kautz and Hatamizadeh, arXiv 2412.06464; layout of Qwen3-Next's
  ``Qwen3NextGatedDeltaNet``): S' = exp(g_t) S_{t-1}, then the delta write, with one decay per value head
  g_t = -exp(A_log) * softplus(W_a x_t + dt_bias); ``n_heads`` query/key heads serve ``n_v_heads`` value
  heads; output RMSNorm(o) * SiLU(W_z x).
* ``kda`` (Kimi Linear, arXiv 2510.26692; ``KimiLinearDeltaAttention``): the same with one decay per key
  channel from a low-rank gate, f = W_fb W_fa x_t; g = -exp(A_log) softplus(f + dt_bias), or with
  ``gate_lower_bound = lb`` (Kimi K3's published -5; transformers' Glm5Next "safe gate")
  g = lb * sigmoid(exp(A_log) (f + dt_bias)), so each step keeps at least e^lb; output
  RMSNorm(o) * sigmoid(W_gb W_ga x_t).

The write step beta lies in (0, beta_max); beta_max = 1 as in both released models, up to 2 lets
I - beta k k^T have a negative eigenvalue (essay section 6: Olmo Hybrid, arXiv 2604.03444; Complex KDA,
arXiv 2609.24797).

Parameters (D d_model, H q/k heads, HV value heads (= H except gated_deltanet), K, V head widths,
C = 2HK + HV*V conv channels, W conv_kernel, r gate_rank):
  linear_attention  D*C + C*W + V + HV*V*D
  deltanet          + D*H                                  (beta)
  gated_deltanet    + D*HV*V + 2*D*HV + 2*HV               (z, beta and decay projections, A_log, dt_bias)
  kda               + D*H + D*r + r*H*K + H*K + H + D*r + r*HV*V   (beta, forget gate, output gate)
State per layer, whatever the context L: HV matrices K x V kept in fp32 (as Qwen3-Next keeps them) plus
the conv tail of W-1 inputs x C channels in the entry dtype, HV*K*V*4 + (W-1)*C*bytes bytes; per token
that falls as 1/L. ``footprint`` counts kept = read = HV matrices; reading costs 2*HV*K*V flops for
the query, twice that for the delta rules (the write first reads the prediction S^T k).

On CUDA, the chunked Gated DeltaNet and KDA stores run fla's Triton kernels when fla is installed
(``storelab.ops.fla``; chosen once at construction, ``STORELAB_FLA=0`` turns it off); elsewhere, and
for the other kinds, storelab's own chunked forms.

Shape legend: B batch, T tokens, D model width, H q/k heads, HV value heads, K key width, V value width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from storelab.ops.conv import causal_conv1d
from storelab.ops import fla as fla_dispatch
from storelab.ops.delta import MODES, delta_rule, gated_delta_rule, kda, linear_attention
from storelab.ops.norm import l2_norm, rms_norm
from storelab.state import RecurrentState
from storelab.stores.base import TOKEN, DTYPE_BYTES, Card, Footprint, ParamCount, StoreConfig, check_input, register

__all__ = ["LinearAttentionConfig", "DeltaNetConfig", "GatedDeltaNetConfig", "KDAConfig", "RecurrentStore"]

_FLA_OP = {"gated_deltanet": "gated_delta_rule", "kda": "kda"}  # store kind -> fla kernel of the same rule
_HOLDS = "about d clean associations per head (a d x d matrix)"
_READS = "a fixed-size matrix per head, whatever the context length"


@dataclass(kw_only=True)
class _RecurrentConfig(StoreConfig):
    """Fields every recurrent store shares (not a store kind itself)."""

    d_model: int
    n_heads: int                      # query/key heads (and value heads unless n_v_heads says otherwise)
    head_k_dim: int
    head_v_dim: int | None = None     # None = head_k_dim
    conv_kernel: int = 4              # short causal convolution width; 1 = no mixing across tokens
    chunk_size: int = 32              # tokens per step of the chunkwise-parallel form
    norm_eps: float = 1e-6            # output RMSNorm
    mode: str = "chunk"               # "chunk" (fast), "recurrent" (reference loop) or "scan"

    DELTA = True
    SLOTS, FAMILY, RECURRENT = (TOKEN,), "recurrent", True

    def __post_init__(self):
        if self.head_v_dim is None:
            self.head_v_dim = self.head_k_dim
        self.check_positive("d_model", "n_heads", "head_k_dim", "head_v_dim", "conv_kernel", "chunk_size", "norm_eps")
        self.check(self.mode in MODES, "mode", f"must be one of {MODES}, got {self.mode!r}")
        bm = getattr(self, "beta_max", None)
        if bm is not None:
            self.check(0.0 < bm <= 2.0, "beta_max", f"must be in (0, 2], got {bm}")

    @property
    def n_value_heads(self) -> int:
        return self.n_heads

    @property
    def conv_channels(self) -> int:
        return 2 * self.n_heads * self.head_k_dim + self.n_value_heads * self.head_v_dim

    def build(self) -> nn.Module:
        return RecurrentStore(self)

    def footprint(self, context: int, *, dtype: str = "bf16") -> Footprint:
        HV, K, V = self.n_value_heads, self.head_k_dim, self.head_v_dim
        S_bytes = HV * K * V * 4  # the state is kept in fp32 whatever the entry dtype (as Qwen3-Next keeps it)
        tail_bytes = math.ceil((self.conv_kernel - 1) * self.conv_channels * DTYPE_BYTES[dtype])
        reads = 2 if self.DELTA else 1  # the delta write reads S^T k before the query reads S^T q
        return Footprint(context=context, kept=HV, read=HV, state_bytes=S_bytes + tail_bytes,
                         read_flops=2 * reads * HV * K * V, note="matrices per layer; the conv tail is counted in bytes")

    def _base_params(self) -> int:
        D, C, W, V, HVV = self.d_model, self.conv_channels, self.conv_kernel, self.head_v_dim, self.n_value_heads * self.head_v_dim
        return D * C + C * W + V + HVV * D

    def num_params(self) -> ParamCount:
        n = self._base_params() + self._extra_params()
        return ParamCount(n, n)

    def _extra_params(self) -> int:  # pragma: no cover - each kind says
        raise NotImplementedError


@register("linear_attention")
@dataclass(kw_only=True)
class LinearAttentionConfig(_RecurrentConfig):
    decay: str = "none"               # "none" or "fixed" (RetNet's per-head constant decay)

    DELTA = False
    CARD_ORDER = 120
    CARD = Card(
        name="Linear attention (recurrent state)",
        written_by="each token, by adding an outer product k v^T",
        holds=_HOLDS + "; past about d entries, interference grows as (M/d)^(1/2)",
        reading_costs=_READS,
        forgets="nothing, or a fixed per-head decay; competitors pile up",
        source="arXiv 2006.16236 (linear attention), 2307.08621 (fixed decay)",
    )

    def __post_init__(self):
        super().__post_init__()
        self.check(self.decay in ("none", "fixed"), "decay", f"must be 'none' or 'fixed', got {self.decay!r}")

    def _extra_params(self) -> int:
        return 0


@register("deltanet")
@dataclass(kw_only=True)
class DeltaNetConfig(_RecurrentConfig):
    beta_max: float = 1.0             # write step in (0, beta_max); up to 2 (essay section 6)

    CARD_ORDER = 130
    CARD = Card(
        name="DeltaNet (recurrent state)",
        written_by="each token, by a delta-rule correction",
        holds=_HOLDS,
        reading_costs=_READS,
        forgets="by overwriting",
        source="arXiv 2102.11174 (delta rule), 2406.06484 (chunked DeltaNet)",
    )

    def _extra_params(self) -> int:
        return self.d_model * self.n_heads


@register("gated_deltanet")
@dataclass(kw_only=True)
class GatedDeltaNetConfig(_RecurrentConfig):
    n_v_heads: int | None = None      # value heads (Qwen3-Next: more than q/k heads); None = n_heads
    beta_max: float = 1.0

    CARD_ORDER = 140
    CARD = Card(
        name="Gated DeltaNet (recurrent state)",
        written_by="each token, by a delta-rule correction",
        holds=_HOLDS,
        reading_costs=_READS,
        forgets="by a learned decay, one number per head and token, and by overwriting",
        source="arXiv 2412.06464 (Gated DeltaNet, as in Qwen3-Next and Qwen3.8)",
    )

    def __post_init__(self):
        if self.n_v_heads is None:
            self.n_v_heads = self.n_heads
        super().__post_init__()
        self.check_positive("n_v_heads")
        self.check(self.n_v_heads % self.n_heads == 0, "n_v_heads",
                   f"{self.n_v_heads} value heads are not a multiple of {self.n_heads} query/key heads")

    @property
    def n_value_heads(self) -> int:
        return self.n_v_heads

    def _extra_params(self) -> int:
        D, HV = self.d_model, self.n_v_heads
        return D * HV * self.head_v_dim + 2 * D * HV + 2 * HV


@register("kda")
@dataclass(kw_only=True)
class KDAConfig(_RecurrentConfig):
    beta_max: float = 1.0
    gate_rank: int | None = None      # rank of the forget and output gates; None = head_k_dim (Kimi)
    gate_lower_bound: float | None = -5.0  # Kimi K3's published bound; None = Kimi Linear's softplus gate

    CARD_ORDER = 150
    CARD = Card(
        name="KDA (recurrent state)",
        written_by="each token, by a delta-rule correction",
        holds=_HOLDS,
        reading_costs=_READS,
        forgets="by a learned decay per key channel, and by overwriting",
        source="arXiv 2510.26692 (Kimi Delta Attention, as in Kimi Linear and Kimi K3)",
    )

    def __post_init__(self):
        if self.gate_rank is None:
            self.gate_rank = self.head_k_dim
        super().__post_init__()
        self.check_positive("gate_rank")
        self.check(self.gate_lower_bound is None or self.gate_lower_bound < 0, "gate_lower_bound",
                   f"must be < 0 (a log retention) or None, got {self.gate_lower_bound}")

    def _extra_params(self) -> int:
        D, H, K, V, r = self.d_model, self.n_heads, self.head_k_dim, self.head_v_dim, self.gate_rank
        return D * H + D * r + r * H * K + H * K + H + D * r + r * H * V


def _inverse_softplus(x: Tensor) -> Tensor:
    return x + torch.log(-torch.expm1(-x))


class RecurrentStore(nn.Module):
    """One recurrent layer of any of the four kinds; ``forward(x, state) -> (y, RecurrentState)``.

    A chunked Gated DeltaNet or KDA store looks up fla's kernel of its rule once, at construction
    (``storelab.ops.fla.fla_kernels``), and runs it on CUDA tensors; ``backend`` says what it found.
    """

    def __init__(self, cfg: _RecurrentConfig):
        super().__init__()
        self.cfg = cfg
        D, H, HV, K, V = cfg.d_model, cfg.n_heads, cfg.n_value_heads, cfg.head_k_dim, cfg.head_v_dim
        self.kind = cfg.KIND
        self.q_proj = nn.Linear(D, H * K, bias=False)
        self.k_proj = nn.Linear(D, H * K, bias=False)
        self.v_proj = nn.Linear(D, HV * V, bias=False)
        self.conv_weight = nn.Parameter(torch.randn(cfg.conv_channels, cfg.conv_kernel) / math.sqrt(cfg.conv_kernel))
        self.o_norm = nn.Parameter(torch.ones(V))
        self.o_proj = nn.Linear(HV * V, D, bias=False)
        if cfg.DELTA:
            self.b_proj = nn.Linear(D, HV, bias=False)
        if self.kind == "linear_attention" and cfg.decay == "fixed":
            self.register_buffer("log_decay", torch.log1p(-torch.pow(2.0, -5.0 - torch.arange(H, dtype=torch.float32))),
                                 persistent=False)
        if self.kind == "gated_deltanet":
            # Qwen3-Next / fla initialisation: A ~ U(0, 16), dt ~ logU(1e-3, 1e-1) stored as softplus^-1(dt)
            self.z_proj = nn.Linear(D, HV * V, bias=False)
            self.a_proj = nn.Linear(D, HV, bias=False)
            self.A_log = nn.Parameter(torch.empty(HV).uniform_(1e-2, 16).log())
            self.dt_bias = nn.Parameter(_inverse_softplus(torch.empty(HV).uniform_(math.log(1e-3), math.log(1e-1)).exp()))
        if self.kind == "kda":
            r = cfg.gate_rank
            self.f_a_proj = nn.Linear(D, r, bias=False)
            self.f_b_proj = nn.Linear(r, H * K, bias=False)
            self.g_a_proj = nn.Linear(D, r, bias=False)
            self.g_b_proj = nn.Linear(r, H * V, bias=False)
            A = torch.zeros(H) if cfg.gate_lower_bound is not None else torch.empty(H).uniform_(1, 16).log()
            self.A_log = nn.Parameter(A)
            self.dt_bias = nn.Parameter(_inverse_softplus(torch.empty(H * K).uniform_(math.log(1e-3), math.log(1e-1)).exp()))
        op = _FLA_OP.get(self.kind)
        self._fla = fla_dispatch.fla_kernels([op]) if op is not None and cfg.mode == "chunk" else {}  # op -> kernel

    @property
    def backend(self) -> str:
        """What construction found: "fla" (fla's kernel of this rule, run on CUDA tensors) or "torch"."""
        return "fla" if self._fla else "torch"

    # -- gates ---------------------------------------------------------------------
    def _beta(self, x_BTD: Tensor) -> Tensor:
        return torch.sigmoid(self.b_proj(x_BTD).float()) * self.cfg.beta_max                  # B T HV

    def _log_decay(self, x_BTD: Tensor) -> Tensor | None:
        """g <= 0: the log of what each step keeps of the old state."""
        if self.kind == "gated_deltanet":
            return -self.A_log.float().exp() * F.softplus(self.a_proj(x_BTD).float() + self.dt_bias)  # B T HV
        if self.kind == "kda":
            B, T, _ = x_BTD.shape
            f = (self.f_b_proj(self.f_a_proj(x_BTD)).float() + self.dt_bias.float()).view(B, T, self.cfg.n_heads,
                                                                                          self.cfg.head_k_dim)
            rate = self.A_log.float().exp()[:, None]                                          # H 1
            lb = self.cfg.gate_lower_bound
            return lb * torch.sigmoid(rate * f) if lb is not None else -rate * F.softplus(f)    # B T H K
        if self.kind == "linear_attention" and self.cfg.decay == "fixed":
            return self.log_decay.expand(x_BTD.shape[0], x_BTD.shape[1], -1)
        return None

    def _output_gate(self, x_BTD: Tensor, B: int, T: int) -> Tensor | None:
        HV, V = self.cfg.n_value_heads, self.cfg.head_v_dim
        if self.kind == "gated_deltanet":
            return F.silu(self.z_proj(x_BTD).float()).view(B, T, HV, V)
        if self.kind == "kda":
            return torch.sigmoid(self.g_b_proj(self.g_a_proj(x_BTD)).float()).view(B, T, HV, V)
        return None

    # -- the store -------------------------------------------------------------------
    def forward(self, x_BTD: Tensor, state: RecurrentState | None = None, *, token_ids=None):
        cfg = self.cfg
        check_input(x_BTD, cfg.d_model)
        B, T, _ = x_BTD.shape
        H, HV, K, V = cfg.n_heads, cfg.n_value_heads, cfg.head_k_dim, cfg.head_v_dim
        state = state if state is not None else RecurrentState()
        qkv_BTC = torch.cat([self.q_proj(x_BTD), self.k_proj(x_BTD), self.v_proj(x_BTD)], dim=-1)
        qkv_BTC, tail = causal_conv1d(qkv_BTC, self.conv_weight, tail_BWC=state.conv, activation="silu")
        q_BTHK, k_BTHK, v_BTHV = qkv_BTC.split([H * K, H * K, HV * V], dim=-1)
        q_BTHK = l2_norm(q_BTHK.reshape(B, T, H, K).float())
        k_BTHK = l2_norm(k_BTHK.reshape(B, T, H, K).float())
        v_BTHV = v_BTHV.reshape(B, T, HV, V).float()
        common = dict(initial_state=state.S, output_final_state=True, chunk_size=cfg.chunk_size, mode=cfg.mode)
        g = self._log_decay(x_BTD)
        fla_fn = self._fla.get(_FLA_OP.get(self.kind)) if q_BTHK.device.type in fla_dispatch.FLA_DEVICES else None
        if fla_fn is not None:
            o_BTHV, S = fla_dispatch.run_fla(fla_fn, q_BTHK, k_BTHK, v_BTHV, g=g, beta=self._beta(x_BTD),
                                             initial_state=state.S, output_final_state=True)
        elif self.kind == "linear_attention":
            o_BTHV, S = linear_attention(q_BTHK, k_BTHK, v_BTHV, g=g, **common)
        elif self.kind == "deltanet":
            o_BTHV, S = delta_rule(q_BTHK, k_BTHK, v_BTHV, beta=self._beta(x_BTD), **common)
        elif self.kind == "gated_deltanet":
            o_BTHV, S = gated_delta_rule(q_BTHK, k_BTHK, v_BTHV, g=g, beta=self._beta(x_BTD), **common)
        else:
            o_BTHV, S = kda(q_BTHK, k_BTHK, v_BTHV, g=g, beta=self._beta(x_BTD), **common)
        o_BTHV = rms_norm(o_BTHV, self.o_norm, cfg.norm_eps)
        gate = self._output_gate(x_BTD, B, T)
        if gate is not None:
            o_BTHV = o_BTHV * gate
        y_BTD = self.o_proj(o_BTHV.reshape(B, T, HV * V).to(x_BTD.dtype))
        return y_BTD, RecurrentState(seen=state.seen + T, S=S.float(), conv=tail)
