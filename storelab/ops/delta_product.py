"""Gated DeltaProduct (Siems et al., arXiv 2502.10297): n delta-rule writes per token after one decay.

For token t with n keys k_{t,1..n}, values v_{t,1..n}, write steps beta_{t,1..n} and a log decay
g_t per head (or none):

    S_{t,0} = exp(g_t) S_{t-1}
    S_{t,j} = S_{t,j-1} + beta_{t,j} k_{t,j} (v_{t,j} - S_{t,j-1}^T k_{t,j})^T             j = 1 .. n
            = (I - beta_{t,j} k_{t,j} k_{t,j}^T) S_{t,j-1} + beta_{t,j} k_{t,j} v_{t,j}^T
    o_t     = S_{t,n}^T (scale q_t)

so a token's transition is exp(g_t) prod_j (I - beta_{t,j} k_{t,j} k_{t,j}^T), a product of n
generalised Householder matrices (unit k): with beta in [0, 2] each factor is a reflection at
beta = 2, and two of them make a rotation, which one factor per token (Gated DeltaNet, n = 1)
cannot (the paper's section 4; essay section 6 for the one-factor case, parity).

Layout: q [B, T, H, K]; k [B, T, n, H, K] and v [B, T, n, HV, V], each token's n writes in order;
beta [B, T, n, HV]; g [B, T, HV] or None; state [B, HV, K, V]. As the ops of
``storelab.ops.delta``: HV a multiple of H (value head h reads query/key head h // (HV / H)), g and
beta per value head, ``scale`` multiplies q (default K ** -0.5), float64 kept and anything else
computed in float32, returns (o [B, T, HV, V] in v's dtype, the final state or None). fla's layout
(``naive_recurrent_gated_delta_product``) is ours with the n writes of token t flattened into rows
t n .. t n + n - 1: ``k.flatten(1, 2)``.

Three evaluations that agree (tests/test_delta_product.py holds them equal, and to fla's reference):

* ``mode="recurrent"``: the per-token loop above (the reference), sub-steps by
  ``storelab.ops.delta.recurrent_step``;
* ``mode="chunk"`` (default): the n writes interleaved as n T sub-steps of the gated delta rule,
  run by ``storelab.ops.gated_delta_rule``'s chunked form: sub-step t n + j writes (k_{t,j}, v_{t,j},
  beta_{t,j}), decays by g_t at j = 0 and by nothing after (g = 0), and is read at j = n - 1 only
  (q there, 0 at the others, whose outputs are dropped). ``chunk_size`` counts sub-steps, as in
  fla's ``chunk_gated_delta_product``. Under autograd it trains by that op's hand-written backward;
* ``mode="scan"``: the same sub-steps through the gated delta rule's parallel scan (differentiable).

Shape legend: B batch, T tokens, n writes per token, H query/key heads, HV value heads, K key
width, V value width.
"""

from __future__ import annotations

import torch
from torch import Tensor

from storelab.ops.delta import MODES, gated_delta_rule, recurrent_step

__all__ = ["gated_delta_product"]


def _check_shapes(q, k, v, g, beta, initial_state) -> tuple[int, int, int, int, int, int, int]:
    """A ValueError naming the argument unless the shapes fit; returns (B, T, n, H, K, HV, V)."""
    if q.dim() != 4 or k.dim() != 5 or k.shape[:2] != q.shape[:2] or k.shape[3:] != q.shape[2:]:
        raise ValueError(f"q, k: expected q [B, T, H, K] and k [B, T, n, H, K] (gated_delta_product), got "
                         f"{list(q.shape)}, {list(k.shape)}")
    B, T, n, H, K = k.shape
    if v.dim() != 5 or v.shape[:3] != (B, T, n):
        raise ValueError(f"v: expected shape [B, T, n, HV, V] with [B, T, n] = {[B, T, n]}, got {list(v.shape)}")
    HV, V = v.shape[3], v.shape[4]
    if HV % H:
        raise ValueError(f"v: {HV} value heads are not a multiple of {H} query/key heads (gated_delta_product)")
    if tuple(beta.shape) != (B, T, n, HV):
        raise ValueError(f"beta: expected shape [B, T, n, HV] = {[B, T, n, HV]}, got {list(beta.shape)}")
    if g is not None and tuple(g.shape) != (B, T, HV):
        raise ValueError(f"g: expected shape [B, T, HV] = {[B, T, HV]} (one decay per token), got {list(g.shape)}")
    if initial_state is not None and tuple(initial_state.shape) != (B, HV, K, V):
        raise ValueError(f"initial_state: expected shape {[B, HV, K, V]}, got {list(initial_state.shape)}")
    if n < 1:
        raise ValueError("k: need at least one write per token (n >= 1)")
    return B, T, n, H, K, HV, V


def _per_token(q, k, v, g, beta, scale, S_BHKV):
    """The reference: token by token, the decay then the n writes, the read after the last."""
    B, T, n, HV, V = v.shape
    if HV != q.shape[2]:  # grouped heads: value head h reads query/key head h // (HV / H)
        q, k = q.repeat_interleave(HV // q.shape[2], dim=2), k.repeat_interleave(HV // q.shape[2], dim=3)
    o = []
    for t in range(T):
        for j in range(n):
            o_t, S_BHKV = recurrent_step(q[:, t], k[:, t, j], v[:, t, j], S_BHKV, beta=beta[:, t, j], scale=scale,
                                         g=g[:, t] if g is not None and j == 0 else None)
        o.append(o_t)  # the read after the token's last write
    return (torch.stack(o, dim=1) if o else v.new_zeros(B, 0, HV, V)), S_BHKV


def _interleaved(q, k, v, g, beta):
    """The n T sub-steps of the gated delta rule: sub-step t n + j is write j of token t."""
    B, T, n, H, K = k.shape
    HV = v.shape[3]
    q_sub = torch.cat([q.new_zeros(B, T, n - 1, H, K), q[:, :, None]], dim=2)          # read at j = n - 1 only
    g = q.new_zeros(B, T, HV) if g is None else g
    g_sub = torch.cat([g[:, :, None], g.new_zeros(B, T, n - 1, HV)], dim=2)           # decay at j = 0 only
    return q_sub.flatten(1, 2), k.flatten(1, 2), v.flatten(1, 2), g_sub.flatten(1, 2), beta.flatten(1, 2)


def gated_delta_product(q: Tensor, k: Tensor, v: Tensor, *, g: Tensor | None = None, beta: Tensor,
                        scale: float | None = None, initial_state: Tensor | None = None,
                        output_final_state: bool = False, chunk_size: int | None = None,
                        mode: str = "chunk") -> tuple[Tensor, Tensor | None]:
    """Gated DeltaProduct: per token, decay by exp(g_t) (g [B,T,HV] or None), then n delta writes
    (k [B,T,n,H,K], v [B,T,n,HV,V], beta [B,T,n,HV]) in order, then the read of q [B,T,H,K]."""
    if mode not in MODES:
        raise ValueError(f"mode: must be one of {MODES}, got {mode!r}")
    if chunk_size is not None and chunk_size < 1:  # None: chosen for this CPU (storelab.ops.tuning)
        raise ValueError(f"chunk_size: must be >= 1, got {chunk_size}")
    B, T, n, H, K, HV, V = _check_shapes(q, k, v, g, beta, initial_state)
    scale = K ** -0.5 if scale is None else scale
    if mode == "recurrent":
        out_dtype = v.dtype
        dt = torch.float64 if q.dtype == torch.float64 else torch.float32
        q, k, v, beta = q.to(dt), k.to(dt), v.to(dt), beta.to(dt)
        g = None if g is None else g.to(dt)
        S0 = q.new_zeros(B, HV, K, V) if initial_state is None else initial_state.to(dt)
        o, S = _per_token(q, k, v, g, beta, scale, S0)
        return o.to(out_dtype), (S if output_final_state else None)
    q_s, k_s, v_s, g_s, beta_s = _interleaved(q, k, v, g, beta)
    o_s, S = gated_delta_rule(q_s, k_s, v_s, g=g_s, beta=beta_s, scale=scale, initial_state=initial_state,
                              output_final_state=output_final_state, chunk_size=chunk_size, mode=mode)
    return o_s.view(B, T, n, HV, V)[:, :, -1], S
