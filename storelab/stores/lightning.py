"""MiniMax-Text-01's lightning attention (MiniMax-01, arXiv 2501.08313), kind ``lightning``: linear
attention with a fixed per-head decay, as the released model computes it (transformers'
``MiniMaxLightningAttention``).

Update rule, per head h, for each token x_t:

  q, k, v = SiLU(W_qkv x_t)                      (per head [q | k | v]; no convolution, no L2 norm)
  S_t     = exp(-slope_h) S_{t-1} + k_t v_t^T    (``storelab.ops.delta.linear_attention``, scale 1)
  o_t     = S_t^T q_t
  y_t     = W_o (sigmoid(W_g x_t) * RMSNorm(o_t over all H*K channels))

The slopes are ALiBi's (arXiv 2108.12409), ``slope_h = 2^(-8 (h + 1) / H) * slope_scale``; MiniMax
scales them per layer, ``slope_scale = 1 - l / (L - 1 + 1e-5) + 1e-5`` for layer l of L, so the
first layer forgets fastest and the last hardly at all. This differs from the ``linear_attention``
store (``storelab.stores.recurrent``): there q and k are L2-normalised and scaled by K^-1/2 after a
short convolution, each head's output has its own RMSNorm, there is no output gate, and the fixed
decay is RetNet's; tests/test_lightning_attention.py checks both the op and this store against
transformers' class on the same weights.

Parameters (D d_model, H heads, K head_dim): ``3*D*H*K`` (q, k, v) ``+ D*H*K`` (output gate)
``+ H*K`` (norm) ``+ H*K*D`` (output). State per layer, whatever the context: H matrices K x K in
fp32 (``RecurrentState.S``), ``4*H*K*K`` bytes.

Shape legend: B batch, T tokens, D model width, H heads, K head width (keys and values).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from storelab.ops.delta import MODES, linear_attention
from storelab.ops.norm import rms_norm
from storelab.ops.precision import at_least_fp32
from storelab.state import RecurrentState
from storelab.stores.base import (TOKEN, DTYPE_BYTES, STATE_DTYPES, Card, Footprint, MemoryTerms, ParamCount,
                                  StoreConfig, Transition, check_input, register)

__all__ = ["LightningConfig", "LightningAttention"]


@register("lightning")
@dataclass(kw_only=True)
class LightningConfig(StoreConfig):
    """Lightning attention; defaults are MiniMax-Text-01's widths (64 heads of 128)."""

    d_model: int
    n_heads: int = 64
    head_dim: int = 128
    slope_scale: float = 1.0          # MiniMax: 1 - l / (L - 1 + 1e-5) + 1e-5 for layer l of L
    norm_eps: float = 1e-6
    chunk_size: int = 64              # tokens per step of the chunkwise-parallel form
    mode: str = "chunk"               # "chunk", "recurrent" (reference loop) or "scan"

    SLOTS, FAMILY, RECURRENT, CARD_ORDER = (TOKEN,), "recurrent", True, 121
    CARD = Card(
        name="Lightning attention (recurrent state, MiniMax-01)",
        written_by="each token, by adding an outer product k v^T",
        holds="a K x K matrix per head, decayed by a fixed per-head rate",
        reading_costs="one K x K product per head, whatever the context",
        forgets="by a fixed per-head decay (ALiBi's slopes, scaled per layer)",
        source="arXiv 2501.08313 (MiniMax-01), 2108.12409 (the slopes)",
    )

    def __post_init__(self):
        self.check_positive("d_model", "n_heads", "head_dim", "norm_eps", "chunk_size")
        self.check(self.slope_scale >= 0, "slope_scale", f"must be >= 0 (0: no decay), got {self.slope_scale}")
        self.check(self.mode in MODES, "mode", f"must be one of {MODES}, got {self.mode!r}")

    @property
    def head_k_dim(self) -> int:
        """The state's key width (keys and values are both ``head_dim`` wide)."""
        return self.head_dim

    def build(self) -> "LightningAttention":
        return LightningAttention(self)

    @classmethod
    def parity_stores(cls, d_model: int, n_heads: int, head_dim: int) -> tuple[dict, ...]:
        """The section-6 parity experiment's table: ``n_heads`` heads of ``head_dim`` x ``head_dim``."""
        return ({"kind": cls.KIND, "n_heads": n_heads, "head_dim": head_dim},)

    def transition(self) -> Transition:
        """A fixed decay per head: S_t = exp(-slope_h) S_{t-1} + k v^T."""
        return Transition("exp(-slope_h) I, a fixed decay in (0, 1] per head", diagonal=True, negative=False)

    def log_decay(self, device=None) -> Tensor:
        """-slope_h [H]: the log of what each step keeps of a head's state."""
        h = torch.arange(self.n_heads, dtype=torch.float32, device=device)
        return -torch.pow(2.0, -8.0 * (h + 1) / self.n_heads) * self.slope_scale

    def num_params(self) -> ParamCount:
        D, HK = self.d_model, self.n_heads * self.head_dim
        n = 3 * D * HK + D * HK + HK + HK * D
        return ParamCount(n, n)

    def footprint(self, context: int, *, dtype: str = "bf16") -> Footprint:
        H, K = self.n_heads, self.head_dim
        return Footprint(context=context, kept=H, read=H, state_bytes=H * K * K * 4, read_flops=2 * H * K * K,
                         note="matrices per layer, kept in fp32")

    def memory_terms(self, *, cache: str = "bf16", state: str = "fp32") -> MemoryTerms:
        """Nothing grows with context: the H matrices K x K, in ``state``."""
        self.check(state in STATE_DTYPES, "state dtype", f"unknown {state!r} (accepted: {', '.join(STATE_DTYPES)})")
        return MemoryTerms(per_sequence=self.n_heads * self.head_dim ** 2 * DTYPE_BYTES[state])


class LightningAttention(nn.Module):
    """See the module docstring; parameter names are transformers' (``qkv_proj``, ``output_gate``, ``norm``,
    ``out_proj``), ``qkv_proj`` in its layout (per head q, k, v)."""

    def __init__(self, cfg: LightningConfig):
        super().__init__()
        self.cfg = cfg
        D, HK = cfg.d_model, cfg.n_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(D, 3 * HK, bias=False)
        self.output_gate = nn.Linear(D, HK, bias=False)
        self.norm = nn.Parameter(torch.ones(HK))
        self.out_proj = nn.Linear(HK, D, bias=False)

    def _log_decay(self, x_BTD: Tensor) -> Tensor:
        """g = -slope_h <= 0, the log of what each step keeps, the same for every token: [B, T, H] (the
        forgetting probes ask for it)."""
        return self.cfg.log_decay(x_BTD.device).expand(x_BTD.shape[0], x_BTD.shape[1], -1)

    def gate_params(self) -> dict[str, str]:
        """What ``_log_decay`` reads (as ``RecurrentStore.gate_params``): nothing, the slopes come from the config."""
        return {}

    def forward(self, x_BTD: Tensor, state: RecurrentState | None = None, *, token_ids: Tensor | None = None):
        cfg = self.cfg
        check_input(x_BTD, cfg.d_model)
        B, T, _ = x_BTD.shape
        H, K = cfg.n_heads, cfg.head_dim
        state = state if state is not None else RecurrentState()
        qkv_BTHX = at_least_fp32(F.silu(self.qkv_proj(x_BTD))).view(B, T, H, 3 * K)
        q_BTHK, k_BTHK, v_BTHK = qkv_BTHX.split(K, dim=-1)
        g_H = cfg.log_decay(x_BTD.device).to(q_BTHK.dtype)
        o_BTHK, S = linear_attention(q_BTHK, k_BTHK, v_BTHK, g=g_H, scale=1.0, initial_state=state.S,
                                     output_final_state=True, chunk_size=cfg.chunk_size, mode=cfg.mode)
        o_BTX = rms_norm(o_BTHK.reshape(B, T, H * K), self.norm, cfg.norm_eps)
        y_BTD = self.out_proj((torch.sigmoid(self.output_gate(x_BTD)) * o_BTX).to(x_BTD.dtype))
        return y_BTD, RecurrentState(seen=state.seen + T, S=at_least_fp32(S), conv=None)
