"""Mamba-2's state space duality (SSD; Dao and Gu, arXiv 2405.21060): a scalar-decay linear recurrence.

Per head h, a matrix state S [P, N] (P head width, N state width), one decay per head and token:

    a_t = exp(dt_t * A_h)                      (A_h < 0, dt_t > 0: 0 < a_t < 1)
    S_t = a_t S_{t-1} + dt_t x_t B_t^T         (an outer product; no delta correction)
    y_t = S_t C_t + D_h x_t

B_t and C_t [N] are shared by the R = H / G heads of a group (``n_groups`` G), as keys and queries are
shared in grouped attention. Two forms compute it, with the same sums:

* ``mode="recurrent"``: the per-token loop above, the reference.
* ``mode="chunk"``: the chunked form of section 6 of the paper. Tokens in chunks of L; with the
  cumulative log decay within a chunk G_l = sum_{i <= l} dt_i A, each chunk is

      y_l = sum_{s <= l} (C_l . B_s) exp(G_l - G_s) dt_s x_s       (intra-chunk, a masked L x L form:
                                                                    the segment sums G_l - G_s, s <= l)
          + exp(G_l) S_0 C_l                                         (the state carried into the chunk)
          + D x_l
      S_L = exp(G_L) S_0 + sum_s exp(G_L - G_s) dt_s x_s B_s^T       (the state passed to the next chunk)

  Every exponent is a sum of log decays over a segment, so <= 0: nothing overflows however strong the
  decay (no division by a cumulative decay, unlike the per-channel delta rules), and each segment is
  summed on its own (``_segment_sums``), not as a difference of running sums. The chunks pass their
  states in a loop over T / L chunks (linear in T); within a chunk everything is a batched matrix product.
  Its backward is written by hand (``_ChunkedSSD``): it keeps the inputs and each chunk's starting state,
  recomputes the L x L decays and scores, and passes the state's gradient back along the chunks; no
  per-token loop either way. The same sums, tested against autograd through the per-token loop.

Signature (layout [B, T, H, P] as every op; documented once here)::

    ssd(x, dt, A, B, C, *, D=None, initial_state=None, output_final_state=False, chunk_size=64, mode="chunk")

    x              [B, T, H, P]   the values written (Mamba-2's x after its short convolution)
    dt             [B, T, H]      the step, > 0 (softplus and any clamp already applied by the caller)
    A              [H]            the decay rate, < 0 (Mamba-2 keeps A = -exp(A_log))
    B, C           [B, T, G, N]   the write and read vectors, G dividing H (head h reads group h // R)
    D              [H] or None    the skip connection
    initial_state  [B, H, P, N]   the state before the first token (zeros if None)

Returns (y [B, T, H, P], final state [B, H, P, N] or None). Inputs of any float dtype; the sums run and
y and the state come back in at least fp32 (bf16 inputs: fp32, as Mamba-2 keeps its state; fp64 stays fp64).
The state's layout [B, H, P, N] is that of transformers' Mamba2 cache (``ssm_state``).

Shape legend: B batch, T tokens, H heads, P head width, G groups of heads sharing B and C, R = H / G heads
per group, N state width, n chunks, L tokens per chunk (l the reading token, s the writing one).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from storelab.ops.precision import compute_dtype

__all__ = ["ssd"]

MODES = ("chunk", "recurrent")


def _check(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, D: Tensor | None, S: Tensor | None) -> None:
    if x.dim() != 4:
        raise ValueError(f"x: expected [B, T, H, P], got {list(x.shape)}")
    b, T, H, P = x.shape
    if dt.shape != (b, T, H):
        raise ValueError(f"dt: expected {[b, T, H]}, got {list(dt.shape)}")
    if A.shape != (H,):
        raise ValueError(f"A: expected [{H}], got {list(A.shape)}")
    if B.dim() != 4 or B.shape[:2] != (b, T) or B.shape != C.shape:
        raise ValueError(f"B, C: expected [{b}, {T}, G, N] each, got {list(B.shape)} and {list(C.shape)}")
    if H % B.shape[2]:
        raise ValueError(f"B, C: {B.shape[2]} groups do not divide {H} heads")
    if D is not None and D.shape != (H,):
        raise ValueError(f"D: expected [{H}], got {list(D.shape)}")
    if S is not None and S.shape != (b, H, P, B.shape[3]):
        raise ValueError(f"initial_state: expected {[b, H, P, B.shape[3]]}, got {list(S.shape)}")


def _recurrent(x, dt, A, B, C, S_BHPN):
    """The per-token reference: S = a S + dt x B^T, y = S C."""
    H = x.shape[2]
    R = H // B.shape[2]
    B_BTHN, C_BTHN = B.repeat_interleave(R, dim=2), C.repeat_interleave(R, dim=2)
    a_BTH = torch.exp(dt * A)
    ys = []
    for t in range(x.shape[1]):
        write_BHPN = (dt[:, t, :, None] * x[:, t])[..., None] * B_BTHN[:, t, :, None, :]
        S_BHPN = a_BTH[:, t, :, None, None] * S_BHPN + write_BHPN
        ys.append(torch.einsum("bhpn,bhn->bhp", S_BHPN, C_BTHN[:, t]))
    return torch.stack(ys, dim=1), S_BHPN


def _segment_sums(a_XL: Tensor) -> Tensor:
    """seg[..., l, s] = a_{s+1} + ... + a_l for s <= l (0 on the diagonal), -inf for s > l.

    Each segment is summed on its own (a cumulative sum down the masked columns), not as the difference
    G_l - G_s of two running sums: with strong decays those run to thousands, and their difference would
    lose the few units that matter (fp32 keeps about 7 digits)."""
    L = a_XL.shape[-1]
    below = torch.ones(L, L, dtype=torch.bool, device=a_XL.device).tril(-1)        # [i, s]: i > s
    seg = torch.cumsum(a_XL[..., :, None].expand(*a_XL.shape, L).masked_fill(~below, 0.0), dim=-2)
    return seg.masked_fill(~below.logical_or(torch.eye(L, dtype=torch.bool, device=a_XL.device)), float("-inf"))


def _chunk_layout(x, dt, B, C, L: int):
    """x, dt, B, C padded to whole chunks and viewed [B, n, L, G, R, P], [B, n, G, R, L], [B, n, L, G, N] x 2.
    Past the end dt = 0: a = 1 and nothing written, so the final state is the last token's."""
    b, T, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    R, pad = H // G, -T % L
    if pad:
        x, dt, B, C = (F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for t in (x, dt, B, C))
    n = (T + pad) // L
    return (x.reshape(b, n, L, G, R, P), dt.reshape(b, n, L, G, R).permute(0, 1, 3, 4, 2),
            B.reshape(b, n, L, G, N), C.reshape(b, n, L, G, N))


def _chunk_forward(x_BnLGRP, dt_BnGRL, A_GR, B_BnLGN, C_BnLGN, S_BGRPN):
    """The chunked form (module docstring) in chunk layout, groups kept apart so C . B is made once per
    group. Returns y [B, n, L, G, R, P], the final state and the state each chunk starts from."""
    a_BnGRL = dt_BnGRL * A_GR[..., None]                                              # log decay of each token
    E_BnGRLL = _segment_sums(a_BnGRL).exp()                                           # exp(G_l - G_s), 0 above

    # intra-chunk: scores C_l . B_s per group, weighted by the segment's decay exp(G_l - G_s) (s <= l) and dt_s
    CB_BnGLL = torch.einsum("bclgn,bcsgn->bcgls", C_BnLGN, B_BnLGN)
    M_BnGRLL = CB_BnGLL[:, :, :, None] * E_BnGRLL * dt_BnGRL[..., None, :]
    y_BnLGRP = torch.einsum("bcgrls,bcsgrp->bclgrp", M_BnGRLL, x_BnLGRP)

    # each chunk's own write, decayed to its end: sum_s exp(G_L - G_s) dt_s x_s B_s^T (G_L - G_s: the last row)
    w_BnGRL = E_BnGRLL[..., -1, :] * dt_BnGRL
    writes_BnGRPN = torch.einsum("bclgrp,bclgn->bcgrpn", w_BnGRL.permute(0, 1, 4, 2, 3)[..., None] * x_BnLGRP,
                                 B_BnLGN)
    e_BnGRL = torch.cumsum(a_BnGRL, dim=-1).exp()                                     # exp(G_l): decay from the start

    # inter-chunk: pass the state along the chunks (n steps), keeping the state each chunk starts from
    decay_BnGR = e_BnGRL[..., -1]
    starts = []
    for c in range(x_BnLGRP.shape[1]):
        starts.append(S_BGRPN)
        S_BGRPN = decay_BnGR[:, c, :, :, None, None] * S_BGRPN + writes_BnGRPN[:, c]
    S0_BnGRPN = torch.stack(starts, dim=1)
    carried_BnLGRP = torch.einsum("bclgn,bcgrpn->bclgrp", C_BnLGN, S0_BnGRPN)
    y_BnLGRP = y_BnLGRP + carried_BnLGRP * e_BnGRL.permute(0, 1, 4, 2, 3)[..., None]
    return y_BnLGRP, S_BGRPN, S0_BnGRPN


def _segment_grad(dseg_XLL: Tensor) -> Tensor:
    """The gradient of the log decays a_i from that of their segment sums seg[l, s] = a_{s+1} + ... + a_l:
    da_i = sum over l >= i and s < i of dseg[l, s] (dseg zero above the diagonal)."""
    L = dseg_XLL.shape[-1]
    before_i = F.pad(torch.cumsum(dseg_XLL, dim=-1)[..., :-1], (1, 0))                # [l, i]: sum_{s < i} dseg[l, s]
    at_or_after = torch.ones(L, L, dtype=torch.bool, device=dseg_XLL.device).tril()  # [l, i]: l >= i
    return before_i.masked_fill(~at_or_after, 0.0).sum(-2)


class _ChunkedSSD(torch.autograd.Function):
    """The chunked form with its backward by hand: the forward keeps only its inputs and each chunk's
    starting state; the backward recomputes the decays and scores chunk by chunk in parallel and passes
    the state's gradient back along the chunks (the forward's loop, reversed). Its gradients are autograd's
    through the per-token reference (tests/test_mamba2.py: float64 to 1e-10, fp32, gradcheck).

    The backward's tensors are in chunk layout without suffixes: x, dy, dx [B, n, L, G, R, P]; dt, a, e
    (exp of the running sum), w and their gradients [B, n, G, R, L]; E, M, dM, dseg [B, n, G, R, L, L];
    CB, dCB [B, n, G, L, L]; B, C, dB, dC [B, n, L, G, N]; states [B, (n,) G, R, P, N]."""

    @staticmethod
    def forward(ctx, x, dt, A, B, C, S_BHPN, L: int):
        b, T, H, P = x.shape
        G, N = B.shape[2], B.shape[3]
        xc, dtc, Bc, Cc = _chunk_layout(x, dt, B, C, L)
        A_GR = A.reshape(G, H // G)
        y_BnLGRP, S_BGRPN, S0_BnGRPN = _chunk_forward(xc, dtc, A_GR, Bc, Cc, S_BHPN.reshape(b, G, H // G, P, N))
        ctx.save_for_backward(xc, dtc, A_GR, Bc, Cc, S0_BnGRPN)
        ctx.T = T
        return y_BnLGRP.reshape(b, -1, H, P)[:, :T], S_BGRPN.reshape(b, H, P, N)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy_BTHP, dS_BHPN):
        x, dt, A, B, C, S0 = ctx.saved_tensors                                         # chunk layout (see forward)
        b, n, L, G, R, P = x.shape
        N, T = B.shape[-1], ctx.T
        dy = torch.zeros_like(x) if dy_BTHP is None else F.pad(
            dy_BTHP.to(x.dtype), (0, 0, 0, 0, 0, n * L - T)).reshape(b, n, L, G, R, P)
        dS = x.new_zeros(b, G, R, P, N) if dS_BHPN is None else dS_BHPN.to(x.dtype).reshape(b, G, R, P, N)

        # recompute the forward's decays and scores
        a = dt * A[..., None]                                                             # [b, n, G, R, L]
        E = _segment_sums(a).exp()                                                        # [b, n, G, R, L, L]
        e = torch.cumsum(a, dim=-1).exp()
        CB = torch.einsum("bclgn,bcsgn->bcgls", C, B)
        CE = CB[:, :, :, None] * E
        M = CE * dt[..., None, :]
        w = E[..., -1, :] * dt
        e_LGR1 = e.permute(0, 1, 4, 2, 3)[..., None]                                     # [b, n, L, G, R, 1]

        # intra-chunk: y_l += sum_s M[l, s] x_s
        dM = torch.einsum("bclgrp,bcsgrp->bcgrls", dy, x)
        dx = torch.einsum("bcgrls,bclgrp->bcsgrp", M, dy)
        dseg = dM * M
        ddt = (dM * CE).sum(-2)
        dCB = (dM * E * dt[..., None, :]).sum(3)
        dC = torch.einsum("bcgls,bcsgn->bclgn", dCB, B)
        dB = torch.einsum("bcgls,bclgn->bcsgn", dCB, C)

        # carried state: y_l += exp(G_l) S0 C_l
        dye = dy * e_LGR1
        de = (dy * torch.einsum("bclgn,bcgrpn->bclgrp", C, S0)).sum(-1).permute(0, 1, 3, 4, 2) * e
        dC = dC + torch.einsum("bclgrp,bcgrpn->bclgn", dye, S0)
        dS0_own = torch.einsum("bclgrp,bclgn->bcgrpn", dye, C)

        # along the chunks, reversed: S_{c+1} = exp(G_L) S_c + W_c
        decay = e[..., -1]
        dW, ddecay = [None] * n, [None] * n
        for c in reversed(range(n)):
            dW[c], ddecay[c] = dS, (dS * S0[:, c]).sum((-2, -1))
            dS = decay[:, c, :, :, None, None] * dS + dS0_own[:, c]
        dW, ddecay = torch.stack(dW, dim=1), torch.stack(ddecay, dim=1)
        de[..., -1] += ddecay * decay

        # each chunk's write W = sum_s w_s x_s B_s^T
        dWB = torch.einsum("bcgrpn,bclgn->bclgrp", dW, B)
        w_LGR1 = w.permute(0, 1, 4, 2, 3)[..., None]
        dx = dx + w_LGR1 * dWB
        dw = (dWB * x).sum(-1).permute(0, 1, 3, 4, 2)
        dB = dB + torch.einsum("bclgrp,bcgrpn->bclgn", w_LGR1 * x, dW)
        ddt = ddt + E[..., -1, :] * dw
        dseg[..., -1, :] += w * dw

        # the log decays a = dt A, through the segment sums and the running sums exp(G_l)
        da = _segment_grad(dseg) + torch.flip(torch.cumsum(torch.flip(de, [-1]), -1), [-1])
        ddt = ddt + A[..., None] * da
        dA = (dt * da).sum((0, 1, 4)).reshape(G * R)

        def tokens(t, *tail):                                                             # back to [B, T, ...]
            return t.reshape(b, n * L, *tail)[:, :T]
        dx = tokens(dx, G * R, P)
        ddt = tokens(ddt.permute(0, 1, 4, 2, 3), G * R)
        return dx, ddt, dA, tokens(dB, G, N), tokens(dC, G, N), dS.reshape(b, G * R, P, N), None


def ssd(x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, *, D: Tensor | None = None,
        initial_state: Tensor | None = None, output_final_state: bool = False, chunk_size: int = 64,
        mode: str = "chunk") -> tuple[Tensor, Tensor | None]:
    """Mamba-2's SSD recurrence over x [B, T, H, P]; see the module docstring for the arguments."""
    _check(x, dt, A, B, C, D, initial_state)
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    if chunk_size <= 0:
        raise ValueError(f"chunk_size: must be > 0, got {chunk_size}")
    cdt = compute_dtype(x.dtype)
    b, T, H, P = x.shape
    x, dt, A, B, C = (t.to(cdt) for t in (x, dt, A, B, C))
    S = (x.new_zeros(b, H, P, B.shape[3]) if initial_state is None else initial_state.to(cdt))
    if T == 0:
        y = x
    elif mode == "recurrent" or T == 1:  # one token: the step is the whole algorithm
        y, S = _recurrent(x, dt, A, B, C, S)
    else:
        y, S = _ChunkedSSD.apply(x, dt, A, B, C, S, min(chunk_size, T))
    if D is not None:
        y = y + D.to(cdt)[:, None] * x
    return y, (S if output_final_state else None)
