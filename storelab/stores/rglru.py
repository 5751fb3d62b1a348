"""RG-LRU, the recurrent block of Griffin and RecurrentGemma (De et al., arXiv 2402.19427): one number per channel.

For each token x_t (C = lru_width channels in H blocks of C / H for the gates, W the conv width):

  g_t   = GELU_tanh(W_y x_t + b_y)                                    (the gate branch)
  u_t   = conv_W(W_x x_t + b_x) + b_conv                               (no activation; tail of W-1 inputs kept)
  i_t   = sigmoid(u_t W_i + b_i),  r_t = sigmoid(u_t W_r + b_r)        (block-diagonal: one W per block)
  a_t   = sigmoid(-p)^(c r_t),  c = 8                                   (log a_t = -c r_t softplus(p))
  h_t   = a_t h_{t-1} + sqrt(1 - a_t^2) (i_t * u_t)                     (storelab.ops.rglru; at the first
                                                                        token of a context a = 0, multiplier 1)
  y_t   = W_out (h_t * g_t) + b_out

The state is a vector: what a token keeps of the past is one decay per channel, chosen by the input
through r_t, and the multiplier sqrt(1 - a^2) keeps h at the scale of its input however slowly it
decays.

Parameters, their transformers names (``RecurrentGemmaRecurrentBlock``) and counts (D model width,
C lru_width, H gate blocks, b = C / H, W conv width):

  ours                    transformers                     shape                count
  y_proj                  linear_y.weight, .bias           [C, D], [C]          D C + C
  x_proj                  linear_x.weight, .bias           [C, D], [C]          D C + C
  conv_weight             conv_1d.weight                   [C, W] ([C, 1, W])   C W
  conv_bias               conv_1d.bias                     [C]                  C
  input_gate_weight       rg_lru.input_gate_weight         [H, b, b]            H b^2
  input_gate_bias         rg_lru.input_gate_bias           [H, b]               C
  recurrent_gate_weight   rg_lru.recurrent_gate_weight     [H, b, b]            H b^2
  recurrent_gate_bias     rg_lru.recurrent_gate_bias       [H, b]               C
  recurrent_param         rg_lru.recurrent_param           [C]                  C
  out_proj                linear_out.weight, .bias         [D, C], [D]          C D + D

The gates multiply from the left as transformers does: i_t = u_t (as [H, b]) @ input_gate_weight[h].

State per layer, whatever the context L: h [C] in fp32 plus the conv tail of W - 1 inputs of C channels in
the entry dtype, 4 C + (W - 1) C e bytes, e bytes per entry (``storelab.state.RecurrentState``: ``S`` [B, C],
transformers' ``rg_lru.recurrent_states``; ``conv`` [B, W-1, C], its ``conv1d_state`` [B, C, W-1]). ``footprint`` counts
kept = read = C numbers; the read is the update itself, 2 C flops per token (h is the output).

Shape legend: B batch, T tokens, D model width, C lru width, H gate blocks, b block width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from storelab.ops.conv import causal_conv1d
from storelab.ops.precision import at_least_fp32
from storelab.ops.rglru import rg_lru, rg_lru_log_decay
from storelab.ops.selective_scan import MODES
from storelab.state import RecurrentState
from storelab.stores.base import (TOKEN, DTYPE_BYTES, STATE_DTYPES, Card, Footprint, MemoryTerms, ParamCount,
                                  StoreConfig, Transition, check_input, register)

__all__ = ["RGLRUConfig", "RGLRUStore"]


@register("rglru")
@dataclass(kw_only=True)
class RGLRUConfig(StoreConfig):
    d_model: int
    lru_width: int | None = None      # C: channels of the state; None = d_model (RecurrentGemma's default)
    n_heads: int = 1                  # H: blocks of the block-diagonal gates (RecurrentGemma: num_attention_heads)
    conv_kernel: int = 4              # short causal convolution width (RecurrentGemma's conv1d_width)
    gate_exponent: float = 8.0        # c in a = sigmoid(-p)^(c r)
    chunk_size: int = 64              # tokens per chunk of the chunked scan
    mode: str = "chunk"               # "chunk" (fast) or "recurrent" (the per-token reference)

    SLOTS, FAMILY, RECURRENT = (TOKEN,), "recurrent", True
    CARD_ORDER = 117
    CARD = Card(
        name="RG-LRU (recurrent state)",
        written_by="each token, by adding its gated input, scaled by sqrt(1 - a^2), after a decay a per channel",
        holds="one number per channel (a vector of lru_width): a running, decaying summary",
        reading_costs="a fixed-size vector, whatever the context length",
        forgets="by a learned, input-dependent decay per channel and token, a = sigmoid(-p)^(8 r)",
        source="arXiv 2402.19427 (Griffin; RecurrentGemma)",
    )

    def __post_init__(self):
        if self.lru_width is None:
            self.lru_width = self.d_model
        self.check_positive("d_model", "lru_width", "n_heads", "conv_kernel", "gate_exponent", "chunk_size")
        self.check(self.lru_width % self.n_heads == 0, "n_heads",
                   f"{self.n_heads} gate blocks do not divide lru_width {self.lru_width}")
        self.check(self.mode in MODES, "mode", f"must be one of {MODES}, got {self.mode!r}")

    @property
    def head_k_dim(self) -> int:
        """The width of one gate block, C / H (the state itself is a vector per channel)."""
        return self.lru_width // self.n_heads

    def build(self) -> nn.Module:
        return RGLRUStore(self)

    @classmethod
    def parity_stores(cls, d_model: int, n_heads: int, head_dim: int) -> tuple[dict, ...]:
        """The section-6 parity experiment's table: ``n_heads`` gate blocks of ``head_dim`` channels (the state
        is a vector of ``n_heads`` * ``head_dim`` numbers), the chunked scan."""
        return ({"kind": cls.KIND, "lru_width": n_heads * head_dim, "n_heads": n_heads},)

    def transition(self) -> Transition:
        """A decay per channel: h_t = a_t * h_{t-1} + sqrt(1 - a_t^2) (i_t * u_t), a_t in (0, 1)."""
        return Transition(f"diag(a), a = sigmoid(-p)^({self.gate_exponent:g} r) in (0, 1) per channel and token",
                          diagonal=True, negative=False)

    def footprint(self, context: int, *, dtype: str = "bf16") -> Footprint:
        C = self.lru_width
        tail_bytes = math.ceil((self.conv_kernel - 1) * C * DTYPE_BYTES[dtype])
        return Footprint(context=context, kept=C, read=C, state_bytes=C * 4 + tail_bytes, read_flops=2 * C,
                         note="numbers per layer (h in fp32); the conv tail is counted in bytes")

    def memory_terms(self, *, cache: str = "bf16", state: str = "fp32") -> MemoryTerms:
        """Nothing grows with context: h [C] and the convolution's last W - 1 inputs, both in ``state``."""
        if state not in STATE_DTYPES:
            raise ValueError(f"state dtype: unknown {state!r} (accepted: {', '.join(STATE_DTYPES)})")
        return MemoryTerms(per_sequence=self.conv_kernel * self.lru_width * DTYPE_BYTES[state])

    def num_params(self) -> ParamCount:
        D, C, H, W = self.d_model, self.lru_width, self.n_heads, self.conv_kernel
        b = C // H
        n = 2 * (D * C + C) + C * W + C + 2 * (H * b * b + C) + C + C * D + D
        return ParamCount(n, n)


class RGLRUStore(nn.Module):
    """One RG-LRU recurrent block; ``forward(x, state) -> (y, RecurrentState)`` (module docstring: the
    update, the parameters and their transformers names)."""

    def __init__(self, cfg: RGLRUConfig):
        super().__init__()
        self.cfg = cfg
        D, C, H, W = cfg.d_model, cfg.lru_width, cfg.n_heads, cfg.conv_kernel
        b = C // H
        # RecurrentGemma's initialisation: projections ~ N(0, 1/fan_in), zero biases; gates ~ N(0, 1/b);
        # p = -logit(a0) with a0 ~ sqrt(U(0.81, 0.998)), so a = a0^(c r) starts in [0.9, 0.999]^(c r)
        self.y_proj = nn.Linear(D, C)
        self.x_proj = nn.Linear(D, C)
        self.conv_weight = nn.Parameter(torch.randn(C, W) / math.sqrt(W))
        self.conv_bias = nn.Parameter(torch.zeros(C))
        self.input_gate_weight = nn.Parameter(torch.randn(H, b, b) / math.sqrt(b))
        self.input_gate_bias = nn.Parameter(torch.zeros(H, b))
        self.recurrent_gate_weight = nn.Parameter(torch.randn(H, b, b) / math.sqrt(b))
        self.recurrent_gate_bias = nn.Parameter(torch.zeros(H, b))
        a0 = torch.empty(C).uniform_(0.9 ** 2, 0.999 ** 2).sqrt()
        self.recurrent_param = nn.Parameter(torch.log1p(-a0) - a0.log())
        self.out_proj = nn.Linear(C, D)
        with torch.no_grad():
            for lin in (self.y_proj, self.x_proj, self.out_proj):
                lin.weight.normal_(0.0, lin.in_features ** -0.5)
                lin.bias.zero_()

    def _gates(self, u_BTC: Tensor) -> tuple[Tensor, Tensor]:
        """i_t and r_t in (0, 1) [B, T, C], each block of b channels by its own b x b matrix, in at least fp32."""
        B, T, C = u_BTC.shape
        H = self.cfg.n_heads
        u_BTHb = at_least_fp32(u_BTC).view(B, T, H, C // H)
        gates = []
        for W_Hbb, b_Hb in ((self.input_gate_weight, self.input_gate_bias),
                            (self.recurrent_gate_weight, self.recurrent_gate_bias)):
            pre = torch.einsum("bthi,hij->bthj", u_BTHb, at_least_fp32(W_Hbb)) + at_least_fp32(b_Hb)
            gates.append(torch.sigmoid(pre).reshape(B, T, C))
        return gates[0], gates[1]

    def _conv(self, x_BTD: Tensor, tail: Tensor | None) -> tuple[Tensor, Tensor]:
        """u = conv(W_x x + b_x) + b_conv (no activation) and the new tail."""
        pre, tail = causal_conv1d(self.x_proj(x_BTD), self.conv_weight, tail_BWC=tail, activation=None)
        return pre + self.conv_bias.to(pre.dtype), tail

    def _log_decay(self, x_BTD: Tensor) -> Tensor:
        """log a = -c r softplus(p) <= 0, one per channel: [B, T, C] (the forgetting probes ask for it; the
        convolution reads x from a fresh context)."""
        u_BTC, _ = self._conv(x_BTD, None)
        _, r_BTC = self._gates(u_BTC)
        return rg_lru_log_decay(r_BTC, self.recurrent_param, c=self.cfg.gate_exponent)

    def gate_params(self) -> dict[str, str]:
        """What ``_log_decay`` reads at x = 0 (parameter -> "zero" | "read", as ``RecurrentStore.gate_params``):
        x_proj's weight meets x, so it is zero there; its bias goes through the convolution and the gates, and
        the recurrent parameter sets the decay: -c r softplus(p)."""
        return {"x_proj.weight": "zero", "x_proj.bias": "read", "conv_weight": "read", "conv_bias": "read",
                "input_gate_weight": "read", "input_gate_bias": "read", "recurrent_gate_weight": "read",
                "recurrent_gate_bias": "read", "recurrent_param": "read"}

    def forward(self, x_BTD: Tensor, state: RecurrentState | None = None, *, token_ids=None):
        cfg = self.cfg
        check_input(x_BTD, cfg.d_model)
        B, T, _ = x_BTD.shape
        state = state if state is not None else RecurrentState()
        g_BTC = F.gelu(self.y_proj(x_BTD), approximate="tanh")
        u_BTC, tail = self._conv(x_BTD, state.conv)
        i_BTC, r_BTC = self._gates(u_BTC)
        reset_BT = None
        if state.seen == 0 and T > 0:  # the context's first token: a = 0, the input taken whole
            reset_BT = torch.zeros(B, T, dtype=torch.bool, device=x_BTD.device)
            reset_BT[:, 0] = True
        h_BTC, S = rg_lru(at_least_fp32(u_BTC), input_gate=i_BTC, recurrent_gate=r_BTC,
                          recurrent_param=self.recurrent_param, c=cfg.gate_exponent, reset=reset_BT,
                          initial_state=state.S, output_final_state=True, chunk_size=cfg.chunk_size, mode=cfg.mode)
        y_BTD = self.out_proj((h_BTC * at_least_fp32(g_BTC)).to(x_BTD.dtype))
        return y_BTD, RecurrentState(seen=state.seen + T, S=S, conv=tail)
