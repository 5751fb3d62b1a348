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
* ``gelu_tanh`` GELU's tanh approximation, 0.5 h (1 + tanh(sqrt(2/pi) (h + 0.044715 h^3)))
              (transformers' ``gelu_pytorch_tanh``; StarCoder2's ungated MLP);
* ``swiglu``  silu(W_gate x) * (W_up x), a gated unit (Shazeer, arXiv 2002.05202); with
              ``swiglu_limit`` both halves are clipped first (gate <= limit, |up| <= limit);
* ``geglu_tanh`` gelu_tanh(W_gate x) * (W_up x), GeGLU (Shazeer, arXiv 2002.05202) with the tanh
              approximation of GELU (Gemma's ``gelu_pytorch_tanh``);
* ``clamped_swiglu``  gpt-oss's unit (arXiv 2508.10925; MiniMax-M3's MLPs and experts):
              g sigmoid(swiglu_alpha g) (u + swiglu_up_shift) of the halves clipped as above.

Each activation is a declared object (``ACTIVATIONS``): ``Pointwise`` reads one projection,
``Gated`` two; the store takes its own at construction and forward just calls it. The ``moe``
store's experts use the gated ones (``Gated.unit``).

Update rule: none while reading; gradient descent writes the weights in training.
Parameters: 2 D F (3 D F gated), plus F + D biases (2F + D gated) when ``bias``.
State per token: none (EmptyState). Reading costs the whole layer for every token.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, ClassVar

import torch.nn.functional as F
from torch import Tensor, nn

from storelab.ops.routing import Unit, clamped_swiglu, swiglu
from storelab.state import EmptyState
from storelab.stores.base import CHANNEL, Card, Footprint, ParamCount, StoreConfig, check_input, register

__all__ = ["FFNConfig", "FFN", "ACTIVATIONS", "Pointwise", "Gated", "check_activation"]


# -- the activations, declared once; ``cfg`` gives their parameters (read at the call) -------------
@dataclass(frozen=True)
class Pointwise:
    """act(h) of one projection, h = W_up x."""

    fn: Callable[[Tensor, Any], Tensor]
    gated: ClassVar[bool] = False

    def hidden(self, ffn: "FFN", x_BTD: Tensor) -> Tensor:
        return self.fn(ffn.up_proj(x_BTD), ffn.cfg)

    def unit(self, cfg) -> Callable[[Tensor], Tensor]:
        """act(h) with this config's parameters (a plain expert's unit, ``grouped_swiglu(gated=False)``)."""
        return partial(self.fn, cfg=cfg)


@dataclass(frozen=True)
class Gated:
    """act(gate, up) of two projections, gate = W_gate x and up = W_up x (a gated linear unit)."""

    fn: Callable[[Tensor, Tensor, Any], Tensor]
    gated: ClassVar[bool] = True

    def hidden(self, ffn: "FFN", x_BTD: Tensor) -> Tensor:
        return self.fn(ffn.gate_proj(x_BTD), ffn.up_proj(x_BTD), ffn.cfg)

    def unit(self, cfg) -> Unit:
        """act(gate, up) with this config's parameters (what ``grouped_swiglu`` runs per expert)."""
        return partial(self.fn, cfg=cfg)


def _relu(h: Tensor, cfg) -> Tensor:
    return F.relu(h)


def _relu2(h: Tensor, cfg) -> Tensor:
    return F.relu(h).square()


def _power(h: Tensor, cfg) -> Tensor:
    return F.relu(h).pow(cfg.power)


def _gelu(h: Tensor, cfg) -> Tensor:
    return F.gelu(h)


def _gelu_tanh(h: Tensor, cfg) -> Tensor:
    return F.gelu(h, approximate="tanh")


def _swiglu(gate: Tensor, up: Tensor, cfg) -> Tensor:
    return swiglu(gate, up, limit=cfg.swiglu_limit)


def _geglu_tanh(gate: Tensor, up: Tensor, cfg) -> Tensor:
    return F.gelu(gate, approximate="tanh") * up


def _clamped_swiglu(gate: Tensor, up: Tensor, cfg) -> Tensor:
    return clamped_swiglu(gate, up, alpha=cfg.swiglu_alpha, limit=cfg.swiglu_limit, up_shift=cfg.swiglu_up_shift)


ACTIVATIONS: dict[str, Pointwise | Gated] = {
    "relu": Pointwise(_relu), "relu2": Pointwise(_relu2), "power": Pointwise(_power), "gelu": Pointwise(_gelu),
    "gelu_tanh": Pointwise(_gelu_tanh),
    "swiglu": Gated(_swiglu), "clamped_swiglu": Gated(_clamped_swiglu), "geglu_tanh": Gated(_geglu_tanh),
}
SWIGLU_ALPHA, SWIGLU_UP_SHIFT = 1.702, 1.0  # gpt-oss's clamped_swiglu


def check_activation(cfg, allowed: tuple[str, ...]) -> None:
    """Validate ``activation`` and the ``swiglu_*`` fields of an ffn or moe config (errors name the field)."""
    cfg.check(cfg.activation in allowed, "activation", f"must be one of {allowed}, got {cfg.activation!r}")
    gated = ACTIVATIONS[cfg.activation].gated
    if cfg.swiglu_limit is not None:
        cfg.check(gated, "swiglu_limit", f"clips a gated unit; activation {cfg.activation!r} has none")
        cfg.check(cfg.swiglu_limit > 0, "swiglu_limit", f"must be > 0, got {cfg.swiglu_limit!r}")
    if cfg.activation == "clamped_swiglu":
        cfg.check(cfg.swiglu_alpha > 0, "swiglu_alpha", f"must be > 0, got {cfg.swiglu_alpha!r}")
    else:
        cfg.check(cfg.swiglu_alpha == SWIGLU_ALPHA, "swiglu_alpha",
                  f"used by activation='clamped_swiglu' only (activation is {cfg.activation!r})")
        cfg.check(cfg.swiglu_up_shift == SWIGLU_UP_SHIFT, "swiglu_up_shift",
                  f"used by activation='clamped_swiglu' only (activation is {cfg.activation!r})")


@register("ffn")
@dataclass(kw_only=True)
class FFNConfig(StoreConfig):
    d_model: int
    d_ff: int
    activation: str = "swiglu"          # a key of ACTIVATIONS
    power: float = 2.0                   # activation="power" only
    swiglu_limit: float | None = None    # gated activations: clip gate <= limit, |up| <= limit first
    swiglu_alpha: float = SWIGLU_ALPHA   # clamped_swiglu only: g sigmoid(alpha g) ...
    swiglu_up_shift: float = SWIGLU_UP_SHIFT  # clamped_swiglu only: ... (u + up_shift)
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
        check_activation(self, tuple(ACTIVATIONS))
        if self.activation == "power":
            self.check(self.power > 0, "power", f"must be > 0, got {self.power!r}")

    @property
    def gated(self) -> bool:
        return ACTIVATIONS[self.activation].gated

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
    """W_down act(W_up x), or W_down act(W_gate x, W_up x) for a gated activation; weights named as in
    transformers. ``act`` is the config's declared activation, taken once here."""

    def __init__(self, cfg: FFNConfig):
        super().__init__()
        self.cfg = cfg
        D, Fw = cfg.d_model, cfg.d_ff
        if cfg.gated:
            self.gate_proj = nn.Linear(D, Fw, bias=cfg.bias)
        self.up_proj = nn.Linear(D, Fw, bias=cfg.bias)
        self.down_proj = nn.Linear(Fw, D, bias=cfg.bias)
        self.act = ACTIVATIONS[cfg.activation]

    def forward(self, x_BTD: Tensor, state: EmptyState | None = None, *, token_ids: Tensor | None = None
                ) -> tuple[Tensor, EmptyState]:
        check_input(x_BTD, self.cfg.d_model)
        seen = 0 if state is None else state.seen
        h_BTF = self.act.hidden(self, x_BTD)
        return self.down_proj(h_BTF), EmptyState(seen=seen + x_BTD.shape[1])

