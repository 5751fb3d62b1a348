"""Diagonal linear recurrences and Mamba's selective scan (Gu and Dao, arXiv 2312.00752).

A diagonal linear recurrence keeps one number per channel (per channel and state column for Mamba)
and updates each by its own factor:

    h_t = exp(la_t) * h_{t-1} + b_t,        la_t <= 0, the log of what the step keeps.

Mamba's selective SSM (its S6 layer) runs it with a row of N numbers per channel c, the step dt_t[c] > 0
chosen by the input, A = -exp(A_log) < 0 fixed per channel and column (zero-order hold of A, Euler
step for B, as in the paper and its kernels):

    la_t[c, n] = dt_t[c] A[c, n]
    b_t[c, n]  = dt_t[c] B_t[n] x_t[c]
    y_t[c]     = sum_n C_t[n] h_t[c, n]

RG-LRU (``storelab.ops.rglru``) runs it with one number per channel.

Two forms compute the same numbers (``mode``):

* ``"recurrent"``: token by token, the reference.
* ``"chunk"``: no loop over tokens. Two steps compose into one,
  (la2, b2) o (la1, b1) = (la1 + la2, exp(la2) b1 + b2), and composition is associative, so within chunks
  of ``chunk_size`` tokens every prefix comes in ceil(log2 chunk) rounds of pairwise compositions
  (Hillis and Steele's doubling, all chunks at once). The decays are summed as logs and only ever
  multiply (never divide: no exp(-cumsum) that overflows under strong decays, as the
  cumulative-sum form would). The chunks' totals are scanned the same way, giving each chunk's
  starting state, which enters every prefix of its chunk as exp(la_prefix) h_start. The work is
  about T log2(chunk) multiply-adds per state number, in a few large tensor operations. Its backward
  is written out (``_DiagonalScan``): the adjoint is the same recurrence run backwards, by the same
  chunked form, and only la, h and h_0 are kept for it.

States are kept in at least fp32 (``storelab.ops.precision``): bf16 inputs are widened before the
recurrence, and the outputs returned in the input's dtype.

Shape legend: B batch, T tokens, C channels, N state columns per channel (Mamba's ``d_state``);
``*S`` any state shape after [B, T] (the diagonal scan's).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from storelab.ops.precision import at_least_fp32, compute_dtype

__all__ = ["diagonal_scan", "selective_ssm"]

MODES = ("chunk", "recurrent")


def _check_mode(mode: str, chunk_size: int) -> None:
    if mode not in MODES:
        raise ValueError(f"mode: must be one of {MODES}, got {mode!r}")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size: must be > 0, got {chunk_size}")


def _prefixes(la: Tensor, b: Tensor, dim: int) -> tuple[Tensor, Tensor]:
    """Inclusive prefixes along ``dim`` of the steps (la, b), by doubling: after round r each position
    has composed the 2^(r+1) steps ending at it (those before the start are the identity, (0, 0))."""
    T, d = la.shape[dim], 1
    while d < T:
        head_la, tail_la, prev_la = la.narrow(dim, 0, d), la.narrow(dim, d, T - d), la.narrow(dim, 0, T - d)
        head_b, tail_b, prev_b = b.narrow(dim, 0, d), b.narrow(dim, d, T - d), b.narrow(dim, 0, T - d)
        b = torch.cat([head_b, tail_b + tail_la.exp() * prev_b], dim=dim)
        la = torch.cat([head_la, tail_la + prev_la], dim=dim)
        d *= 2
    return la, b


def _diagonal_chunked(la: Tensor, b: Tensor, h0: Tensor | None, chunk_size: int) -> tuple[Tensor, Tensor]:
    """Every state h_t [B, T, *S] and the last, by doubling within chunks and then across them."""
    B, T, *S = la.shape
    L = min(chunk_size, T)
    n = math.ceil(T / L)
    if n * L != T:  # identity steps after the end (la = 0, b = 0): the last state is unchanged
        pad = [0, 0] * len(S) + [0, n * L - T]
        la, b = F.pad(la, pad), F.pad(b, pad)
    la_p, b_p = _prefixes(la.view(B, n, L, *S), b.view(B, n, L, *S), dim=2)    # within each chunk, from zero
    end_la, end_b = _prefixes(la_p[:, :, -1], b_p[:, :, -1], dim=1)             # each chunk's end, from zero
    h_end = end_b if h0 is None else end_b + end_la.exp() * h0[:, None]          # B n *S
    first = h_end.new_zeros(B, 1, *S) if h0 is None else h0[:, None].to(h_end.dtype)
    h_start = torch.cat([first, h_end[:, :-1]], dim=1)                           # each chunk's start
    h = b_p + la_p.exp() * h_start[:, :, None]
    return h.reshape(B, n * L, *S)[:, :T], h_end[:, -1]


class _DiagonalScan(torch.autograd.Function):
    """The chunked form with its backward written out: the adjoint of a diagonal recurrence is the same
    recurrence run backwards, lam_t = g_t + exp(la_{t+1}) lam_{t+1} (g_t the gradient arriving on h_t, the
    final state's added at t = T - 1), scanned by the same chunked form on the reversed sequence. Then
    db_t = lam_t, dla_t = lam_t exp(la_t) h_{t-1}, dh_0 = exp(la_1) lam_1. Only la, h and h_0 are saved
    (autograd through the doubling would keep every round's tensors)."""

    @staticmethod
    def forward(ctx, la: Tensor, b: Tensor, h0: Tensor | None, chunk_size: int) -> tuple[Tensor, Tensor]:
        h, last = _diagonal_chunked(la, b, h0, chunk_size)
        ctx.save_for_backward(la, h, h0)
        ctx.chunk_size = chunk_size
        return h, last

    @staticmethod
    def backward(ctx, dh: Tensor, dlast: Tensor):
        la, h, h0 = ctx.saved_tensors
        g = dh.clone()
        g[:, -1] += dlast
        la_next = torch.cat([la[:, 1:], la.new_zeros(la[:, :1].shape)], dim=1)   # the step after t (none at T-1)
        lam = _diagonal_chunked(la_next.flip(1), g.flip(1), None, ctx.chunk_size)[0].flip(1)
        h_prev = torch.cat([h.new_zeros(h[:, :1].shape) if h0 is None else h0[:, None], h[:, :-1]], dim=1)
        dla = lam * la.exp() * h_prev if ctx.needs_input_grad[0] else None
        dh0 = la[:, 0].exp() * lam[:, 0] if h0 is not None and ctx.needs_input_grad[2] else None
        return dla, lam, dh0, None


def _diagonal_recurrent(la: Tensor, b: Tensor, h0: Tensor | None) -> tuple[Tensor, Tensor]:
    h = la.new_zeros(la.shape[:1] + la.shape[2:]) if h0 is None else h0.to(la.dtype)
    hs = []
    for t in range(la.shape[1]):
        h = la[:, t].exp() * h + b[:, t]
        hs.append(h)
    return torch.stack(hs, dim=1), h


def diagonal_scan(log_a: Tensor, b: Tensor, *, initial_state: Tensor | None = None, chunk_size: int = 64,
                  mode: str = "chunk") -> tuple[Tensor, Tensor]:
    """h_t = exp(log_a_t) h_{t-1} + b_t over dim 1: (every h_t [B, T, *S], the last [B, *S]).

    ``log_a`` <= 0 (-inf allowed: a step that forgets everything, a reset) and ``b`` are [B, T, *S];
    ``initial_state`` [B, *S] or None (zeros). Computed in at least fp32 (the inputs are widened).
    """
    _check_mode(mode, chunk_size)
    if log_a.shape != b.shape or log_a.dim() < 2:
        raise ValueError(f"diagonal_scan: expected log_a and b of one shape [B, T, ...], got {list(log_a.shape)} "
                         f"and {list(b.shape)}")
    if initial_state is not None and initial_state.shape != log_a.shape[:1] + log_a.shape[2:]:
        raise ValueError(f"initial_state: expected shape {list(log_a.shape[:1] + log_a.shape[2:])}, "
                         f"got {list(initial_state.shape)}")
    la, b = at_least_fp32(log_a), at_least_fp32(b)
    h0 = None if initial_state is None else initial_state.to(la.dtype)
    if b.shape[1] == 0:
        return b, (b.new_zeros(b.shape[:1] + b.shape[2:]) if h0 is None else h0)
    if mode == "recurrent":
        return _diagonal_recurrent(la, b, h0)
    return _DiagonalScan.apply(la, b, h0, chunk_size)


def selective_ssm(x_BTC: Tensor, dt_BTC: Tensor, A_CN: Tensor, B_BTN: Tensor, C_BTN: Tensor, *,
                  initial_state: Tensor | None = None, output_final_state: bool = False, chunk_size: int = 64,
                  mode: str = "chunk") -> tuple[Tensor, Tensor | None]:
    """Mamba's S6 recurrence: h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t, y_t = C_t . h_t (module docstring).

    x, dt (> 0, already through softplus) [B, T, C]; A (< 0) [C, N]; B, C [B, T, N]; ``initial_state``
    h_0 [B, C, N] or None (zeros). Returns y [B, T, C] in x's dtype (the D x skip and the SiLU(z) gate
    are the store's) and the last state [B, C, N] in at least fp32 when ``output_final_state``.
    """
    _check_mode(mode, chunk_size)
    Bsz, T, C = x_BTC.shape
    N = A_CN.shape[-1]
    for name, t, shape in (("dt_BTC", dt_BTC, (Bsz, T, C)), ("A_CN", A_CN, (C, N)), ("B_BTN", B_BTN, (Bsz, T, N)),
                           ("C_BTN", C_BTN, (Bsz, T, N)), ("initial_state", initial_state, (Bsz, C, N))):
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"{name}: expected shape {list(shape)}, got {list(t.shape)}")
    dtype = compute_dtype(x_BTC.dtype)
    x, dt = x_BTC.to(dtype), dt_BTC.to(dtype)
    A, Bm, Cm = A_CN.to(dtype), B_BTN.to(dtype), C_BTN.to(dtype)
    h0 = None if initial_state is None else initial_state.to(dtype)
    if mode == "recurrent":
        h = x.new_zeros(Bsz, C, N) if h0 is None else h0
        ys = []
        for t in range(T):
            h = (dt[:, t, :, None] * A).exp() * h + (dt[:, t] * x[:, t])[:, :, None] * Bm[:, t, None, :]
            ys.append((h * Cm[:, t, None, :]).sum(-1))
        y_BTC = torch.stack(ys, dim=1) if ys else x.new_zeros(Bsz, 0, C)
    else:
        la_BTCN = dt[..., None] * A                                                    # B T C N
        b_BTCN = (dt * x)[..., None] * Bm[:, :, None, :]
        h_BTCN, h = diagonal_scan(la_BTCN, b_BTCN, initial_state=h0, chunk_size=chunk_size)
        y_BTC = torch.einsum("btcn,btn->btc", h_BTCN, Cm)
    return y_BTC.to(x_BTC.dtype), (h if output_final_state else None)
