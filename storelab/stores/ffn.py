"""The feed-forward layer as a store written in training (essay section 2).

    f(x) = sum_i v_i sigma(k_i . x) = W_down sigma(W_up x)

The rows of ``up_proj`` are keys, the columns of ``down_proj`` are values, and the
nonlinearity decides how much the other keys' overlaps interfere with a recall:

* ``relu``    max(0, h): zeroes the negative overlaps (about half the interference);
* ``relu2``   max(0, h)^2 (So et al., Primer, arXiv 2109.08668): capacity about 2 d^2 / 3;
* ``power``   max(0, h)^p with ``power`` = p: the rectified polynomial of dense
              associative memory (Krotov and Hopfield, arXiv 1606.01164), capacity of
              order d^p. We rectify rather than keep the sign (sign(h) |h|^p) so that
              p = 1 is ``relu`` and p = 2 is ``relu2`` exactly;
* ``gelu``    x Phi(x), the exact (erf) form (Hendrycks and Gimpel, arXiv 1606.08415);
* ``swiglu``  silu(W_gate x) * (W_up x), a gated unit (Shazeer, arXiv 2002.05202).

Update rule: none while reading; gradient descent writes the weights in training.
Parameters: 2 D F (3 D F for swiglu), plus F + D biases (2F + D for swiglu) when ``bias``.
State per token: none (EmptyState). Reading costs the whole layer for every token.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from storelab.ops.routing import swiglu
from storelab.state import EmptyState
from storelab.stores.base import CHANNEL, Card, Footprint, ParamCount, StoreConfig, check_input, register

__all__ = ["FFNConfig", "FFN"]

ACTIVATIONS = ("relu", "relu2", "power", "gelu", "swiglu")


@register("ffn")
@dataclass(kw_only=True)
class FFNConfig(StoreConfig):
    d_model: int
    d_ff: int
    activation: str = "swiglu"
    power: float = 2.0   # used by activation="power" only
    bias: bool = False

    SLOTS, FAMILY, CARD_ORDER = (CHANNEL,), "feed-forward", 10
    CARD = Card(
        name="Feed-forward layer",
        written_by="training",
        holds="about d clean associations with a linear readout, order d^p with a power-p nonlinearity; "
              "measured, about 2 bits per parameter",
        reading_costs="the whole layer, for every token",
        forgets="only when later training overwrites it",
        source="arXiv 1706.03762; 2002.05202 (SwiGLU); 2109.08668 (ReLU^2); 1606.01164 (power)",
    )

    def __post_init__(self) -> None:
        self.check_positive("d_model", "d_ff")
        self.check(self.activation in ACTIVATIONS, "activation",
                   f"must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.activation == "power":
            self.check(self.power > 0, "power", f"must be > 0, got {self.power!r}")

    @property
    def gated(self) -> bool:
        return self.activation == "swiglu"

    def build(self) -> "FFN":
        return FFN(self)

    def num_params(self) -> ParamCount:
        D, Fw = self.d_model, self.d_ff
        n_in = 2 if self.gated else 1
        n = (n_in + 1) * D * Fw + (n_in * Fw + D if self.bias else 0)
        return ParamCount(stored=n, active=n)

    def footprint(self, context: int, *, dtype: str = "bf16") -> Footprint:
        # Nothing is kept from the context; the next token reads the whole layer.
        return Footprint(context=context, kept=0, read=0, state_bytes=0, read_flops=2 * self.num_params().active,
                         note="written in training: no context state; read_flops = 2 x weights")


class FFN(nn.Module):
    """W_down act(W_up x) (or W_down (silu(W_gate x) * W_up x)); weights named as in transformers."""

    def __init__(self, cfg: FFNConfig):
        super().__init__()
        self.cfg = cfg
        D, Fw = cfg.d_model, cfg.d_ff
        if cfg.gated:
            self.gate_proj = nn.Linear(D, Fw, bias=cfg.bias)
        self.up_proj = nn.Linear(D, Fw, bias=cfg.bias)
        self.down_proj = nn.Linear(Fw, D, bias=cfg.bias)
        self.act = _activation(cfg)

    def forward(self, x_BTD: Tensor, state: EmptyState | None = None, *, token_ids: Tensor | None = None
                ) -> tuple[Tensor, EmptyState]:
        check_input(x_BTD, self.cfg.d_model)
        seen = 0 if state is None else state.seen
        if self.cfg.gated:
            h_BTF = swiglu(self.gate_proj(x_BTD), self.up_proj(x_BTD))
        else:
            h_BTF = self.act(self.up_proj(x_BTD))
        return self.down_proj(h_BTF), EmptyState(seen=seen + x_BTD.shape[1])


def _activation(cfg: FFNConfig):
    if cfg.activation == "relu":
        return F.relu
    if cfg.activation == "relu2":
        return lambda h: F.relu(h).square()
    if cfg.activation == "power":
        p = cfg.power
        return lambda h: F.relu(h).pow(p)
    if cfg.activation == "gelu":
        return F.gelu
    return None  # swiglu is applied in forward
