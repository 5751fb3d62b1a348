"""The recurrent stores: a fixed-size matrix per head that every token updates (essay section 3).

Every kind, one pipeline (``storelab.stores.recurrent_pipeline.RecurrentStore``). For each token x_t:

  q, k, v = SiLU(short causal conv_4([W_q x; W_k x; W_v x]))   (tail of 3 inputs kept between calls)
  q, k    = L2-normalised per head
  S_t     = update(S_{t-1}; k_t, v_t, gates)                       (the rule's op, storelab.ops)
  o_t     = S_t^T q_t / sqrt(K),  y_t = W_o norm(o_t) [* output gate]

Each config declares its rule, ``rule() -> Rule``: the op, the parameters its gates own (names and
initialisation), how beta, the log decay and the output gate are computed, and fla's kernel of the
same rule. The module asks for it once, at construction, and never asks which kind it is.

* ``linear_attention`` (Katharopoulos et al., arXiv 2006.16236): S_t = a S_{t-1} + k_t v_t^T,
  with ``decay = "none"`` (a = 1) or ``"fixed"`` (RetNet's per-head a_h = 1 - 2^(-5-h), arXiv 2307.08621).
* ``deltanet`` (Schlag, Irie and Schmidhuber, arXiv 2102.11174; chunked as in arXiv 2406.06484):
  S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T, beta_t = beta_max * sigmoid(W_b x_t).
* ``gated_deltanet`` (Yang, Kautz and Hatamizadeh, arXiv 2412.06464; layout of Qwen3-Next's
  ``Qwen3NextGatedDeltaNet``): S' = exp(g_t) S_{t-1}, then the delta write, with one decay per value head
  g_t = -exp(A_log) * softplus(W_a x_t + dt_bias); ``n_heads`` query/key heads serve ``n_v_heads`` value
  heads; output RMSNorm(o) * SiLU(W_z x).
* ``gated_deltaproduct`` (Siems et al., arXiv 2502.10297; layout of fla's ``GatedDeltaProduct``): the
  same decay once per token (``gated = false``: none, DeltaProduct), then ``num_householder`` = n delta
  writes in a row, each with its own key, value and beta (k, v and beta projections n times as wide),
  so a token multiplies the state by n factors I - beta k k^T; the read after the last. n = 1 is
  ``gated_deltanet``, with the same parameters.
* ``kda`` (Kimi Linear, arXiv 2510.26692; ``KimiLinearDeltaAttention``): the same with one decay per key
  channel from a low-rank gate, f = W_fb W_fa x_t; g = -exp(A_log) softplus(f + dt_bias), or with
  ``gate_lower_bound = lb`` (Kimi K3's published -5; transformers' Glm5Next "safe gate")
  g = lb * sigmoid(exp(A_log) (f + dt_bias)), so each step keeps at least e^lb; output
  RMSNorm(o) * sigmoid(W_gb W_ga x_t), or with ``full_rank_output_gate`` (Kimi K3) sigmoid(W_g x_t).

The write step beta lies in (0, beta_max); beta_max = 1 as in both released models, up to 2 lets
I - beta k k^T have a negative eigenvalue (essay section 6: Olmo Hybrid, arXiv 2604.03444; Complex KDA,
arXiv 2609.24797).

Parameters (D d_model, H q/k heads, HV value heads (= H except gated_deltanet), K, V head widths,
C = 2HK + HV*V conv channels, W conv_kernel, r gate_rank):
  linear_attention  D*C + C*W + V + HV*V*D
  deltanet          + D*H                                  (beta)
  gated_deltanet    + D*HV*V + 2*D*HV + 2*HV               (z, beta and decay projections, A_log, dt_bias)
  gated_deltaproduct + D*HV*V + n*D*HV + D*HV + 2*HV        (z, beta n times, decay; C = (n+1)HK + n*HV*V;
                                                             without the decay's D*HV + 2*HV when not gated)
  kda               + D*H + D*r + r*H*K + H*K + H + D*r + r*HV*V   (beta, forget gate, output gate;
                                                             D*HV*V for the full-rank output gate,
                                                            D*H*K for the full-rank forget gate)
State per layer, whatever the context L: HV matrices K x V kept in fp32 (as Qwen3-Next keeps them) plus
the conv tail of W-1 inputs x C channels in the entry dtype, HV*K*V*4 + (W-1)*C*bytes bytes; per token
that falls as 1/L. ``footprint`` counts kept = read = HV matrices; reading costs 2*HV*K*V flops for
the query, twice that for the delta rules (the write first reads the prediction S^T k), n + 1 times
that for n writes per token.

On CUDA, the chunked Gated DeltaNet and KDA stores run fla's Triton kernels when fla is installed
(``storelab.ops.fla``; chosen once at construction, ``STORELAB_FLA=0`` turns it off); elsewhere, and
for the other kinds, storelab's own chunked forms.

Adding a rule: its op in ``storelab.ops`` (a new module is exported by itself), its config and
``Rule`` here, and a test file; nothing above ``stores/`` names the kinds.

Shape legend: B batch, T tokens, D model width, H q/k heads, HV value heads, K key width, V value width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from storelab.ops.delta import MODES, delta_rule, gated_delta_rule, kda, linear_attention
from storelab.ops.delta_product import gated_delta_product
from storelab.ops.precision import at_least_fp32
from storelab.stores.base import (TOKEN, DTYPE_BYTES, STATE_DTYPES, Card, Footprint, MemoryTerms, ParamCount,
                                  StoreConfig, Transition, register)
from storelab.stores.recurrent_pipeline import RecurrentStore, Rule

__all__ = ["LinearAttentionConfig", "DeltaNetConfig", "GatedDeltaNetConfig", "GatedDeltaProductConfig", "KDAConfig",
           "RecurrentStore", "Rule"]

_HOLDS = "about d clean associations per head (a d x d matrix)"
_READS = "a fixed-size matrix per head, whatever the context length"


def _inverse_softplus(x: Tensor) -> Tensor:
    return x + torch.log(-torch.expm1(-x))


def _log_uniform(n: int, lo: float, hi: float) -> Tensor:
    return torch.empty(n).uniform_(math.log(lo), math.log(hi)).exp()


# ---------------------------------------------------------------------------- gates shared by the rules
def _beta_params(cfg) -> dict[str, nn.Module]:
    """The write step's projection: n steps per token and value head."""
    return {"b_proj": nn.Linear(cfg.d_model, cfg.n_writes * cfg.n_value_heads, bias=False)}


def _beta(store, x_BTD: Tensor) -> Tensor:
    """beta = beta_max * sigmoid(W_b x) in (0, beta_max), [B, T, (n,) HV]."""
    B, T, _ = x_BTD.shape
    cfg = store.cfg
    return (torch.sigmoid(at_least_fp32(store.b_proj(x_BTD))) * cfg.beta_max).view(B, T, *cfg.writes, cfg.n_value_heads)


def _gdn_params(cfg) -> dict[str, nn.Module | nn.Parameter]:
    """Qwen3-Next / fla: the output gate W_z; the decay's W_a, A ~ U(0, 16) kept as log A, and
    dt ~ logU(1e-3, 1e-1) kept as softplus^-1(dt)."""
    D, HV, V = cfg.d_model, cfg.n_value_heads, cfg.head_v_dim
    return {"z_proj": nn.Linear(D, HV * V, bias=False),
            "a_proj": nn.Linear(D, HV, bias=False),
            "A_log": nn.Parameter(torch.empty(HV).uniform_(1e-2, 16).log()),
            "dt_bias": nn.Parameter(_inverse_softplus(_log_uniform(HV, 1e-3, 1e-1)))}


def _gdn_log_decay(store, x_BTD: Tensor) -> Tensor:
    """g = -exp(A_log) softplus(W_a x + dt_bias), one per value head: [B, T, HV]."""
    return -at_least_fp32(store.A_log).exp() * F.softplus(at_least_fp32(store.a_proj(x_BTD)) + store.dt_bias)


def _silu_output_gate(store, x_BTD: Tensor) -> Tensor:
    """SiLU(W_z x), [B, T, HV, V]."""
    B, T, _ = x_BTD.shape
    return F.silu(at_least_fp32(store.z_proj(x_BTD))).view(B, T, store.cfg.n_value_heads, store.cfg.head_v_dim)


@dataclass(kw_only=True)
class _RecurrentConfig(StoreConfig):
    """Fields every recurrent store shares (not a store kind itself); each kind declares its ``rule()``."""

    d_model: int
    n_heads: int                      # query/key heads (and value heads unless n_v_heads says otherwise)
    head_k_dim: int
    head_v_dim: int | None = None     # None = head_k_dim
    conv_kernel: int = 4              # short causal convolution width; 1 = no mixing across tokens
    chunk_size: int | None = None     # tokens per step of the chunkwise-parallel form; None: chosen for this CPU
                                      # at first use (storelab.ops.tuning), 32 in training
    norm_eps: float = 1e-6            # output RMSNorm
    mode: str = "chunk"               # "chunk" (fast), "recurrent" (reference loop) or "scan"

    DELTA = True                      # writes by the delta rule (a field beta_max), not by adding k v^T
    SLOTS, FAMILY, RECURRENT = (TOKEN,), "recurrent", True

    def __post_init__(self):
        if self.head_v_dim is None:
            self.head_v_dim = self.head_k_dim
        self.check_positive("d_model", "n_heads", "head_k_dim", "head_v_dim", "conv_kernel", "norm_eps")
        if self.chunk_size is not None:
            self.check_positive("chunk_size")
        self.check(self.mode in MODES, "mode", f"must be one of {MODES}, got {self.mode!r}")
        if self.DELTA:
            self.check(0.0 < self.beta_max <= 2.0, "beta_max", f"must be in (0, 2], got {self.beta_max}")

    def rule(self) -> Rule:  # pragma: no cover - each kind says
        """The kind's update rule and gates, as data (``storelab.stores.recurrent_pipeline.Rule``)."""
        raise NotImplementedError

    @classmethod
    def parity_stores(cls, d_model: int, n_heads: int, head_dim: int) -> tuple[dict, ...]:
        """The section-6 parity experiment's tables: ``n_heads`` heads of ``head_dim`` x ``head_dim``, the
        per-token reference form (the strings are short), at the kind's defaults; a kind that writes by the
        delta rule twice, beta_max 1 (eigenvalues >= 0) and 2 (down to -alpha)."""
        table = {"kind": cls.KIND, "n_heads": n_heads, "head_k_dim": head_dim, "mode": "recurrent"}
        steps = ({"beta_max": 1.0}, {"beta_max": 2.0}) if cls.DELTA else ({},)
        return tuple({**table, **step} for step in steps)

    def _delta_transition(self, decay: str, diagonal_decay: str = "") -> Transition:
        """``decay`` (I - beta k k^T): the factor has eigenvalue 1 - beta along k, negative once beta > 1,
        -1 (times the decay, which may approach 1) as beta approaches 2."""
        form = f"{decay}(I - beta k k^T)" if decay else "I - beta k k^T"
        form += f", beta in (0, {self.beta_max:g})"
        form += f", {diagonal_decay}" if diagonal_decay else ""
        return Transition(form, diagonal=False, negative=self.beta_max > 1.0, reflection=self.beta_max >= 2.0)

    @property
    def n_value_heads(self) -> int:
        return self.n_heads

    @property
    def writes(self) -> tuple[int, ...]:
        """The axes of one token's writes between T and the heads: () for one write per token
        (k [B, T, H, K], the ops of storelab.ops.delta), (n,) for n writes in order (k [B, T, n, H, K])."""
        return ()

    @property
    def n_writes(self) -> int:
        return math.prod(self.writes)

    @property
    def conv_channels(self) -> int:
        H, K, n = self.n_heads, self.head_k_dim, self.n_writes
        return H * K + n * (H * K + self.n_value_heads * self.head_v_dim)

    def build(self) -> nn.Module:
        return RecurrentStore(self)

    def footprint(self, context: int, *, dtype: str = "bf16") -> Footprint:
        HV, K, V = self.n_value_heads, self.head_k_dim, self.head_v_dim
        S_bytes = HV * K * V * 4  # the state is kept in fp32 whatever the entry dtype (as Qwen3-Next keeps it)
        tail_bytes = math.ceil((self.conv_kernel - 1) * self.conv_channels * DTYPE_BYTES[dtype])
        reads = 1 + (self.n_writes if self.DELTA else 0)  # each delta write reads S^T k; then the query reads S^T q
        return Footprint(context=context, kept=HV, read=HV, state_bytes=S_bytes + tail_bytes,
                         read_flops=2 * reads * HV * K * V, note="matrices per layer; the conv tail is counted in bytes")

    def conv_input_bytes(self, fmt: str) -> float:
        """One input of the convolution, C channels (transformers' conv state keeps W of them, ours W - 1)."""
        return self.conv_channels * DTYPE_BYTES[fmt]

    def conv_width(self) -> int:
        return self.conv_kernel

    def memory_terms(self, *, cache: str = "bf16", state: str = "fp32") -> MemoryTerms:
        """Nothing grows with context: the matrices S [HV, K, V] and the convolution's last W - 1
        inputs, both in ``state`` (llama.cpp's s and r tensors; fp32 there and in Qwen3-Next)."""
        if state not in STATE_DTYPES:
            raise ValueError(f"state dtype: unknown {state!r} (accepted: {', '.join(STATE_DTYPES)})")
        numbers = self.n_value_heads * self.head_k_dim * self.head_v_dim + (self.conv_kernel - 1) * self.conv_channels
        return MemoryTerms(per_sequence=numbers * DTYPE_BYTES[state])

    def _base_params(self) -> int:
        D, C, W, V, HVV = self.d_model, self.conv_channels, self.conv_kernel, self.head_v_dim, self.n_value_heads * self.head_v_dim
        return D * C + C * W + V + HVV * D

    def num_params(self) -> ParamCount:
        n = self._base_params() + self._extra_params()
        return ParamCount(n, n)

    def _extra_params(self) -> int:  # pragma: no cover - each kind says
        raise NotImplementedError


# ---------------------------------------------------------------------------- linear attention
def _fixed_log_decay(store, x_BTD: Tensor) -> Tensor:
    """RetNet's a_h = 1 - 2^(-5-h) as log a_h, computed at each call (H numbers): a constant kept as a
    buffer would be missing from every checkpoint, and a model built on ``meta`` could not fill it."""
    h = torch.arange(store.cfg.n_heads, dtype=torch.float32, device=x_BTD.device)
    return torch.log1p(-torch.pow(2.0, -5.0 - h)).expand(x_BTD.shape[0], x_BTD.shape[1], -1)    # B T H


LINEAR_ATTENTION = Rule(op=linear_attention)
LINEAR_ATTENTION_FIXED_DECAY = Rule(op=linear_attention, log_decay=_fixed_log_decay)


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

    def rule(self) -> Rule:
        return LINEAR_ATTENTION_FIXED_DECAY if self.decay == "fixed" else LINEAR_ATTENTION

    def transition(self) -> Transition:
        form = "a_h I, a fixed a_h in (0, 1) per head" if self.decay == "fixed" else "I (no decay)"
        return Transition(form, diagonal=True, negative=False)

    def _extra_params(self) -> int:
        return 0


# ---------------------------------------------------------------------------- DeltaNet
DELTANET = Rule(op=delta_rule, params=_beta_params, beta=_beta)


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

    def rule(self) -> Rule:
        return DELTANET

    def transition(self) -> Transition:
        return self._delta_transition("")

    def _extra_params(self) -> int:
        return self.d_model * self.n_heads


# ---------------------------------------------------------------------------- Gated DeltaNet
def _gdn_rule_params(cfg) -> dict[str, nn.Module | nn.Parameter]:
    return {**_beta_params(cfg), **_gdn_params(cfg)}


GATED_DELTANET = Rule(op=gated_delta_rule, params=_gdn_rule_params, beta=_beta, log_decay=_gdn_log_decay,
                      output_gate=_silu_output_gate, fla="gated_delta_rule")


@dataclass(kw_only=True)
class _GroupedValueHeads(_RecurrentConfig):
    """Kinds whose value heads may outnumber the query/key heads (not a store kind itself)."""

    n_v_heads: int | None = None      # value heads (Qwen3-Next: more than q/k heads); None = n_heads

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


@register("gated_deltanet")
@dataclass(kw_only=True)
class GatedDeltaNetConfig(_GroupedValueHeads):
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

    def rule(self) -> Rule:
        return GATED_DELTANET

    def transition(self) -> Transition:
        return self._delta_transition("alpha ", "alpha in (0, 1) per head")

    def _extra_params(self) -> int:
        D, HV = self.d_model, self.n_v_heads
        return D * HV * self.head_v_dim + 2 * D * HV + 2 * HV


# ---------------------------------------------------------------------------- Gated DeltaProduct
def _deltaproduct_params(cfg) -> dict[str, nn.Module]:
    """DeltaProduct without the decay: n write steps per token and value head, the output gate W_z."""
    return {**_beta_params(cfg), "z_proj": nn.Linear(cfg.d_model, cfg.n_value_heads * cfg.head_v_dim, bias=False)}


# no fla kernel: fla's chunk_gated_delta_product refuses float32 inputs, and the stores compute in float32
GATED_DELTAPRODUCT = Rule(op=gated_delta_product, params=_gdn_rule_params, beta=_beta, log_decay=_gdn_log_decay,
                          output_gate=_silu_output_gate)
DELTAPRODUCT = Rule(op=gated_delta_product, params=_deltaproduct_params, beta=_beta, output_gate=_silu_output_gate)


@register("gated_deltaproduct")
@dataclass(kw_only=True)
class GatedDeltaProductConfig(_GroupedValueHeads):
    beta_max: float = 1.0             # 2 lets each factor reflect (fla's allow_neg_eigval)
    num_householder: int = 2          # n: delta writes per token (fla's default); 1 = gated_deltanet
    gated: bool = True                # the per-head decay before a token's writes; False = DeltaProduct
    # chunk_size counts writes (n per token), as fla's chunked form does

    CARD_ORDER = 145
    CARD = Card(
        name="Gated DeltaProduct (recurrent state)",
        written_by="each token, by n delta-rule corrections in a row (n Householder factors)",
        holds=_HOLDS,
        reading_costs=_READS,
        forgets="by a learned decay, one number per head and token (unless gated = false), and by overwriting",
        source="arXiv 2502.10297 (DeltaProduct, Siems et al.; Gated DeltaNet's decay, 2412.06464)",
    )

    def __post_init__(self):
        super().__post_init__()
        self.check_positive("num_householder")
        self.check(isinstance(self.gated, bool), "gated", f"must be true or false, got {self.gated!r}")

    @property
    def writes(self) -> tuple[int, ...]:
        return (self.num_householder,)

    def rule(self) -> Rule:
        return GATED_DELTAPRODUCT if self.gated else DELTAPRODUCT

    def transition(self) -> Transition:
        """n factors I - beta_i k_i k_i^T: with beta <= 1 each is positive semi-definite and a product of two
        has real eigenvalues >= 0; from three on small negative ones occur (docs/deltaproduct.md); beta
        up to 2 lets each factor reflect."""
        n = self.num_householder
        form = (f"{'alpha ' if self.gated else ''}(I - beta_1 k_1 k_1^T) ... (I - beta_{n} k_{n} k_{n}^T), "
                f"beta_i in (0, {self.beta_max:g})" + (", alpha in (0, 1) per head" if self.gated else ""))
        return Transition(form, diagonal=False, negative=self.beta_max > 1.0 or n >= 3,
                          reflection=self.beta_max >= 2.0)

    def _extra_params(self) -> int:
        D, HV, n = self.d_model, self.n_v_heads, self.num_householder
        return D * HV * self.head_v_dim + n * D * HV + ((D * HV + 2 * HV) if self.gated else 0)


# ---------------------------------------------------------------------------- KDA
def _kda_params(cfg) -> dict[str, nn.Module | nn.Parameter]:
    """Kimi Linear: the low-rank forget gate W_fb W_fa and output gate W_gb W_ga; the decay rate
    A (log A = 0 under the bounded gate, else A ~ U(1, 16)) and dt ~ logU(1e-3, 1e-1) per key channel."""
    D, H, K, V, r = cfg.d_model, cfg.n_heads, cfg.head_k_dim, cfg.head_v_dim, cfg.gate_rank
    gate = ({"g_proj": nn.Linear(D, H * V, bias=False)} if cfg.full_rank_output_gate else
            {"g_a_proj": nn.Linear(D, r, bias=False), "g_b_proj": nn.Linear(r, H * V, bias=False)})
    forget = ({"f_proj": nn.Linear(D, H * K, bias=False)} if cfg.full_rank_forget_gate else
              {"f_a_proj": nn.Linear(D, r, bias=False), "f_b_proj": nn.Linear(r, H * K, bias=False)})
    return {**forget, **gate,
            "A_log": nn.Parameter(torch.zeros(H) if cfg.gate_lower_bound is not None
                                  else torch.empty(H).uniform_(1, 16).log()),
            "dt_bias": nn.Parameter(_inverse_softplus(_log_uniform(H * K, 1e-3, 1e-1)))}


def _kda_rule_params(cfg) -> dict[str, nn.Module | nn.Parameter]:
    return {**_beta_params(cfg), **_kda_params(cfg)}


def _kda_forget(store, x_BTD: Tensor) -> tuple[Tensor, Tensor]:
    """f = W_fb W_fa x + dt_bias (W_f x + dt_bias with a full-rank gate) [B, T, H, K] and the rate exp(A_log) [H, 1]."""
    B, T, _ = x_BTD.shape
    proj = store.f_proj(x_BTD) if store.cfg.full_rank_forget_gate else store.f_b_proj(store.f_a_proj(x_BTD))
    f = at_least_fp32(proj) + at_least_fp32(store.dt_bias)
    return f.view(B, T, store.cfg.n_heads, store.cfg.head_k_dim), at_least_fp32(store.A_log).exp()[:, None]


def _kda_log_decay_softplus(store, x_BTD: Tensor) -> Tensor:
    """Kimi Linear: g = -exp(A_log) softplus(f + dt_bias), [B, T, H, K]."""
    f, rate = _kda_forget(store, x_BTD)
    return -rate * F.softplus(f)


def _kda_log_decay_bounded(store, x_BTD: Tensor) -> Tensor:
    """Kimi K3 (Glm5Next's "safe gate"): g = lb sigmoid(exp(A_log) (f + dt_bias)) in (lb, 0), [B, T, H, K]."""
    f, rate = _kda_forget(store, x_BTD)
    return store.cfg.gate_lower_bound * torch.sigmoid(rate * f)


def _sigmoid_low_rank_output_gate(store, x_BTD: Tensor) -> Tensor:
    """sigmoid(W_gb W_ga x), [B, T, HV, V]."""
    B, T, _ = x_BTD.shape
    gate = torch.sigmoid(at_least_fp32(store.g_b_proj(store.g_a_proj(x_BTD))))
    return gate.view(B, T, store.cfg.n_value_heads, store.cfg.head_v_dim)


def _sigmoid_full_rank_output_gate(store, x_BTD: Tensor) -> Tensor:
    """Kimi K3 (``use_full_rank_gate``): sigmoid(W_g x), W_g [HV*V, D], [B, T, HV, V]."""
    B, T, _ = x_BTD.shape
    gate = torch.sigmoid(at_least_fp32(store.g_proj(x_BTD)))
    return gate.view(B, T, store.cfg.n_value_heads, store.cfg.head_v_dim)


_KDA = dict(op=kda, params=_kda_rule_params, beta=_beta, fla="kda")
KDA_SOFTPLUS_GATE = Rule(**_KDA, output_gate=_sigmoid_low_rank_output_gate, log_decay=_kda_log_decay_softplus)
KDA_BOUNDED_GATE = Rule(**_KDA, output_gate=_sigmoid_low_rank_output_gate, log_decay=_kda_log_decay_bounded)
KDA_SOFTPLUS_FULL_GATE = Rule(**_KDA, output_gate=_sigmoid_full_rank_output_gate, log_decay=_kda_log_decay_softplus)
KDA_BOUNDED_FULL_GATE = Rule(**_KDA, output_gate=_sigmoid_full_rank_output_gate, log_decay=_kda_log_decay_bounded)


@register("kda")
@dataclass(kw_only=True)
class KDAConfig(_RecurrentConfig):
    beta_max: float = 1.0
    gate_rank: int | None = None      # rank of the forget and output gates; None = head_k_dim (Kimi)
    gate_lower_bound: float | None = -5.0  # Kimi K3's published bound; None = Kimi Linear's softplus gate
    full_rank_output_gate: bool = False    # Kimi K3's use_full_rank_gate: sigmoid(W_g x), W_g [H*V, D]
    full_rank_forget_gate: bool = False    # Ling / Ring hybrids: W_f [H*K, D] instead of W_fb W_fa

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

    def transition(self) -> Transition:
        return self._delta_transition("diag(alpha) ", "alpha in (0, 1) per key channel")

    def rule(self) -> Rule:
        if self.full_rank_output_gate:
            return KDA_SOFTPLUS_FULL_GATE if self.gate_lower_bound is None else KDA_BOUNDED_FULL_GATE
        return KDA_SOFTPLUS_GATE if self.gate_lower_bound is None else KDA_BOUNDED_GATE

    def _extra_params(self) -> int:
        D, H, K, V, r = self.d_model, self.n_heads, self.head_k_dim, self.head_v_dim, self.gate_rank
        output_gate = D * H * V if self.full_rank_output_gate else D * r + r * H * V
        forget_gate = D * H * K if self.full_rank_forget_gate else D * r + r * H * K
        return D * H + forget_gate + H * K + H + output_gate
