"""The delta rules' chunked form for training: a forward that keeps what backward needs, and a backward
written by hand, chunk by chunk in matrix products (no per-token loop, no autograd graph of the chunks).

The forward is the WY/UT form of ``storelab.ops.delta_reference`` (Yang et al., arXiv 2406.06484; with
decay arXiv 2412.06464). Per chunk of C tokens, G the cumulative log decay from the chunk's start, one
per head (D = 1) or per key channel (D = K, KDA):

    Qg = Q * exp(G),  Kd = K * exp(G_C - G),  M = tril(Q K^T * Gamma)       (Gamma_ij = exp(G_i - G_j))
    A = strict_tril(diag(beta) K K^T * Gamma),  T = (I + A)^-1
    U = T diag(beta) V,  W = T diag(beta) K * exp(G)
    V_new = U - W S,   O = Qg S + M V_new,   S <- exp(G_C) S + Kd^T V_new

For per-channel decays ``(X Y^T * Gamma)`` means sum_d X_id Y_jd exp(G_id - G_jd), computed as the plain
product (X exp(G - r)) (Y exp(r - G))^T with r the chunk's mid decay G_C / 2 (GLA, arXiv 2312.06635);
that needs the chunk's decay span within twice exp's range, which the caller checks. Per head Gamma is
formed pairwise (C x C), exact at any decay.

Backward, with dS the gradient on the state leaving chunk n (the final state's gradient to start):
    dV_new = M^T dO + Kd dS                      dS <- Qg^T dO + exp(G_C) dS - W^T dV_new
the one sequential recursion (two products per chunk; M^T dO and Qg^T dO are made for all chunks at
once). Everything else is batched over chunks: dQg = dO S^T, dM = dO V_new^T, dKd = V_new dS^T,
dW = -dV_new S^T, dU = dV_new; through U, W: dT = dU (beta V)^T + dW (beta K exp(G))^T; through the
inverse dA = -T^T dT T^T (strictly lower); through the scores and the decays: for X = dGamma * Gamma,
dG_i += sum_j X_ij - sum_j X_ji, and each row factor exp(+-G) gives dG += dX * X (summed over the
channels of a head's one decay). Last dg = reverse cumulative sum of dG within the chunk.

Kept between forward and backward, all linear in T: the chunk inputs, the cumulative decays, the states
entering each chunk ([N, B*H, K, V]), M, A, T, W and V_new; the decay factors, Gamma and the decayed
copies are made again in backward. Both passes go group by group of chunks (``GROUP_FLOATS``), each
group's whole work done while its tensors are in cache; backward carries the state's gradient from
group to group. fp32 (or float64) throughout.

Shape legend: N chunks, BH batch x (value) heads, C chunk size, K key width, V value width, D 1 | K.
"""

from __future__ import annotations

import torch
from torch import Tensor

from storelab.ops.delta_reference import _chunk_view, _from_chunks, chunk_reference
from storelab.ops.delta_step import step_train, step_train_fits

__all__ = ["chunk_train", "fits_factored", "neumann_doubling", "train", "training_chunk"]

# The chunks are processed in groups whose chunk-sized tensors hold about this many numbers (256 KiB in
# fp32): all of a group's work is done together, while its tensors are in cache (see docs/bench.md)
GROUP_FLOATS = 1 << 16


def _chunks(x: Tensor, C: int, scale: float | None = None, out: Tensor | None = None) -> Tensor:
    """[B, T, H, *D] -> [N, B*H, C, D] (times ``scale``), contiguous, in one pass over x, zero padded to
    whole chunks (``_chunk_view`` is a strided view; products on those copy matrix by matrix)."""
    src = _chunk_view(x, C)                                                           # N B H C D (strided)
    N, B, H, C, D = src.shape
    out = x.new_empty(N, B * H, C, D) if out is None else out
    if scale is None:
        out.view(N, B, H, C, D).copy_(src)
    else:
        torch.mul(src, scale, out=out.view(N, B, H, C, D))
    return out


def fits_factored(g: Tensor, C: int) -> bool:
    """Whether per-channel decays g [B, T, H, K] stay within the factored form's range: every chunk's
    decay span (start to end) at most twice exp's safe exponent, so exp(G - G_C / 2) and its inverse
    are normal numbers."""
    limit = 500.0 if g.dtype == torch.float64 else 40.0
    G = _chunk_view(g, C).sum(3)                                                      # N B H K (no copy of g)
    return bool(G.numel() == 0 or -G.min().item() <= 2 * limit)


def training_chunk(g: Tensor | None, chunk_size: int, key_dim: int) -> int:
    """The chunk size training takes. First by the key width: min(chunk_size, max(16, K / 2)) with K rounded
    down to a power of two. Per chunk and head the products are C x C x K and C x K x V, small enough that
    on a CPU their cost is mostly per call and per element of the C x C work, so narrow keys want short
    chunks: measured (fp32, forward + backward) K = 16 runs 1.4x faster at C = 16 than at 32, K = 64 is
    fastest at 32, K = 128 equal at 32 and 64. Then, for per-channel decays g [B, T, H, K], halved until
    every chunk's span fits the factored form (``fits_factored``); 0 when even single tokens do not (a
    decay below exp(-80) in fp32: the caller then runs the plain chunked form)."""
    C = min(chunk_size, max(16, (1 << max(key_dim, 1).bit_length() - 1) // 2))
    if g is None or g.dim() < 4:
        return C
    while C >= 1 and not fits_factored(g, C):
        C //= 2
    return C


def _mm(a: Tensor, b: Tensor, out: Tensor | None = None) -> Tensor:
    """a @ b for [N, BH, m, n] x [N, BH, n, p] as one bmm over N * BH (operands may be transposed views:
    bmm reads them in place, where ``@`` on 4-d operands would copy them), into ``out`` if given."""
    N, BH, m, p = *a.shape[:3], b.shape[3]
    if out is None:
        return torch.bmm(a.flatten(0, 1), b.flatten(0, 1)).view(N, BH, m, p)
    torch.bmm(a.flatten(0, 1), b.flatten(0, 1), out=out.view(N * BH, m, p))
    return out


def neumann_doubling(X: Tensor, inv: Tensor) -> Tensor:
    """(I + X)^-1 for nilpotent (strictly lower) X [M, b, b], given inv = I - X: the Neumann series summed by
    doubling, (I - X)(I + X^2)(I + X^4)... up to X^(b-1). ``inv`` may be a buffer (the tuned forward's)."""
    b, p = X.shape[-1], 2
    while p < b:
        X = torch.bmm(X, X)
        inv = torch.baddbmm(inv, inv, X)
        p *= 2
    return inv


def _unit_lower_inverse(A: Tensor, out: Tensor, block: int = 16) -> Tensor:
    """(I + A)^-1 for strictly lower A [..., C, C], into ``out``, by products (batched LAPACK solves of many
    small systems are slow, and under a loaded machine's threads much slower). Diagonal blocks of size b:
    the Neumann series of the nilpotent block, (I + X)^-1 = (I - X)(I + X^2)(I + X^4)...; then block
    substitution, T[r, :r] = -T[r, r] A[r, :r] T[:r, :r]."""
    C = A.shape[-1]
    b = block if C % block == 0 else C
    n = C // b
    A = A.reshape(-1, C, C)
    M = A.shape[0]
    X = torch.diagonal(A.view(M, n, b, n, b), dim1=1, dim2=3).permute(0, 3, 1, 2).tril(-1).reshape(M * n, b, b)
    inv = neumann_doubling(X, torch.eye(b, dtype=A.dtype, device=A.device) - X).view(M, n, b, b)
    T = out.view(M, C, C)
    for r in range(n):  # every entry written once: the diagonal block, the row left of it, zeros right of it
        rows = slice(r * b, (r + 1) * b)
        T[:, rows, rows] = inv[:, r]
        T[:, rows, (r + 1) * b:] = 0.0
        if r:
            T[:, rows, : r * b] = torch.bmm(inv[:, r], torch.bmm(A[:, rows, : r * b], T[:, : r * b, : r * b])).neg_()
    return out


def _add_product(dG: Tensor, a: Tensor, b: Tensor, D: int) -> None:
    """dG += a * b, a row factor's gradient onto its decay: per channel as it is, per head summed over the row."""
    if D > 1:
        dG.addcmul_(a, b)
    else:
        dG.add_((a * b).sum(-1, keepdim=True))


def _reduce(x: Tensor, D: int) -> Tensor:
    """A row factor's gradient onto its decay: per channel as it is, per head summed over the row."""
    return x if D > 1 else x.sum(-1, keepdim=True)


def _groups(N: int, BH: int, C: int, K: int, V: int) -> list[slice]:
    """The chunks in groups whose chunk-sized tensors hold about ``GROUP_FLOATS`` numbers each, times 64 / K for
    narrow keys: their products do less work per number, so each call's fixed cost wants more of them
    (measured, one GDN layer's forward + backward: K = 64 fastest at 2^16 numbers, K = 16 at 2^18)."""
    floats = GROUP_FLOATS * max(1, 64 // max(K, 1))
    n = max(1, floats // (BH * C * max(K, V, C)))
    return [slice(i, min(N, i + n)) for i in range(0, N, n)]


class _Group:
    """One group of chunks: its decay factors from the cumulative log decays G [n, BH, C, D], and its scores
    (X K^T * Gamma) against its keys K [n, BH, C, K] with their gradient, per head with Gamma formed pairwise
    (C x C, exact at any decay), per channel factored through the chunk's mid decay (module docstring).
    Made afresh in forward and backward. Per channel one exponential serves every factor: with
    f = exp(G - G_C / 2) and h = exp(G_C / 2), exp(G) = f h, exp(G_C - G) = h / f and exp(G_C) = h^2."""

    def __init__(self, G: Tensor, keys: Tensor, per_channel: bool):
        C = G.shape[2]
        self.per_channel, self.keys = per_channel, keys
        causal = torch.ones(C, C, dtype=torch.bool, device=G.device).tril()
        self.above, self.on_above = ~causal, ~causal.tril(-1)                        # what the masks clear
        GC = G[:, :, -1:]
        if per_channel:
            h = (0.5 * GC).exp()                                                      # n BH 1 K
            self.fx = (G - 0.5 * GC).exp_()                                           # n BH C K
            self.fy = torch.reciprocal(self.fx)
            self.eG, self.eK = self.fx * h, self.fy * h
            self.eGC = (h * h).transpose(-1, -2)                                      # n BH K 1
            self.kf = keys * self.fy                                                  # both scores' key factor
        else:
            self.eG, self.eK = G.exp(), (GC - G).exp_()
            self.eGC = GC.exp().transpose(-1, -2)                                     # n BH 1 1
            self.gamma = torch.where(causal, G - G.transpose(-1, -2), float("-inf")).exp_()  # exp(G_i - G_j)

    def scores(self, X: Tensor, strict: bool, out: Tensor | None = None) -> Tensor:
        """(X K^T * Gamma), lower triangular (strictly, if ``strict``)."""
        if self.per_channel:
            P = _mm(X * self.fx, self.kf.transpose(-1, -2), out)
            return P.masked_fill_(self.on_above if strict else self.above, 0.0)
        P = _mm(X, self.keys.transpose(-1, -2), out).mul_(self.gamma)
        return P.tril_(-1) if strict else P

    def scores_backward(self, dP: Tensor, P: Tensor, X: Tensor, dG: Tensor) -> tuple[Tensor, Tensor]:
        """dX, dK of P = ``scores(X)`` (dP already masked like P; overwritten); adds the decays' part to dG."""
        if self.per_channel:
            Xf = X * self.fx
            dXf, dKf = _mm(dP, self.kf), _mm(dP.transpose(-1, -2), Xf)                # n BH C K
            dG.addcmul_(dXf, Xf).addcmul_(dKf, self.kf, value=-1.0)
            return dXf.mul_(self.fx), dKf.mul_(self.fy)
        dPg = dP * self.gamma
        Xs = dP.mul_(P)                                                               # dGamma * Gamma (dP reused)
        dG.add_(Xs.sum(-1, keepdim=True)).sub_(Xs.sum(-2)[..., None])
        return _mm(dPg, self.keys), _mm(dPg.transpose(-1, -2), X)


class _DeltaChunks(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, S0, scale: float, C: int, per_channel: bool):
        B, T, H, K = q.shape
        V = v.shape[-1]
        Q, Kc, Vc = _chunks(q, C, scale), _chunks(k, C), _chunks(v, C)                # N BH C K|V
        N, BH = Q.shape[:2]
        D = K if per_channel else 1
        G = Q.new_zeros(N, BH, C, D) if g is None else _chunks(g, C).cumsum_(2)       # N BH C D
        M = Q.new_empty(N, BH, C, C)
        S_all = Q.new_empty(N + 1, BH, K, V)                                          # the state entering chunk n
        S_all[0] = 0.0 if S0 is None else S0.reshape(BH, K, V)
        o = Q.new_empty(B, T, H, V)
        if beta is not None:
            b = _chunks(beta, C)                                                      # N BH C 1
            A, Tm, W, Vn = (Q.new_empty(N, BH, C, d) for d in (C, C, K, V))
        else:
            b = A = Tm = W = None
            Vn = Vc
        for sl in _groups(N, BH, C, K, V):
            Qs, Ks = Q[sl], Kc[sl]
            dec = _Group(G[sl], Ks, per_channel)
            dec.scores(Qs, strict=False, out=M[sl])
            if b is not None:
                Kb = Ks * b[sl]
                dec.scores(Kb, strict=True, out=A[sl])
                _unit_lower_inverse(A[sl], out=Tm[sl])
                _mm(Tm[sl], Vc[sl] * b[sl], out=Vn[sl])                               # U, made V_new in place
                _mm(Tm[sl], Kb.mul_(dec.eG), out=W[sl])
            KdT = (Ks * dec.eK).transpose(-1, -2)                                     # keys decayed to the chunk end
            for i, n in enumerate(range(sl.start, sl.stop)):  # in place: an out= product copies its addend first
                S = S_all[n]
                if b is not None:
                    Vn[n].baddbmm_(W[n], S, alpha=-1)                                 # V_new = U - W S
                torch.mul(S, dec.eGC[i], out=S_all[n + 1]).baddbmm_(KdT[i], Vn[n])
            Os = _mm(M[sl], Vn[sl]).flatten(0, 1).baddbmm_((Qs * dec.eG).flatten(0, 1), S_all[sl].flatten(0, 1))
            t0, t1 = sl.start * C, min(T, sl.stop * C)
            o[:, t0:t1] = _from_chunks(Os.view(-1, BH, C, V), B, t1 - t0)
        ctx.save_for_backward(Q, Kc, Vc, G, S_all, M, Vn, b, A, Tm, W)
        ctx.shape, ctx.scale, ctx.per_channel = (B, T, H, K, V, C, D), scale, per_channel
        ctx.has = (g is not None, beta is not None, S0 is not None)
        return o, S_all[-1].view(B, H, K, V).clone()

    @staticmethod
    def backward(ctx, do, dS_final):
        B, T, H, K, V, C, D = ctx.shape
        has_g, has_beta, has_S0 = ctx.has
        Q = ctx.saved_tensors[0]
        N, BH = Q.shape[:2]
        do = do.to(Q.dtype)
        dq, dk = Q.new_empty(B, T, H, K), Q.new_empty(B, T, H, K)
        dv = Q.new_empty(B, T, H, V)
        dg = Q.new_empty(B, T, H, D) if has_g else None
        db = Q.new_empty(B, T, H, 1) if has_beta else None
        carry = Q.new_zeros(BH, K, V) if dS_final is None else dS_final.reshape(BH, K, V).to(Q.dtype)
        for sl in reversed(_groups(N, BH, C, K, V)):  # the state's gradient flows back, group to group
            carry = _backward_group(ctx, sl, do, carry, (dq, dk, dv, dg, db))
        dS0 = carry.view(B, H, K, V) if has_S0 else None
        return (dq, dk, dv, None if dg is None else (dg if D > 1 else dg[..., 0]),
                None if db is None else db[..., 0], dS0, None, None, None)


def _backward_group(ctx, sl: slice, do: Tensor, dS_out: Tensor, grads: tuple) -> Tensor:
    """The backward of the chunks ``sl``, given dS_out, the gradient on the state leaving the group: writes
    this group's rows of dq, dk, dv, dg, dbeta (``grads``, [B, T, H, *]); returns the gradient on the state
    entering the group. All of a group's work is done together, while its tensors are in cache."""
    Q, Kc, Vc, G, S_all, M, Vn, b, A, Tm, W = ctx.saved_tensors
    B, T, H, K, V, C, D = ctx.shape
    per_channel = ctx.per_channel
    dq, dk, dv, dg, dbeta = grads
    BH, n = Q.shape[1], sl.stop - sl.start
    t0, t1 = sl.start * C, min(T, sl.stop * C)
    # dO and dV_new each contiguous: a product into (or an in-place update of) a strided batch runs matrix
    # by matrix, several times slower for these small matrices
    dO = _chunks(do[:, t0:t1], C)                                                     # n BH C V (do may be expanded)
    dVn = Q.new_empty(n, BH, C, V)
    Qs, Ks, Vs, Ms, Vns, S_in = Q[sl], Kc[sl], Vc[sl], M[sl], Vn[sl], S_all[sl]
    dec = _Group(G[sl], Ks, per_channel)
    Qg, Kd = Qs * dec.eG, Ks * dec.eK
    _mm(Ms.transpose(-1, -2), dO, out=dVn)                                            # M^T dO, then dV_new
    # dS_loc[i]: the gradient on the state entering the group's chunk i (Qg^T dO, then the recursion in
    # place); dS_loc[n] the one leaving the group
    dS_loc = Q.new_empty(n + 1, BH, K, V)
    torch.bmm(Qg.transpose(-1, -2).flatten(0, 1), dO.flatten(0, 1), out=dS_loc[:n].flatten(0, 1))
    dS_loc[n] = dS_out
    WT = None if W is None else W[sl].transpose(-1, -2)
    for i in range(n - 1, -1, -1):  # the one sequential recursion
        dS = dS_loc[i + 1]
        dVn[i].baddbmm_(Kd[i], dS)                                                    # dV_new
        nxt = dS_loc[i].addcmul_(dec.eGC[i], dS)
        if WT is not None:
            nxt.baddbmm_(WT[i], dVn[i], alpha=-1)
    dS_after = dS_loc[1:]
    dG = torch.zeros_like(G[sl])
    S_inT = S_in.transpose(-1, -2)
    dQg = _mm(dO, S_inT)                                                              # n BH C K
    dW = _mm(dVn, S_inT).neg_() if b is not None else None
    _add_product(dG, dQg, Qg, D)
    dM = _mm(dO, Vns.transpose(-1, -2))                                               # n BH C C
    if per_channel:
        dM.masked_fill_(dec.above, 0.0)
    dQ, dK = dec.scores_backward(dM, Ms, Qs, dG)
    dQ.addcmul_(dQg, dec.eG)
    dKd = _mm(Vns, dS_after.transpose(-1, -2))                                        # n BH C K
    y = dKd * Kd
    dK.addcmul_(dKd, dec.eK)
    dG.sub_(_reduce(y, D))
    dGC = y.sum(2, keepdim=True) + (dS_after * S_in).sum(-1)[:, :, None] * dec.eGC.transpose(-1, -2)  # n BH 1 D
    if not per_channel:
        dGC = dGC.sum(-1, keepdim=True)
    if b is not None:
        bs = b[sl]
        Kb = Ks * bs
        bV, bKe = Vs * bs, Kb * dec.eG
        TT = Tm[sl].transpose(-1, -2)
        dT = _mm(dVn, bV.transpose(-1, -2))                                            # n BH C C
        dT.flatten(0, 1).baddbmm_(dW.flatten(0, 1), bKe.transpose(-1, -2).flatten(0, 1))
        dbV, dbKe = _mm(TT, dVn), _mm(TT, dW)
        dA = _mm(_mm(TT, dT), TT).neg_().tril_(-1)
        if per_channel:
            dA.masked_fill_(dec.on_above, 0.0)
        dKb, dK2 = dec.scores_backward(dA, A[sl], Kb, dG)
        dK.add_(dK2)
        _add_product(dG, dbKe, bKe, D)
        dKb.addcmul_(dbKe, dec.eG)
        dK.addcmul_(dKb, bs)
        dbeta[:, t0:t1] = _from_chunks((dKb * Ks).sum(-1, keepdim=True).add_((dbV * Vs).sum(-1, keepdim=True)),
                                       B, t1 - t0)
        dV = dbV.mul_(bs)
    else:
        dV = dVn
    torch.mul(_from_chunks(dQ, B, t1 - t0), ctx.scale, out=dq[:, t0:t1])
    dk[:, t0:t1] = _from_chunks(dK, B, t1 - t0)
    dv[:, t0:t1] = _from_chunks(dV, B, t1 - t0)
    if dg is not None:
        dG[:, :, -1:] += dGC
        dg[:, t0:t1] = _from_chunks(dG.flip(2).cumsum(2).flip(2), B, t1 - t0)     # dg: reverse cumsum in the chunk
    return dS_loc[0]


def chunk_train(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor | None, S0: Tensor | None, *,
                scale: float, chunk_size: int) -> tuple[Tensor, Tensor]:
    """(o [B,T,H,V], final state [B,H,K,V]) with the hand-written backward; inputs as
    ``delta_reference.prepare_delta_inputs`` returns them (heads matched, compute dtype, scale given).
    ``g`` None, [B,T,H] or [B,T,H,K]; per-channel decays must pass ``fits_factored``."""
    per_channel = g is not None and g.dim() == 4
    return _DeltaChunks.apply(q, k, v, g, beta, S0, float(scale), int(chunk_size), per_channel)


def train(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor | None, S0: Tensor | None, *,
          scale: float, chunk_size: int) -> tuple[Tensor, Tensor]:
    """The training form of the delta rules (inputs as ``chunk_train`` takes them): small states token by
    token in C (``delta_step.step_train_fits``), else ``chunk_train`` at ``training_chunk``'s size, else
    (per-channel decays beyond the factored form's range even per token) the reference chunked form."""
    if step_train_fits(q, v):
        return step_train(q, k, v, g, beta, S0, scale=scale)
    C = training_chunk(g, chunk_size, q.shape[-1])
    if C:
        return chunk_train(q, k, v, g, beta, S0, scale=scale, chunk_size=C)
    return chunk_reference(q, k, v, g=g, beta=beta, scale=scale, initial_state=S0, chunk_size=chunk_size,
                           recompute=True)
