"""The Real-Gated Linear Recurrent Unit of Griffin and RecurrentGemma (De et al., arXiv 2402.19427).

One number per channel, updated by a decay the input chooses:

    log a_t = -c r_t softplus(p)              (a_t = sigmoid(-p)^(c r_t) in (0, 1); c = 8)
    h_t     = a_t h_{t-1} + sqrt(1 - a_t^2) (i_t * x_t)

with r_t the recurrence gate and i_t the input gate (both in (0, 1), computed by the store), and p the
learned ``recurrent_param`` per channel (transformers' name and sign: the paper's Lambda is -p, so
a = sigma(Lambda)^(c r)). The multiplier sqrt(1 - a^2) keeps h at the scale of its input; at a
document's first token (``reset``) the step forgets everything and takes the input whole
(a = 0, multiplier 1), as transformers does where ``position_ids == 0``.

The multiplier's square root has its derivative bounded, as in the released model (its
``SqrtBoundDerivative``): d sqrt(u)/du = 1 / sqrt(max(4u, 1e-6)), so a gate near a = 1 cannot blow up
a bf16 gradient.

Two forms (``mode``), both on ``storelab.ops.selective_scan.diagonal_scan``: ``"recurrent"`` token by
token (the reference), ``"chunk"`` the doubling scan within chunks with state passing between them
(no loop over tokens). The state is kept in at least fp32; h is returned in x's dtype.

Shape legend: B batch, T tokens, C channels (``lru_width``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from storelab.ops.precision import compute_dtype
from storelab.ops.selective_scan import diagonal_scan

__all__ = ["rg_lru", "rg_lru_log_decay"]

MAX_SQRT_GRADIENT = 1000.0  # the released model's bound on d sqrt(u) / du


class _SqrtBoundDerivative(torch.autograd.Function):
    """sqrt(u) whose derivative is at most MAX_SQRT_GRADIENT."""

    @staticmethod
    def forward(ctx, u: Tensor) -> Tensor:
        ctx.save_for_backward(u)
        return u.sqrt()

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (u,) = ctx.saved_tensors
        return grad / (4.0 * u).clamp(min=1.0 / MAX_SQRT_GRADIENT ** 2).sqrt()


def rg_lru_log_decay(recurrent_gate_BTC: Tensor, recurrent_param_C: Tensor, *, c: float = 8.0) -> Tensor:
    """log a_t = -c r_t softplus(p) <= 0, [B, T, C], in at least fp32."""
    dtype = compute_dtype(recurrent_gate_BTC.dtype)
    return -c * recurrent_gate_BTC.to(dtype) * F.softplus(recurrent_param_C.to(dtype))


def rg_lru(x_BTC: Tensor, *, input_gate: Tensor, recurrent_gate: Tensor, recurrent_param: Tensor, c: float = 8.0,
           reset: Tensor | None = None, initial_state: Tensor | None = None, output_final_state: bool = False,
           chunk_size: int = 64, mode: str = "chunk") -> tuple[Tensor, Tensor | None]:
    """The RG-LRU over x [B, T, C] (module docstring): (h [B, T, C] in x's dtype, last h [B, C] or None).

    ``input_gate``, ``recurrent_gate`` [B, T, C] in (0, 1); ``recurrent_param`` [C]; ``reset`` [B, T] bool
    or None (no document starts in this call); ``initial_state`` [B, C] or None (zeros).
    """
    B, T, C = x_BTC.shape
    for name, t, shape in (("input_gate", input_gate, (B, T, C)), ("recurrent_gate", recurrent_gate, (B, T, C)),
                           ("recurrent_param", recurrent_param, (C,)), ("reset", reset, (B, T))):
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"{name}: expected shape {list(shape)}, got {list(t.shape)}")
    dtype = compute_dtype(x_BTC.dtype)
    log_a = rg_lru_log_decay(recurrent_gate, recurrent_param, c=c)
    multiplier = _SqrtBoundDerivative.apply(-torch.expm1(2.0 * log_a))                # sqrt(1 - a^2)
    if reset is not None:
        reset_BT1 = reset[:, :, None]
        multiplier = torch.where(reset_BT1, 1.0, multiplier)
        log_a = log_a.masked_fill(reset_BT1, float("-inf"))
    b = x_BTC.to(dtype) * input_gate.to(dtype) * multiplier
    h_BTC, h_last = diagonal_scan(log_a, b, initial_state=initial_state, chunk_size=chunk_size, mode=mode)
    return h_BTC.to(x_BTC.dtype), (h_last if output_final_state else None)
