"""Affine updates and their parallel scan (essay section 6, "parallel evaluation depth").

A recurrent store's update is affine in its state, ``S_t = A_t S_{t-1} + b_t``, and two
consecutive updates compose into one:

    (A2, b2) o (A1, b1) = (A2 A1, A2 b1 + b2).

Composition is associative, so the prefixes of L updates need only ceil(log2 L) rounds of
pairwise compositions (Hillis and Steele's scan, 1986; Blelloch, CMU-CS-90-190). This is how
such layers are trained in parallel; the delta-rule transition

    A_t = (I - beta_t k_t k_t^T) diag(exp(g_t)),   b_t = beta_t k_t v_t^T

mixes coordinates (it is not diagonal), which is why where these layers sit in circuit
classes depends on the gates' ranges (Merrill, Petty and Sabharwal, arXiv 2404.08819).

``affine_scan(A_TNN, b_TNM)`` returns every prefix and the number of rounds;
``delta_states_by_scan`` evaluates the state sequence of any of storelab.ops.delta's rules
that way (the ops' ``mode="scan"``).

Shape legend: T steps (any leading batch axes before T), N state rows, M state columns;
B batch, H heads, K key width, V value width.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["affine_compose", "affine_scan", "delta_transitions", "delta_states_by_scan"]


def affine_compose(A2: Tensor, b2: Tensor, A1: Tensor, b1: Tensor) -> tuple[Tensor, Tensor]:
    """(A2, b2) o (A1, b1): apply (A1, b1) first, then (A2, b2)."""
    return A2 @ A1, A2 @ b1 + b2


def affine_scan(A_TNN: Tensor, b_TNM: Tensor) -> tuple[Tensor, Tensor, int]:
    """Inclusive prefixes P_t = (A_t, b_t) o ... o (A_1, b_1), by Hillis-Steele doubling.

    A is [..., T, N, N] and b is [..., T, N, M]. Round r composes each prefix with the one
    2^r steps back; after ceil(log2 T) rounds prefix t covers steps 1..t, so
    ``S_t = A_pref[t] @ S_0 + b_pref[t]`` equals the sequential recurrence. Returns
    ``(A_pref, b_pref, rounds)``.
    """
    if A_TNN.shape[:-2] != b_TNM.shape[:-2] or A_TNN.shape[-1] != A_TNN.shape[-2] or A_TNN.shape[-1] != b_TNM.shape[-2]:
        raise ValueError(f"affine_scan: expected A [..., T, N, N] and b [..., T, N, M], got {list(A_TNN.shape)} "
                         f"and {list(b_TNM.shape)}")
    T = A_TNN.shape[-3]
    A, b = A_TNN, b_TNM
    rounds, d = 0, 1
    while d < T:
        # steps t >= d take the prefix ending d steps earlier as their right operand
        A_new, b_new = affine_compose(A[..., d:, :, :], b[..., d:, :, :], A[..., :-d, :, :], b[..., :-d, :, :])
        A = torch.cat([A[..., :d, :, :], A_new], dim=-3)
        b = torch.cat([b[..., :d, :, :], b_new], dim=-3)
        rounds += 1
        d *= 2
    assert rounds == (math.ceil(math.log2(T)) if T > 1 else 0)
    return A, b, rounds


def delta_transitions(k_BTHK: Tensor, v_BTHV: Tensor, *, g: Tensor | None = None,
                      beta: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Per-token affine maps (A_t [B,T,H,K,K], b_t [B,T,H,K,V]) of storelab.ops.delta's rules.

    g: None, [B,T,H] (per head) or [B,T,H,K] (per channel) log decay; beta: None (additive
    write, linear attention) or [B,T,H] (delta rule). The state layout is S [K, V].
    """
    B, T, H, K = k_BTHK.shape
    eye = torch.eye(K, dtype=k_BTHK.dtype, device=k_BTHK.device)
    if g is None:
        decay = eye.expand(B, T, H, K, K)
    elif g.dim() == 3:
        decay = g.exp()[..., None, None] * eye
    else:
        decay = torch.diag_embed(g.exp())
    kk = k_BTHK[..., :, None] * k_BTHK[..., None, :]                                     # B T H K K
    if beta is None:
        return decay, k_BTHK[..., :, None] * v_BTHV[..., None, :]
    A = (eye - beta[..., None, None] * kk) @ decay
    b = beta[..., None, None] * k_BTHK[..., :, None] * v_BTHV[..., None, :]
    return A, b


def delta_states_by_scan(k_BTHK: Tensor, v_BTHV: Tensor, *, g: Tensor | None = None, beta: Tensor | None = None,
                         initial_state: Tensor | None = None) -> tuple[Tensor, int]:
    """Every state S_t [B,T,H,K,V] by ``affine_scan``, and the number of rounds it took."""
    A, b = delta_transitions(k_BTHK, v_BTHV, g=g, beta=beta)
    A = A.transpose(1, 2)                                                                 # B H T K K
    b = b.transpose(1, 2)
    A_pref, b_pref, rounds = affine_scan(A, b)
    S = b_pref if initial_state is None else A_pref @ initial_state[:, :, None] + b_pref
    return S.transpose(1, 2), rounds
