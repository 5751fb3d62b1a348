"""The recurrent stores' ops, and their chunked form tuned for a CPU (essay section 3).

The four rules, each a state S_BHKV per head read as o_t = S_t^T (scale * q_t) after the token's write
(their papers, the ops' layout, head grouping and scale convention: ``storelab.ops.delta_reference``):
    linear_attention    S_t = exp(g_t) S_{t-1} + k_t v_t^T                   (g None: no decay)
    delta_rule          S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T
    gated_delta_rule    S' = exp(g_t) S_{t-1} (g [B,T,HV]);   S_t = S' + beta_t k_t (v_t - S'^T k_t)^T
    kda                 S' = diag(exp(g_t)) S_{t-1} (g [B,T,HV,K]), then the same write
Each op takes ``q, k, v`` then keyword-only ``g, beta, scale, initial_state, output_final_state,
chunk_size, mode`` and returns ``(o [B,T,HV,V], final_state or None)``; q, k [B,T,H,K], v [B,T,HV,V].

Three evaluations that agree (tests hold them equal): ``mode="recurrent"``, the per-token loop over
``recurrent_step``; ``mode="scan"``, a parallel affine scan (``storelab.ops.scan``); ``mode="chunk"``
(default), here: within a chunk of C tokens the delta writes form a unit lower-triangular system
(WY/UT, arXiv 2406.06484; read plainly in ``delta_reference.chunk_reference``):
    (I + strict_tril(diag(beta) (K K^T * Gamma))) [U | W] = [diag(beta) V | diag(beta) K * exp(G)]
with Gamma_ij = exp(G_i - G_j) the decay between tokens j <= i and G the within-chunk cumulative log
decay. Then chunk by chunk (the one sequential loop, four products in place)
    V_new = U - W S = T (diag(beta) V - diag(beta) K exp(G) S),   T = (I + strict_tril(...))^-1,
    O = (Q * exp(G)) S + (Q K^T * Gamma)_tril V_new,   S <- exp(G_C) S + (K * exp(G_C - G))^T V_new.
The rest is batched products over a group of chunks: the scores, T (``_unit_lower_inverse``: a Neumann
series on 16 x 16 diagonal blocks, then block substitution), the intra-chunk part of O. T is applied in
the loop: a C x C product per chunk is cheaper than two C x (K + V) ones. Within a cache-sized group the
state is carried as S / P, P the decay since the group's start (``_rescales``). Gamma is never formed
while the chunk's decay is within exp's range (exp(G_i - G_j) = exp(G_i - m) exp(m - G_j)); beyond it
GDN forms Gamma pairwise and KDA factors through sub-chunk reference points as in GLA (arXiv 2312.06635).

Two evaluations of the chunked form (tests run both):
- the C kernel (``kernels/delta_chunk.c``, ``_chunked_compiled``), all four rules on float32 / float64:
  per head, chunk by chunk, the chunk's rows read into buffers in the first-level cache, its scores,
  decays and writes made there, V_new = (I + strict_tril(...))^-1 (...) by forward substitution (no T),
  heads split over torch's OpenMP threads. The decays factor through m = G_C / 2 as above while the
  chunk's decay is within range, else pairwise (per channel too). The products of thousands of small
  tensor calls were mostly cost per call here.
- the tensor form (``_chunked``, this file), batched over groups of chunks as above: where the kernel
  does not build (no C compiler).
The chunk (``chunk_size=None``, the default) and the tensor form's group size are chosen per CPU by a
short calibration at first use (``storelab.ops.tuning``); measurements: docs/bench.md. Training (inputs
needing gradients, ``records_grad``): ``delta_train.train``, the per-token rule in C for small states
(``delta_step``), else this algorithm with a hand-written backward, at chunks of 32 unless told.
B batch, T tokens, H heads, K, V widths, C chunk."""

from __future__ import annotations

import ctypes
import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from storelab.ops.compiled import compiled_library
from storelab.ops.delta_reference import (_from_chunks, _recurrent, _to_chunks, check_delta_shapes,  # noqa: F401
                                         chunk_reference, prepare_delta_inputs, records_grad, recurrent_step)
from storelab.ops.delta_train import neumann_doubling, train
from storelab.ops.tuning import DEFAULT_CHUNK, chunk_plan

__all__ = ["linear_attention", "delta_rule", "gated_delta_rule", "kda", "recurrent_step"]

MODES = ("chunk", "recurrent", "scan")


# ---------------------------------------------------------------------------- chunked
def _exp_limit(dtype: torch.dtype) -> float:
    """Largest |exponent| a decay factor may take: e^-limit times an O(1e-11) entry stays a normal number."""
    return 500.0 if dtype == torch.float64 else 60.0


def _unit_lower_inverse(A_BCC: Tensor, cz: "_Chunked", block: int = 16, tame: bool = False) -> Tensor:
    """(I + strict_tril(A))^-1 by matrix products (batched LAPACK solves of small systems are slow); only
    A's strictly lower part is read. The result lives in the workspace ``cz`` (valid until its next call).

    Diagonal blocks of size b: the Neumann series of a nilpotent matrix, summed by doubling,
    (I + X)^-1 = (I - X)(I + X^2)(I + X^4)...; then block forward substitution,
    T[r, :r] = -T[r, r] A[r, :r] T[:r, :r] for each block row r. ``tame``: the entries on and above
    the diagonal are finite (never read, but cleared by a 0/1 mask rather than ``tril``).
    """
    shape, C = A_BCC.shape, A_BCC.shape[-1]
    A = A_BCC.reshape(-1, C, C)
    M = A.shape[0]
    b = block if C % block == 0 else C
    n = C // b
    blocks = torch.diagonal(A.view(M, n, b, n, b), dim1=1, dim2=3).permute(0, 3, 1, 2)  # M n b b (a view)
    X = cz.buf("inv_X", A, M, n, b, b)
    if tame:
        torch.mul(blocks, cz.mask(b, -1, A), out=X)
    else:
        torch.tril(blocks, -1, out=X)
    X = X.view(M * n, b, b)
    inv = torch.sub(torch.eye(b, dtype=A.dtype, device=A.device), X, out=cz.buf("inv_D", A, M * n, b, b))
    inv = neumann_doubling(X, inv)
    if n == 1:
        return inv.view(shape)
    inv = inv.view(M, n, b, b)
    fresh = "inv_T" not in cz._bufs or cz._bufs["inv_T"].numel() < A.numel()
    T = cz.buf("inv_T", A, M, C, C)
    if fresh:  # the blocks above the diagonal are zeroed once, when the buffer is made, and never written
        T.zero_()
    torch.diagonal(T.view(M, n, b, n, b), dim1=1, dim2=3).copy_(inv.permute(0, 2, 3, 1))
    for r in range(1, n):
        rows = slice(r * b, (r + 1) * b)
        torch.neg(torch.bmm(inv[:, r], torch.bmm(A[:, rows, : r * b], T[:, : r * b, : r * b])), out=T[:, rows, : r * b])
    return T.view(shape)


def _sub_chunk(G_NBCK: Tensor) -> int:
    """Largest power-of-two split of the chunk whose blocks each decay by at most the exp limit.

    Inside a block of size s the factorisation exp(G_i - G_j) = exp(G_i - r) exp(r - G_j), with r
    the cumulative decay just before the block, has factors within exp(+-span); spans above the
    limit would overflow. The caller clamps single-token decays at the limit, so s = 1 always works.
    """
    C = G_NBCK.shape[2]
    limit = _exp_limit(G_NBCK.dtype)
    s = C
    while s > 1 and C % s == 0:
        Gb = G_NBCK.unflatten(2, (C // s, s))
        ref = torch.cat([torch.zeros_like(Gb[:, :, :1, 0]), Gb[:, :, :-1, -1]], dim=2)  # N BH n K
        if (ref - Gb[:, :, :, -1]).max().item() <= limit:
            return s
        s //= 2
    return 1


def _scores_per_channel(rows: list[Tensor], k_NBCK: Tensor, G_NBCK: Tensor) -> Tensor:
    """P[r, ..., i, j] = sum_c rows[r][i,c] k[j,c] exp(G[i,c] - G[j,c]) for j <= i, zeros above.

    The chunk is cut into blocks of size s (``_sub_chunk``). Row block a reads every column
    j < (a+1) s through the reference r_a, the cumulative decay just before block a:
        exp(G_i - G_j) = exp(G_i - r_a) * exp(r_a - G_j),
    the first factor <= 1, the second <= 1 for earlier blocks and <= exp(span) inside block a.
    Every factor stays a normal number, so the product keeps full relative precision.
    """
    N, BH, C, K = k_NBCK.shape
    R = len(rows)
    s = _sub_chunk(G_NBCK)
    n = C // s
    Gb = G_NBCK.unflatten(2, (n, s))                                                     # N BH n s K
    ref = torch.cat([torch.zeros_like(Gb[:, :, :1, 0]), Gb[:, :, :-1, -1]], dim=2)      # N BH n K
    f = (Gb - ref[:, :, :, None]).exp_()                                                # N BH n s K, <= 1
    left = k_NBCK.new_empty(N, BH, n, R, s, K)
    for r, x in enumerate(rows):
        torch.mul(x.unflatten(2, (n, s)), f, out=left[:, :, :, r])
    P = k_NBCK.new_zeros(R, N, BH, C, C)
    for a in range(n):
        w = (a + 1) * s
        right = k_NBCK[:, :, :w] * (ref[:, :, a, None] - G_NBCK[:, :, :w]).exp_()     # N BH w K
        blk = torch.matmul(left[:, :, a].reshape(N, BH, R * s, K), right.transpose(-1, -2))
        P[:, :, :, a * s:w, :w] = blk.view(N, BH, R, s, w).movedim(2, 0)
    return P.tril_()


GROUP_FLOATS = 1 << 17  # chunks are processed in groups whose q-sized tensors hold about this many numbers


class _Decay(NamedTuple):
    """A group's decay factors (see ``_decays``) and beta, in chunk layout [N, B*H, C | 1, 1 | K]."""

    f: Tensor | None            # exp(G - G_C / 2), the fast path's factor
    inv_f: Tensor | None        # 1 / f
    half: Tensor | None         # exp(G_C / 2)
    eG: Tensor | None           # exp(G), the slow path's factor
    k_decay: Tensor | None      # exp(G_C - G), the slow path's factor
    tame: bool                  # the scores above the diagonal are finite (see ``_decays``)
    G: Tensor | None            # cumulative log decay within each chunk
    b: Tensor | None            # beta
    rescale: Tensor | None      # P_i exp(G_C / 2), when the state is carried as S / P_i (see ``_rescales``)
    P_end: Tensor | None        # P at the group's end [B*H, 1|K, 1], to put the state back


def _chunk_span(G: Tensor) -> float:
    """The largest decay (minus the log) any one chunk of G [N, BH, C, 1|K] takes, start to end."""
    return -G[:, :, -1].min().item()


def _decay_of(cz, G: Tensor | None, b: Tensor | None, per_group: int) -> list[_Decay]:
    """The decays of the chunks of G [N, BH, C, 1|K] (cumulative, clamped) and beta b [N, BH, C, 1],
    as one ``_Decay`` per group of ``per_group`` chunks (views)."""
    f, inv_f, half, eG, k_decay, tame = _decays(cz, G)
    N = 1 if G is None else G.shape[0]
    groups = -(-N // per_group)
    rescale, P_end, ok = (None, None, [False] * groups) if half is None else _rescales(G[:, :, -1:], per_group)

    def part(x, c):
        return None if x is None else x[c]

    out = []
    for j in range(groups):
        c = slice(j * per_group, (j + 1) * per_group)
        out.append(_Decay(part(f, c), part(inv_f, c), part(half, c), part(eG, c), part(k_decay, c), tame,
                          part(G, c), part(b, c), part(rescale, c) if ok[j] else None,
                          P_end[j] if ok[j] else None))
    return out


def _per_head_decays(cz, g: Tensor, beta: Tensor | None, per_group: int) -> list[_Decay] | None:
    """Per-head decays are small (one number per token and head): their factors are made once for
    all chunks and handed to each group as views (per-channel ones are as large as k, so each group
    makes its own). None when some chunk is beyond the fast range: each group then takes the path
    its own chunks need."""
    C = cz.C
    G = _to_chunks(g, C).clamp(min=-_exp_limit(g.dtype)).cumsum_(2)                  # N BH C 1
    if _chunk_span(G) > 2 * _exp_limit(G.dtype):
        return None
    return _decay_of(cz, G, None if beta is None else _to_chunks(beta, C), per_group)


def _rescales(G_last: Tensor, per_group: int) -> tuple[Tensor, Tensor, list[bool]]:
    """Within each group of ``per_group`` chunks, the decay P_i from the group's start to chunk i.

    ``G_last`` [N, BH, 1, 1|K] is each chunk's total log decay. Returns P_i exp(G_C / 2) for every
    chunk (the factor that q and beta k take when the state is carried as S / P_i), P at each group's
    end [groups, BH, 1|K, 1], and per group whether its P stays within exp's range (else its
    chunks decay the state one by one).
    """
    N = G_last.shape[0]
    groups = -(-N // per_group)
    padded = G_last if groups * per_group == N else F.pad(G_last, (0, 0, 0, 0, 0, 0, 0, groups * per_group - N))
    L = padded.view(groups, per_group, *G_last.shape[1:]).cumsum(1)                  # log P_{i+1}
    ok = (L[:, -1].flatten(1).amin(1) >= -_exp_limit(L.dtype)).tolist()
    rescale = (L.view(padded.shape)[:N] - 0.5 * G_last).exp_()
    return rescale, L[:, -1].exp().transpose(-1, -2), ok


def _chunked(q, k, v, g, beta, scale, S_BHKV, C, group_floats=None):
    """Chunkwise-parallel form of all four rules (see the module docstring).

    The chunks are processed in groups of about ``group_floats`` (else ``GROUP_FLOATS``) numbers per tensor, carrying
    the state from group to group: the same arithmetic, but the intermediates live in one
    workspace reused by every group and small enough to stay in cache (fresh large buffers
    cost page faults, which on a small machine cost as much as the arithmetic).
    """
    B, T, H, K = q.shape
    V = v.shape[-1]
    per_chunk = B * H * C * max(K, V, C)
    Tg = C * max(1, (group_floats or GROUP_FLOATS) // per_chunk)
    S = q.new_zeros(B * H, K, V) if S_BHKV is None else S_BHKV.reshape(B * H, K, V).clone()
    o = q.new_empty(B, T, H, V)
    ws = _Chunked(B, H, C)
    pre = _per_head_decays(ws, g, beta, Tg // C) if g is not None and g.dim() == 3 and T > 0 else None
    for j, t0 in enumerate(range(0, T, Tg)):
        sl = slice(t0, min(T, t0 + Tg))
        o_NBCV = _chunk_group(ws, q[:, sl], k[:, sl], v[:, sl], None if g is None else g[:, sl],
                              None if beta is None else beta[:, sl], S, None if pre is None else pre[j])
        # o is linear in q: scale it here, not q (twice) in the group, as it moves into [B, T, H, V]
        N, n_tok = o_NBCV.shape[0], sl.stop - sl.start
        if N * C == n_tok:  # whole chunks: straight into the output, no intermediate copy
            torch.mul(o_NBCV.view(N, B, H, C, V).permute(1, 0, 3, 2, 4), scale, out=o[:, sl].view(B, N, C, H, V))
        else:
            torch.mul(_from_chunks(o_NBCV, B, n_tok), scale, out=o[:, sl])
    return o, S.view(B, H, K, V)


class _Chunked:
    """The workspace of ``_chunked``: inputs put into chunk layout, and buffers reused across groups.

    ``put(x, factor, name)`` writes x * factor as [N, B*H, C, D] in a single pass over x (the
    factor is a number or a tensor [N, B*H, C, 1|D]), so no unscaled copy of q or k is made;
    ``buf(name, shape)`` is a named buffer, allocated once per call and reused by every group (its
    views are kept too: a group makes the same views as the one before); ``mask(n, diagonal)`` is a
    0/1 lower-triangular mask, made once.
    """

    def __init__(self, B, H, C):
        self.B, self.H, self.C, self.N = B, H, C, 0
        self._bufs: dict[str, Tensor] = {}
        self._views: dict[tuple, Tensor] = {}

    def start(self, T: int) -> None:
        self.N = -(-T // self.C)

    def buf(self, name: str, like: Tensor, *shape: int) -> Tensor:
        view = self._views.get((name, shape))
        if view is not None:
            return view
        n = math.prod(shape)
        b = self._bufs.get(name)
        if b is None or b.numel() < n:
            b = self._bufs[name] = like.new_empty(n)
            self._views = {key: v for key, v in self._views.items() if key[0] != name}
        view = self._views[(name, shape)] = b[:n].view(shape)
        return view

    def mask(self, n: int, diagonal: int, like: Tensor) -> Tensor:
        """The 0/1 lower-triangular n x n mask (``tril`` with ``diagonal``) in ``like``'s dtype."""
        m = self._views.get(("mask", n, diagonal))
        if m is None:
            m = self._views[("mask", n, diagonal)] = like.new_ones(n, n).tril_(diagonal)
        return m

    def src(self, x: Tensor) -> Tensor:
        B, T, H, D = x.shape
        if self.N * self.C != T:
            x = F.pad(x, (0, 0, 0, 0, 0, self.N * self.C - T))
        return x.view(B, self.N, self.C, H, D).permute(1, 0, 3, 2, 4)                  # N B H C D (strided)

    def put(self, x_src: Tensor, factor, name: str | None = None, out: Tensor | None = None) -> Tensor:
        N, B, H, C, D = x_src.shape
        out = self.buf(name, x_src, N, B * H, C, D) if out is None else out
        if isinstance(factor, Tensor):
            factor = factor.view(N, B, H, C, -1)
        torch.mul(x_src, factor, out=out.view(N, B, H, C, D))
        return out


def _decays(cz, G: Tensor | None):
    """Decay factors of a group of chunks from the cumulative log decay G [N, BH, C, 1|K].

    Returns (f, 1/f, exp(G_C / 2), exp(G), exp(G_C - G), tame). On the fast path only the first three are
    made (None for the others): every decayed copy of q and k is then a product of f or 1/f and
    exp(G_C / 2), so one exponential serves all of them (see ``_chunk_group``). f = exp(G - G_C / 2)
    is None when some chunk decays by more than twice the exp limit: the scores then take their exact
    slow path, which needs exp(G) and exp(G_C - G) (and exp(G_C / 2) is None). ``tame``: every chunk
    decays by at most half the exp limit, so the scores' entries above the diagonal (at most
    exp(span) times q.k there) are finite and a multiplicative mask clears them.
    """
    if G is None:
        return None, None, None, None, None, True
    G_last = G[:, :, -1:]
    span = _chunk_span(G)
    if span > 2 * _exp_limit(G.dtype):
        return None, None, None, G.exp(), (G_last - G).exp_(), True
    half = (0.5 * G_last).exp_()                                                      # N BH 1 1|K
    f = torch.sub(G, 0.5 * G_last, out=cz.buf("f", G, *G.shape)).exp_()               # N BH C 1|K
    inv_f = torch.reciprocal(f, out=cz.buf("inv_f", G, *G.shape))
    return f, inv_f, half, None, None, span <= 0.5 * _exp_limit(G.dtype)


def _intra_scores(cz, q_src, k_src, G, b_N, f=None, inv_f=None, tame=True):
    """A_qk [i, j] = q_i . k_j * decay(j -> i) for j <= i (zeros above), and A_kk = diag(beta) (same with k_i).

    Only A_kk's strictly lower part is meaningful (nothing else is read). The q and k rows go through
    one product against k^T. With decay, the fast path factors it through the chunk's mid-decay
    m = G_C / 2 (per head, or per channel):
        exp(G_i - G_j) = exp(G_i - m) exp(m - G_j),
    both factors within exp(+-span/2), so plain matrix products replace C*C (or C*C*K) exponentials.
    Entries above the diagonal may overflow there; they are cleared, never used. Chunks whose decay spans more
    than twice the exp limit use the exact pairwise form (per head) or sub-chunk references (per channel).
    ``f`` = exp(G - m) and ``inv_f`` = 1 / f select the fast path (the caller decides, see ``_decays``);
    ``tame`` says the entries above the diagonal are finite, so a product with a 0/1 mask clears them.
    Returns (A_qk, A_kk or None, k in chunk layout if it was made along the way, else None).
    """
    N, B, H, C, K = k_src.shape
    delta = b_N is not None
    R = 2 if delta else 1
    fast = f is not None
    if G is not None and not fast and G.shape[-1] > 1:
        k_N = cz.put(k_src, 1.0, "k_raw")
        P = _scores_per_channel([cz.put(q_src, 1.0, "q_raw")] + ([k_N] if delta else []), k_N, G)
        return P[0], (P[1].mul_(b_N) if delta else None), k_N
    rows = cz.buf("rows", q_src, N, B * H, R * C, K)                                  # [q; beta k] rows
    if fast:
        cz.put(q_src, f, out=rows[:, :, :C])
        if delta:  # k is read from the input once; its two scaled copies come from the contiguous one
            k_raw = cz.put(k_src, 1.0, "k_raw")
            torch.mul(k_raw, f * b_N, out=rows[:, :, C:])
            kT = torch.mul(k_raw, inv_f, out=cz.buf("k_over_f", k_raw, *k_raw.shape)).transpose(-1, -2)
        else:
            kT = cz.put(k_src, inv_f, "k_over_f").transpose(-1, -2)
        k_N = None
    else:
        cz.put(q_src, 1.0, out=rows[:, :, :C])
        if delta:
            cz.put(k_src, b_N, out=rows[:, :, C:])
        k_N = cz.put(k_src, 1.0, "k_raw")
        kT = k_N.transpose(-1, -2)
    A = torch.bmm(rows.view(N * B * H, R * C, K), kT.reshape(N * B * H, K, C),
                  out=cz.buf("A", q_src, N * B * H, R * C, C)).view(N, B * H, R, C, C)
    if G is not None and not fast:  # per head, beyond the fast range: the pairwise decays directly
        Gs = G[..., 0]
        tril = torch.ones(C, C, dtype=torch.bool, device=G.device).tril_()
        A.mul_(torch.where(tril, Gs[..., :, None] - Gs[..., None, :], float("-inf")).exp_()[:, :, None])
    A_qk = cz.buf("A_qk", q_src, N, B * H, C, C)
    if tame:
        torch.mul(A[:, :, 0], cz.mask(C, 0, A), out=A_qk)
    else:
        torch.tril(A[:, :, 0], out=A_qk)
    return A_qk, (A[:, :, 1] if delta else None), k_N


def _chunk_group(cz, q, k, v, g, beta, S_BKV, dec=None):
    """Unscaled outputs [N, B*H, C, V] of one group of chunks (padded rows last); advances S_BKV in place.

    ``dec``: the group's decays and beta (a ``_Decay``) made beforehand; None to make them here.
    """
    B, T, H, K = q.shape
    V, C = v.shape[-1], cz.C
    cz.start(T)
    q_src, k_src, v_src = cz.src(q), cz.src(k), cz.src(v)                           # N B H C K|V
    N, BH = cz.N, B * H
    delta = beta is not None
    if dec is None:
        G = None
        if g is not None:  # a step keeping less than e^-limit is already zero in this dtype; keeps factors finite
            G = cz.put(cz.src(g if g.dim() == 4 else g[..., None]), 1.0, "G").clamp_(min=-_exp_limit(g.dtype))
            G = G.cumsum_(2)                                                          # N BH C 1|K
        dec = _decay_of(cz, G, _to_chunks(beta, C) if delta else None, N)[0]
    f, inv_f, half, eG, k_decay, tame, G, b_N, rescale, P_end = dec
    A_qk, A_kk, k_N = _intra_scores(cz, q_src, k_src, G, b_N, f, inv_f, tame)         # N BH C C (q unscaled)
    if half is not None:  # the buffers _intra_scores filled (scaled again below, not made from q and k again)
        rows = cz.buf("rows", q, N, BH, (2 if delta else 1) * C, K)
        k_over_f = cz.buf("k_over_f", q, N, BH, C, K)

    # Within the group the state is carried as S_i / P_i, P_i the decay from the group's start to
    # chunk i (per head, or per key channel): the loop then needs no decay product, and P_i rides on
    # the factors of q, k and beta k made anyway. Only while P stays within exp's range (else the state
    # decays chunk by chunk, S_decay). On the fast path the score rows hold q f, beta k f and k / f
    # (f = exp(G - G_C / 2)); times r = exp(G_C / 2) [P_i] they are q exp(G) and beta k exp(G) [P_i].
    r = rescale if rescale is not None else half                                      # P_i exp(G_C / 2), exp(G_C / 2)
    S_decay = G[:, :, -1:].exp().transpose(-1, -2) if G is not None and rescale is None else None  # N BH 1|K 1
    if half is not None:  # (A_qk and A_kk are already made from these rows: scaling k_over_f in place is safe)
        k_N = k_over_f.div_(rescale) if rescale is not None else k_over_f.mul_(half)  # k exp(G_C - G) [/ P_{i+1}]
    elif G is not None:
        k_N = cz.put(k_src, k_decay, "k")                                             # keys decay to the chunk end
    else:
        k_N = k_N if k_N is not None else cz.put(k_src, 1.0, "k")
    kT_i = k_N.transpose(-1, -2).unbind(0)                                            # N x [BH K C]
    dec_i = S_decay.unbind(0) if S_decay is not None else [None] * N
    if half is not None:
        q_N = rows[:, :, :C].mul_(r)                                                  # q exp(G) [P_i]
    else:
        q_N = cz.put(q_src, 1.0 if G is None else eG, "q")
    S = S_BKV
    o = cz.buf("o", q, N, BH, C, V)
    if delta:
        # UT transform, T = (I + strict_tril(A_kk))^-1 kept whole and applied in the loop:
        #     V_new = T (beta V - beta K exp(G) S)  [= U - W S with U = T beta V, W = T beta K exp(G)]
        T_i = _unit_lower_inverse(A_kk, cz, tame=tame).view(N, BH, C, C).unbind(0)
        bV = cz.put(v_src, b_N, "bV")
        if half is not None:
            bK = rows[:, :, C:].mul_(r)                                               # beta k exp(G) [P_i]
        else:
            bK = cz.put(k_src, b_N if G is None else b_N * eG, "bK")
        V_new = cz.buf("V_new", q, N, BH, C, V)
        writes = zip(T_i, bV.unbind(0), bK.unbind(0))
    else:  # linear attention: V_new = V
        V_new = cz.put(v_src, 1.0, "V_new")
        writes = [None] * N
    for w, q_i, o_i, kT, Vn, d in zip(writes, q_N.unbind(0), o.unbind(0), kT_i, V_new.unbind(0), dec_i):
        if w is not None:
            T, bV_i, bK_i = w
            bV_i.baddbmm_(bK_i, S, alpha=-1)                                          # beta V - beta K exp(G) S
            torch.bmm(T, bV_i, out=Vn)
        torch.bmm(q_i, S, out=o_i)                                                    # the queries read the state
        if d is not None:
            S.mul_(d)
        S.baddbmm_(kT, Vn)
    if rescale is not None:
        S.mul_(P_end)
    o.view(N * BH, C, V).baddbmm_(A_qk.reshape(N * BH, C, C), V_new.view(N * BH, C, V))
    return o  # the caller applies the query scale as it moves o into place


_KERNEL_SIGNATURE: dict = {}
for _suf, _real in (("f32", ctypes.c_float), ("f64", ctypes.c_double)):
    _KERNEL_SIGNATURE[f"delta_chunked_{_suf}"] = ([ctypes.c_int] * 6 + [ctypes.c_void_p] * 4 + [ctypes.c_int]
                                               + [ctypes.c_void_p] * 2 + [_real, _real]
                                               + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int], ctypes.c_int)


def _kernel_takes(q) -> bool:
    """Whether the whole chunked form runs in C: float32 / float64 on a CPU, the library built."""
    return (q.dtype in (torch.float32, torch.float64) and q.device.type == "cpu"
            and compiled_library("delta_chunk", _KERNEL_SIGNATURE) is not None)


def _chunked_compiled(q, k, v, g, beta, scale, S0, C):
    """The whole chunked form in C (kernels/delta_chunk.c): (o, S), or None where it does not take the inputs
    (``_kernel_takes``)."""
    if not _kernel_takes(q):
        return None
    lib = compiled_library("delta_chunk", _KERNEL_SIGNATURE)
    B, T, H, K = q.shape
    V = v.shape[-1]
    q, k, v = (x if x.stride(-1) == 1 else x.contiguous() for x in (q, k, v))
    per_channel = g is not None and g.dim() == 4
    if per_channel and g.stride(-1) != 1:
        g = g.contiguous()
    S = q.new_zeros(B * H, K, V) if S0 is None else S0.reshape(B * H, K, V).clone()
    o = q.new_empty(B, T, H, V)
    strides = []
    for x in (q, k, v, g, beta, o):
        strides += [0, 0, 0] if x is None else list(x.stride()[:3])
    st = (ctypes.c_long * 18)(*strides)
    fn = getattr(lib, "delta_chunked_" + ("f32" if q.dtype == torch.float32 else "f64"))
    ptr = (lambda x: None if x is None else x.data_ptr())
    if fn(B, T, H, K, V, C, ptr(q), ptr(k), ptr(v), ptr(g), int(per_channel), ptr(beta), st, scale,
          _exp_limit(q.dtype), o.data_ptr(), S.data_ptr(), torch.get_num_threads()) != 0:
        raise MemoryError("delta_chunk: the kernel could not allocate its per-thread buffers")
    return o, S.view(B, H, K, V)


# ---------------------------------------------------------------------------- public ops
def _run(name, q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size, mode, g_per_channel):
    if mode not in MODES:
        raise ValueError(f"mode: must be one of {MODES}, got {mode!r}")
    out_dtype = v.dtype
    q, k, v, g, beta, scale, S0 = prepare_delta_inputs(name, q, k, v, g, beta, scale, initial_state, chunk_size,
                                                       g_per_channel)
    B, T, HV, K = q.shape
    V = v.shape[-1]
    if mode == "recurrent" or (mode == "chunk" and T == 1):  # one token: the step is the whole algorithm
        o, S = _recurrent(q, k, v, g, beta, scale, q.new_zeros(B, HV, K, V) if S0 is None else S0)
    elif mode == "chunk" and records_grad(q, k, v, g, beta, S0):  # training (``delta_train.train``)
        o, S = train(q, k, v, g, beta, S0, scale=scale, chunk_size=chunk_size or DEFAULT_CHUNK)
    elif mode == "chunk":
        kernel = T > 0 and _kernel_takes(q)
        group_floats = None
        if chunk_size is None:  # chosen for this CPU (``storelab.ops.tuning``)
            chunk_size, group_floats = chunk_plan("kernel" if kernel else "tensor", K, V, q.dtype, g_per_channel)
        C = min(chunk_size, max(T, 1))  # no padding below a chunk
        done = _chunked_compiled(q, k, v, g, beta, scale, S0, C) if kernel else None
        o, S = done if done is not None else _chunked(q, k, v, g, beta, scale, S0, C, group_floats)
    else:
        from storelab.ops.scan import delta_states_by_scan

        S_all, _ = delta_states_by_scan(k, v, g=g, beta=beta, initial_state=S0)      # B T H K V
        o = torch.einsum("bthkv,bthk->bthv", S_all, q * scale)
        S = S_all[:, -1] if T else (q.new_zeros(B, HV, K, V) if S0 is None else S0)
    return o.to(out_dtype), (S if output_final_state else None)


def linear_attention(q: Tensor, k: Tensor, v: Tensor, *, g: Tensor | None = None, scale: float | None = None,
                     initial_state: Tensor | None = None, output_final_state: bool = False,
                     chunk_size: int | None = None,
                     mode: str = "chunk") -> tuple[Tensor, Tensor | None]:
    """Additive outer-product writes, S_t = exp(g_t) S_{t-1} + k_t v_t^T; g [B,T,HV] or None.

    A fixed per-head decay (RetNet, Lightning) is ``g = log_gamma_H.expand(B, T, H)``.
    """
    if g is not None and g.dim() == 1:
        g = g.to(q.dtype).expand(q.shape[0], q.shape[1], g.shape[0])
    return _run("linear_attention", q, k, v, g, None, scale, initial_state, output_final_state, chunk_size, mode, False)


def delta_rule(q: Tensor, k: Tensor, v: Tensor, *, beta: Tensor, scale: float | None = None,
               initial_state: Tensor | None = None, output_final_state: bool = False,
               chunk_size: int | None = None,
               mode: str = "chunk") -> tuple[Tensor, Tensor | None]:
    """DeltaNet: S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T; beta [B,T,HV]."""
    return _run("delta_rule", q, k, v, None, beta, scale, initial_state, output_final_state, chunk_size, mode, False)


def gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, *, g: Tensor, beta: Tensor, scale: float | None = None,
                     initial_state: Tensor | None = None, output_final_state: bool = False,
                     chunk_size: int | None = None,
                     mode: str = "chunk") -> tuple[Tensor, Tensor | None]:
    """Gated DeltaNet: decay by exp(g_t) per head (g [B,T,HV], <= 0), then the delta write."""
    return _run("gated_delta_rule", q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size, mode,
                False)


def kda(q: Tensor, k: Tensor, v: Tensor, *, g: Tensor, beta: Tensor, scale: float | None = None,
        initial_state: Tensor | None = None, output_final_state: bool = False, chunk_size: int | None = None,
        mode: str = "chunk") -> tuple[Tensor, Tensor | None]:
    """Kimi Delta Attention: decay by exp(g_t) per key channel (g [B,T,HV,K], <= 0), then the delta write."""
    return _run("kda", q, k, v, g, beta, scale, initial_state, output_final_state, chunk_size, mode, True)
