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
  summed on its own (``_segment_decays``), not as a difference of running sums. The chunks pass their
  states in a loop over T / L chunks (linear in T); within a chunk everything is a batched matrix product
  on contiguous blocks: x per head [B, G, n, R, L, P] for the L x L products, dt folded into x (the
  scores are not scaled), and the products with the state per group of heads, all R heads' S^T side by
  side as one [N, R P] matrix (no copy of B and C per head). The chunks go in groups whose L x L tensors
  hold ``GROUP_FLOATS`` numbers, each group's work done while its tensors are in cache. The skip D x is
  summed inside. Its backward is written by hand (``_ChunkedSSD``): it keeps the inputs in chunk layout,
  each chunk's starting state and the decays exp(segment sums), recomputes the scores C . B, and passes
  the state's gradient back along the chunks; no per-token loop either way. The same sums, tested
  against autograd through the per-token loop.

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

# The backward goes through the chunks in groups whose L x L tensors hold about this many numbers (1 MiB in
# fp32): a group's work is done while its tensors are in cache (docs/bench.md)
GROUP_FLOATS = 1 << 18


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


def _segment_decays(a_XL: Tensor, out: Tensor | None = None) -> Tensor:
    """exp(seg[..., l, s]) with seg[l, s] = a_{s+1} + ... + a_l for s <= l (1 on the diagonal), 0 for s > l.

    Each segment is summed on its own (a cumulative sum down the masked columns), not as the difference
    G_l - G_s of two running sums: with strong decays those run to thousands, and their difference would
    lose the few units that matter (fp32 keeps about 7 digits). Three passes over the L x L blocks, the last
    two in place."""
    L = a_XL.shape[-1]
    below = torch.ones(L, L, dtype=torch.bool, device=a_XL.device).tril(-1)        # [i, s]: i > s
    seg_XLL = torch.where(below, a_XL[..., :, None], 0.0)
    seg_XLL = torch.cumsum(seg_XLL, -2, out=seg_XLL if out is None else out)
    return seg_XLL.exp_().masked_fill_(~below.logical_or_(torch.eye(L, dtype=torch.bool, device=a_XL.device)), 0.0)


def _segment_grad(dseg_XLL: Tensor) -> Tensor:
    """The gradient of the log decays a_i from that of their segment sums seg[l, s] = a_{s+1} + ... + a_l:
    da_i = sum over l >= i and s < i of dseg[l, s] (dseg zero above the diagonal). dseg is overwritten."""
    L = dseg_XLL.shape[-1]
    before_XLL = dseg_XLL.cumsum_(-1)                                                 # [l, j]: sum_{s <= j} dseg[l, s]
    after_LL = torch.ones(L, L - 1, dtype=torch.bool, device=dseg_XLL.device).tril(-1)  # [l, j]: l > j (l >= i = j + 1)
    return F.pad(before_XLL[..., :-1].mul_(after_LL).sum(-2), (1, 0))


def _chunk_layout(x, dt, B, C, L: int):
    """x, dt, B, C padded to whole chunks, in the layouts the products run in: x per head [B, G, n, R, L, P]
    (a copy: each head's chunk a contiguous L x P block, for the L x L products) and per group
    [B, G, n, L, R P] (a view of the input when G = 1: the products with the state, shared B and C, take
    all R heads of a group as one matrix), dt [B, G, n, R, L], B and C [B, G, n, L, N].
    Past the end dt = 0: a = 1 and nothing written, so the final state is the last token's."""
    b, T, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    R, pad = H // G, -T % L
    if pad:
        x, dt, B, C = (F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad)) for t in (x, dt, B, C))
    n = (T + pad) // L
    x_BnLGRP = x.reshape(b, n, L, G, R, P)
    return (x_BnLGRP.permute(0, 3, 1, 4, 2, 5).contiguous(), x_BnLGRP.flatten(-2).permute(0, 3, 1, 2, 4),
            dt.reshape(b, n, L, G, R).permute(0, 3, 1, 4, 2).contiguous(),
            B.reshape(b, n, L, G, N).permute(0, 3, 1, 2, 4).contiguous(),
            C.reshape(b, n, L, G, N).permute(0, 3, 1, 2, 4).contiguous())


def _tokens(t_BGnRL_: Tensor, T: int) -> Tensor:
    """[B, G, n, R, L(, P)] in chunk layout back to [B, T, H(, P)]."""
    b, G, n, R, L = t_BGnRL_.shape[:5]
    order = (0, 2, 4, 1, 3) + tuple(range(5, t_BGnRL_.dim()))
    return t_BGnRL_.permute(order).reshape(b, n * L, G * R, *t_BGnRL_.shape[5:])[:, :T]


def _heads(t_BGnLRP: Tensor, R: int) -> Tensor:
    """A per-group [B, G, n, L, R P] viewed per head, [B, G, n, R, L, P] (no copy)."""
    return t_BGnLRP.unflatten(-1, (R, -1)).transpose(3, 4)


def _per_group(t_BGnRL: Tensor) -> Tensor:
    """[B, G, n, R, L] viewed [B, G, n, L, R, 1], to scale a per-group [B, G, n, L, R, P]."""
    return t_BGnRL.transpose(-1, -2)[..., None]


def _forward_group(xh, xg, dt, B, C, y, E, writes, A_GR, D_GR):
    """The forward of one group of chunks (tensors sliced along n, ``_chunk_forward``'s names) but for the
    state they carry in: writes its slices of y (the intra-chunk sums and the skip), of the decays E and of
    each chunk's own write W^T [N, R P]."""
    R, P = xh.shape[3], xh.shape[5]
    a = dt * A_GR[:, None, :, None]                                                   # log decay of each token
    _segment_decays(a, out=E)                                                         # exp(G_l - G_s), 0 above
    w = E[..., -1, :] * dt                                                            # exp(G_L - G_s) dt_s

    # intra-chunk: y_l = sum_s (C_l . B_s) exp(G_l - G_s) (dt_s x_s); dt scales x, not the L x L scores
    CE = (C @ B.transpose(-1, -2)).unsqueeze(3) * E                                   # [b, G, n, R, L, L]
    torch.matmul(CE, xh * dt[..., None], out=y)
    if D_GR is not None:
        y.add_(xh * D_GR[:, None, :, None, None])

    # each chunk's own write decayed to its end, W^T = B^T (w x) [N, R P] per group
    torch.matmul(B.transpose(-1, -2), (xg.unflatten(-1, (R, P)) * _per_group(w)).flatten(-2), out=writes)


def _chunk_forward(xh, xg, dt, A_GR, B, C, D_GR, ST):
    """The chunked form (module docstring) in chunk layout (``_chunk_layout``); the state transposed per group,
    ST [B, G, N, R P] (S^T of every head of the group side by side). Returns y [B, G, n, R, L, P] (the skip
    D x included), the final ST, the transposed state each chunk starts from [B, G, n, N, R P] and the
    decays E [B, G, n, R, L, L]."""
    b, G, n, R, L, P = xh.shape
    N = B.shape[-1]
    y, E, writes = xh.new_empty(xh.shape), xh.new_empty(b, G, n, R, L, L), xh.new_empty(b, G, n, N, R * P)
    for sl in _groups(n, b * G * R * L * L):                                          # while in cache
        _forward_group(*(t[:, :, sl] for t in (xh, xg, dt, B, C, y, E, writes)), A_GR, D_GR)
    e = torch.cumsum(dt * A_GR[:, None, :, None], dim=-1).exp_()                      # exp(G_l): from the start

    # the states along the chunks: S_{c+1} = exp(G_L) S_c + W_c
    decay_BGn1X = e[..., None, :, -1, None].expand(b, G, n, 1, R, P).flatten(-2)       # [b, G, n, 1, R P]
    S0T = xh.new_empty(b, G, n + 1, N, R * P)                                         # the last: the final state
    S0T[:, :, 0] = ST
    for c in range(n):
        torch.addcmul(writes[:, :, c], decay_BGn1X[:, :, c], S0T[:, :, c], out=S0T[:, :, c + 1])
    S0T, ST = S0T[:, :, :n], S0T[:, :, n]

    # the carried state: y_l += exp(G_l) S_0 C_l, all heads of a group in one product C S_0^T [L, R P]
    y.addcmul_(_heads(C @ S0T, R), e[..., None])
    return y, ST, S0T, E


def _groups(n: int, per_chunk: int) -> list[slice]:
    """The n chunks in groups whose L x L tensors hold about ``GROUP_FLOATS`` numbers each."""
    g = max(1, GROUP_FLOATS // per_chunk)
    return [slice(i, min(n, i + g)) for i in range(0, n, g)]


def _backward_group(x, xg, dt, B, C, S0T, E, dy, dyg, dye, dW, ddecay, e, dx, ddt, dB, dC, A, D, dA, dD):
    """The backward of one group of chunks (tensors sliced along n, ``_ChunkedSSD``'s names), given the
    gradient on each chunk's write dW and on its decay ddecay: writes its slices of dx, ddt, dB, dC, adds to
    dA and dD [G, R]."""
    R, P = x.shape[3], x.shape[5]
    w = E[..., -1, :] * dt
    CE = (C @ B.transpose(-1, -2)).unsqueeze(3) * E
    xd = x * dt[..., None]

    # intra-chunk: y = CE (dt x)
    dCE = dy @ xd.transpose(-1, -2)
    dxd = CE.transpose(-1, -2) @ dy
    torch.mul(dxd, dt[..., None], out=dx)
    torch.sum(dxd * x, -1, out=ddt)
    dCB = (dCE * E).sum(3)
    dseg = dCE.mul_(CE)                                                                   # d(log E) = dCE * CE
    torch.matmul(dCB, B, out=dC)
    torch.matmul(dCB.transpose(-1, -2), C, out=dB)

    # the skip: y += D x
    if D is not None:
        dx.add_(dy * D[:, None, :, None, None])
        dD.add_((dy * x).sum((0, 2, 4, 5)))

    # carried state: y_l += exp(G_l) S0 C_l
    dyg_RP = dyg.unflatten(-1, (R, P))
    de = (dyg_RP * (C @ S0T).unflatten(-1, (R, P))).sum(-1).transpose(-1, -2).mul_(e)
    dC.add_(dye @ S0T.transpose(-1, -2))
    de[..., -1] += ddecay * e[..., -1]

    # each chunk's write W^T = B^T (w x), per group [N, R P]
    xg_RP = xg.unflatten(-1, (R, P))
    dxw = (B @ dW).unflatten(-1, (R, P))                                                  # [b, G, n, L, R, P]
    dx.addcmul_(dxw.transpose(3, 4), w[..., None])
    dw = (dxw * xg_RP).sum(-1).transpose(-1, -2)
    dB.add_((xg_RP * _per_group(w)).flatten(-2) @ dW.transpose(-1, -2))
    ddt.addcmul_(E[..., -1, :], dw)
    dseg[..., -1, :] += w * dw

    # the log decays a = dt A, through the segment sums and the running sums exp(G_l)
    da = _segment_grad(dseg) + torch.flip(torch.cumsum(torch.flip(de, [-1]), -1), [-1])
    ddt.addcmul_(da, A[:, None, :, None])
    dA.add_((dt * da).sum((0, 2, 4)))


class _ChunkedSSD(torch.autograd.Function):
    """The chunked form with its backward by hand: the forward keeps its inputs in chunk layout, each
    chunk's starting state and the decays E; the backward recomputes the scores C . B (one product per
    group) and passes the state's gradient back along the chunks (the forward's loop, reversed). Its
    gradients are autograd's through the per-token reference (tests/test_mamba2.py: float64 to 1e-10, fp32,
    gradcheck).

    The backward's tensors are in chunk layout without suffixes: x, dy, dx per head [B, G, n, R, L, P] and
    xg, dyg per group [B, G, n, L, R P]; dt, a, e (exp of the running sum), w and their gradients
    [B, G, n, R, L]; E, CE, dCE, dseg [B, G, n, R, L, L]; dCB [B, G, n, L, L]; B, C, dB, dC [B, G, n, L, N];
    the transposed states ST, dST [B, G, N, R P], S0T, dW [B, G, n, N, R P]."""

    @staticmethod
    def forward(ctx, x, dt, A, B, C, D, S_BHPN, L: int):
        b, T, H, P = x.shape
        G, N = B.shape[2], B.shape[3]
        R = H // G
        xh, xg, dtc, Bc, Cc = _chunk_layout(x, dt, B, C, L)
        A_GR, D_GR = A.reshape(G, R), None if D is None else D.reshape(G, R)
        ST = S_BHPN.reshape(b, G, R, P, N).permute(0, 1, 4, 2, 3).reshape(b, G, N, R * P)
        y, ST, S0T, E = _chunk_forward(xh, xg, dtc, A_GR, Bc, Cc, D_GR, ST)
        ctx.save_for_backward(xh, xg, dtc, A_GR, Bc, Cc, D_GR, S0T, E)
        ctx.T = T
        return _tokens(y, T), ST.reshape(b, G, N, R, P).permute(0, 1, 3, 4, 2).reshape(b, H, P, N)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy_BTHP, dS_BHPN):
        x, xg, dt, A, B, C, D, S0T, E = ctx.saved_tensors                              # chunk layout (see forward)
        b, G, n, R, L, P = x.shape
        N, T = B.shape[-1], ctx.T
        if dy_BTHP is None:
            dy_BTHP = x.new_zeros(b, T, G * R, P)
        dy_BnLGRP = F.pad(dy_BTHP.to(x.dtype), (0, 0, 0, 0, 0, n * L - T)).reshape(b, n, L, G, R, P)
        dy = dy_BnLGRP.permute(0, 3, 1, 4, 2, 5).contiguous()
        dyg = dy_BnLGRP.flatten(-2).permute(0, 3, 1, 2, 4)
        dST = (x.new_zeros(b, G, N, R * P) if dS_BHPN is None else
               dS_BHPN.to(x.dtype).reshape(b, G, R, P, N).permute(0, 1, 4, 2, 3).reshape(b, G, N, R * P))

        a = dt * A[:, None, :, None]
        e = torch.cumsum(a, dim=-1).exp_()
        decay = e[..., -1]

        # the carried state's part of dS0: y_l += exp(G_l) S0 C_l, per group [L, R P] = C S0^T
        dyg_RP = dyg.unflatten(-1, (R, P))
        dye = (dyg_RP * _per_group(e)).flatten(-2)                                        # [b, G, n, L, R P]
        dS0T_own = C.transpose(-1, -2) @ dye                                              # [b, G, n, N, R P]

        # along the chunks, reversed: S_{c+1} = exp(G_L) S_c + W_c; dW[c] the gradient on S_{c+1} (Q[c + 1])
        decay_BGn1X = decay[..., None, :, None].expand(b, G, n, 1, R, P).flatten(-2)       # [b, G, n, 1, R P]
        Q = x.new_empty(b, G, n + 1, N, R * P)
        Q[:, :, n] = dST
        for c in reversed(range(n)):
            torch.addcmul(dS0T_own[:, :, c], decay_BGn1X[:, :, c], Q[:, :, c + 1], out=Q[:, :, c])
        dW, dST = Q[:, :, 1:], Q[:, :, 0]
        ddecay = (dW * S0T).unflatten(-1, (R, P)).sum((3, 5))                              # [b, G, n, R]

        # the rest chunk by chunk, in groups of chunks whose work is done while their tensors are in cache
        dx, ddt, dB, dC = torch.empty_like(x), torch.empty_like(dt), torch.empty_like(B), torch.empty_like(C)
        dA = A.new_zeros(G, R)
        dD = None if D is None else A.new_zeros(G, R)
        for sl in _groups(n, b * G * R * L * L):
            _backward_group(*(t[:, :, sl] for t in (x, xg, dt, B, C, S0T, E, dy, dyg, dye, dW, ddecay, e,
                                                     dx, ddt, dB, dC)), A, D, dA, dD)
        dA, dD = dA.reshape(G * R), None if D is None else dD.reshape(G * R)

        def groups(t):                                                            # [b, G, n, L, N] -> [b, T, G, N]
            return t.permute(0, 2, 3, 1, 4).reshape(b, n * L, G, N)[:, :T]
        dS = dST.reshape(b, G, N, R, P).permute(0, 1, 3, 4, 2).reshape(b, G * R, P, N)
        return _tokens(dx, T), _tokens(ddt, T), dA, groups(dB), groups(dC), dD, dS, None


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
    elif mode == "chunk" and T > 1:  # the skip D x is summed inside, in chunk layout
        D_H = None if D is None else D.to(cdt)
        y, S = _ChunkedSSD.apply(x, dt, A, B, C, D_H, S, min(chunk_size, T))
        return y, (S if output_final_state else None)
    else:  # the reference, or one token: the step is the whole algorithm
        y, S = _recurrent(x, dt, A, B, C, S)
    if D is not None:
        y = y + D.to(cdt)[:, None] * x
    return y, (S if output_final_state else None)
