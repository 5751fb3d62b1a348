"""The delta rules' plain forms: one token at a time, and chunk by chunk as in the papers.

Four update rules, one state ``S_BHKV`` per head (a linear map from keys to values; the
prediction for a key is ``S^T k``), one output rule ``o_t = S_t^T (scale * q_t)`` read
after the token's own write:

* ``linear_attention`` (Katharopoulos et al., arXiv 2006.16236; a fixed or given decay as in
  RetNet arXiv 2307.08621 and Lightning Attention arXiv 2401.04658):
      S_t = a_t S_{t-1} + k_t v_t^T                                   a_t = exp(g_t), 1 if g is None
* ``delta_rule`` (Schlag, Irie and Schmidhuber, arXiv 2102.11174; Widrow-Hoff):
      S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T
* ``gated_delta_rule`` (Yang, Kautz and Hatamizadeh, arXiv 2412.06464), g [B,T,H] per head:
      S' = exp(g_t) S_{t-1};   S_t = S' + beta_t k_t (v_t - S'^T k_t)^T
* ``kda`` (Kimi Linear, arXiv 2510.26692), g [B,T,H,K] per key channel:
      S' = diag(exp(g_t)) S_{t-1};   S_t = S' + beta_t k_t (v_t - S'^T k_t)^T

The ops (``storelab.ops.delta``) take ``q, k, v`` then keyword-only ``g, beta, scale,
initial_state, output_final_state, chunk_size, mode`` and return ``(o [B,T,HV,V], final_state
or None)``. Layout ``[B, T, H, D]``; q and k may have fewer heads than v (``HV`` a multiple of
``H``; value head h reads query/key head ``h // (HV / H)``, Qwen3-Next's grouping); g and beta
are given per value head. No normalisation happens inside: L2-normalise q and k before.
Scale convention: ``scale`` multiplies q inside the op, default ``K ** -0.5``, as transformers'
``torch_chunk_gated_delta_rule`` and ``chunk_kimi_delta_attention`` always do; ``scale=1.0``
gives the bare rule.

Here: ``recurrent_step``, the per-token rule every other form must equal (``mode="recurrent"``),
and ``chunk_reference``, a plain chunked form to read against the papers: no workspace, no
factored decays, no in-place arithmetic, so autograd differentiates it. The ops' ``mode="chunk"``
is the same algorithm tuned for a CPU.

Chunked WY/UT form (DeltaNet, Yang et al., arXiv 2406.06484, section 3; with decay, Gated DeltaNet,
arXiv 2412.06464, section 3.3). Cut the sequence into chunks of C tokens. Within a chunk, with G
the cumulative log decay from the chunk's start (per head, or per key channel for KDA) and
Gamma_ij = exp(G_i - G_j) the decay from token j to token i (j <= i; per channel a C x C x K
array, applied inside the key product):

    A = strict_tril(diag(beta) (K K^T * Gamma))        the delta writes seeing each other
    T = (I + A)^-1                                     unit lower triangular (UT transform)
    U = T diag(beta) V,   W = T diag(beta) (K * exp(G))

then, chunk by chunk, the state S entering the chunk:

    V_new = U - W S                                    what each token writes
    O     = (Q * exp(G)) S + (Q K^T * Gamma)_tril V_new     the diagonal included
    S    <- exp(G_C) S + (K * exp(G_C - G))^T V_new     G_C the chunk's total decay

Linear attention (beta None) writes v_t itself: V_new = V, no A, T, U or W. The delta rule has
no decay: G = 0, Gamma = 1. Q carries the scale.

Shape legend: B batch, T tokens, H query/key heads (HV value heads; in the chunked form H is the
value heads, q and k already repeated), K key width, V value width, N chunks, C chunk size.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from storelab.ops._inputs import float_tensors

__all__ = ["chunk_reference", "recurrent_step"]


# ---------------------------------------------------------------------------- the ops' contract
def check_delta_shapes(name, q, k, v, g, beta, initial_state, g_per_channel):
    """The shapes every delta-rule call takes (ours, or fla's through ``storelab.ops.fla``), a
    ValueError naming the argument otherwise; returns (B, T, H, K, HV, V)."""
    if q.dim() != 4 or k.shape != q.shape or v.dim() != 4 or v.shape[:2] != q.shape[:2]:
        raise ValueError(f"q, k, v: expected q, k [B, T, H, K] and v [B, T, HV, V] ({name}), got "
                         f"{list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    if HV % H:
        raise ValueError(f"v: {HV} value heads are not a multiple of {H} query/key heads ({name})")
    if beta is not None and tuple(beta.shape) != (B, T, HV):
        raise ValueError(f"beta: expected shape [B, T, HV] = {[B, T, HV]}, got {list(beta.shape)}")
    if g is not None:
        want = (B, T, HV, K) if g_per_channel else (B, T, HV)
        if tuple(g.shape) != want:
            raise ValueError(f"g: expected shape {list(want)}, got {list(g.shape)}")
    if initial_state is not None and tuple(initial_state.shape) != (B, HV, K, V):
        raise ValueError(f"initial_state: expected shape {[B, HV, K, V]}, got {list(initial_state.shape)}")
    return B, T, H, K, HV, V


def prepare_delta_inputs(name, q, k, v, g, beta, scale, initial_state, chunk_size, g_per_channel):
    """The inputs every form computes on: shapes checked, float64 kept (anything else in float32),
    q and k repeated to the value heads (value head h reads query/key head h // (HV / H)), the
    scale defaulted to K ** -0.5. Returns (q, k, v, g, beta, scale, S0), q and k [B, T, HV, K]."""
    float_tensors(name, q=q, k=k, v=v, g=g, beta=beta, initial_state=initial_state)
    B, T, H, K, HV, V = check_delta_shapes(name, q, k, v, g, beta, initial_state, g_per_channel)
    if chunk_size is not None and chunk_size < 1:  # None: chosen for this CPU (``storelab.ops.tuning``)
        raise ValueError(f"chunk_size: must be >= 1, got {chunk_size}")
    dt = torch.float64 if q.dtype == torch.float64 else torch.float32
    q, k, v = q.to(dt), k.to(dt), v.to(dt)
    g = None if g is None else g.to(dt)
    beta = None if beta is None else beta.to(dt)
    if HV != H:
        q, k = q.repeat_interleave(HV // H, dim=2), k.repeat_interleave(HV // H, dim=2)
    scale = K ** -0.5 if scale is None else scale
    S0 = None if initial_state is None else initial_state.to(dt)
    return q, k, v, g, beta, scale, S0


# ---------------------------------------------------------------------------- one token
def recurrent_step(q_BHK: Tensor, k_BHK: Tensor, v_BHV: Tensor, S_BHKV: Tensor, *, g: Tensor | None = None,
                   beta: Tensor | None = None, scale: float = 1.0) -> tuple[Tensor, Tensor]:
    """One token of any of the four rules; returns (o_BHV, new S_BHKV).

    ``g`` is the log decay, [B,H] (per head) or [B,H,K] (per channel) or None; ``beta`` [B,H]
    selects the delta rule, None the additive write of linear attention. Heads already matched.
    """
    if g is not None:
        a = g.exp()
        S_BHKV = S_BHKV * (a[..., None, None] if a.dim() == 2 else a[..., None])
    if beta is None:
        write_BHV = v_BHV
    else:
        pred_BHV = torch.einsum("bhkv,bhk->bhv", S_BHKV, k_BHK)
        write_BHV = beta[..., None] * (v_BHV - pred_BHV)
    S_BHKV = S_BHKV + k_BHK[..., :, None] * write_BHV[..., None, :]
    o_BHV = torch.einsum("bhkv,bhk->bhv", S_BHKV, q_BHK * scale)
    return o_BHV, S_BHKV


def _recurrent(q, k, v, g, beta, scale, S_BHKV):
    T = q.shape[1]
    o = []
    for t in range(T):
        o_t, S_BHKV = recurrent_step(q[:, t], k[:, t], v[:, t], S_BHKV, g=None if g is None else g[:, t],
                                     beta=None if beta is None else beta[:, t], scale=scale)
        o.append(o_t)
    return (torch.stack(o, dim=1) if o else v.new_zeros(v.shape)), S_BHKV


# ---------------------------------------------------------------------------- chunk by chunk
def _chunk_view(x: Tensor, C: int) -> Tensor:
    """[B, T, H, *D] -> [N, B, H, C, D] as a strided view (zero padded to a multiple of C, which copies;
    D = 1 if absent)."""
    if x.dim() == 3:
        x = x[..., None]
    B, T, H, D = x.shape
    N = -(-T // C)
    if N * C != T:
        x = F.pad(x, (0, 0, 0, 0, 0, N * C - T))
    return x.view(B, N, C, H, D).permute(1, 0, 3, 2, 4)


def _to_chunks(x: Tensor, C: int) -> Tensor:
    """[B, T, H, *D] -> [N, B*H, C, D] (zero padded to a multiple of C; D = 1 if absent)."""
    v = _chunk_view(x, C)
    N, B, H, C, D = v.shape
    return v.reshape(N, B * H, C, D)


def _from_chunks(x_NBCD: Tensor, B: int, T: int) -> Tensor:
    """[N, B*H, C, D] -> [B, T, H, D] as a strided view (the caller copies it where it belongs)."""
    N, BH, C, D = x_NBCD.shape
    H = BH // B
    return x_NBCD.view(N, B, H, C, D).permute(1, 0, 3, 2, 4).flatten(1, 2)[:, :T]


def records_grad(*tensors: Tensor | None) -> bool:
    """Whether autograd records a call on these tensors (grad mode on and one of them requires grad)."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _chunk_step(S: Tensor, Qc: Tensor, Kc: Tensor, Vc: Tensor, G: Tensor, b: Tensor | None,
                causal: Tensor, I: Tensor) -> tuple[Tensor, Tensor]:
    """One chunk of the WY/UT form: (O_c [BH, C, V], the state after the chunk [BH, K, V])."""
    # Gamma_ijd = exp(G_id - G_jd) for j <= i, 0 above (exp(-inf): no overflow, no NaN in the gradient)
    diff = G[:, :, None, :] - G[:, None, :, :]                                        # BH C C D
    Gamma = torch.where(causal[:, :, None], diff, float("-inf")).exp()

    def decayed_scores(X):  # (X K^T * Gamma)_ij = sum_d X_id K_jd Gamma_ijd              BH C C
        if Gamma.shape[-1] == 1:  # one decay per head (or none): a product, then the decay per pair
            return (X @ Kc.transpose(-1, -2)) * Gamma[..., 0]
        return (X[:, :, None, :] * Kc[:, None, :, :] * Gamma).sum(-1)

    eG, G_C = G.exp(), G[:, -1:]                                                      # BH C D, BH 1 D
    if b is None:  # linear attention: every token writes its value
        V_new = Vc
    else:
        A = (b * decayed_scores(Kc)).tril(-1)                                         # b: BH C 1
        T_inv = torch.linalg.solve_triangular(I + A, I.expand_as(A), upper=False, unitriangular=True)
        U = T_inv @ (b * Vc)                                                          # BH C V
        W = T_inv @ (b * Kc * eG)                                                     # BH C K
        V_new = U - W @ S
    O = (Qc * eG) @ S + decayed_scores(Qc) @ V_new                                    # BH C V
    return O, G_C.exp().transpose(-1, -2) * S + (Kc * (G_C - G).exp()).transpose(-1, -2) @ V_new


def chunk_reference(q: Tensor, k: Tensor, v: Tensor, *, g: Tensor | None = None, beta: Tensor | None = None,
                    scale: float | None, initial_state: Tensor | None = None,
                    chunk_size: int = 32, recompute: bool = False) -> tuple[Tensor, Tensor]:
    """The plain chunked WY/UT form of the module docstring; returns (o [B,T,HV,V], final S [B,HV,K,V]).

    Same layout and conventions as the ops: q, k [B,T,H,K], v [B,T,HV,V] (HV a multiple of H);
    ``g`` None, [B,T,HV] (per head) or [B,T,HV,K] (per key channel); ``beta`` [B,T,HV] for the
    delta rules, None for linear attention; ``scale`` multiplies q (None: K ** -0.5). o comes back
    in v's dtype, the state in the compute dtype (float64, else float32), as from the ops. The
    last chunk is zero padded: a padded token has k = 0 and no decay, so it changes nothing.
    ``recompute=True`` (training): autograd keeps only each chunk's inputs and the state entering
    it, and backward recomputes the chunk's products (as fla does on a GPU), so what a backward
    needs grows with T by one K x V state per chunk, not by the C x C (x K) products of every chunk.
    """
    out_dtype = v.dtype
    q, k, v, g, beta, scale, S0 = prepare_delta_inputs("chunk_reference", q, k, v, g, beta, scale,
                                                       initial_state, chunk_size, g is not None and g.dim() == 4)
    B, T, H, K = q.shape
    V, C = v.shape[-1], chunk_size
    Q_N, K_N, V_N = _to_chunks(scale * q, C), _to_chunks(k, C), _to_chunks(v, C)       # N BH C K|V
    G_N = _to_chunks(q.new_zeros(B, T, H) if g is None else g, C).cumsum(2)           # N BH C D, D = 1 or K
    b_N = None if beta is None else _to_chunks(beta, C)                                # N BH C 1
    S = q.new_zeros(B * H, K, V) if S0 is None else S0.reshape(B * H, K, V)           # BH K V
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    I = torch.eye(C, dtype=q.dtype, device=q.device)
    o = []
    for n in range(G_N.shape[0]):
        args = (S, Q_N[n], K_N[n], V_N[n], G_N[n], None if b_N is None else b_N[n], causal, I)
        O, S = checkpoint(_chunk_step, *args, use_reentrant=False) if recompute else _chunk_step(*args)
        o.append(O)
    o_N = torch.stack(o) if o else V_N                                                # N BH C V
    return _from_chunks(o_N, B, T).to(out_dtype), S.view(B, H, K, V)
