"""Routers and fixed addresses: which rows of a trained store a token reads.

Legend: N tokens (batch and time flattened), D input width, E experts,
K experts chosen per token (top_k), I expert inner width, S lookups per token.

Learned routing (a mixture of experts; Shazeer et al., arXiv 1701.06538):

* ``route_topk(logits_NE, top_k=, score=, bias_E=, normalize=, scaling=)``: scores
  ``s = score(logits)`` (softmax over experts, or elementwise sigmoid, or DeepSeek-V4's
  sqrt(softplus)); the chosen experts are the top-k of ``s + bias`` (the
  auxiliary-loss-free balancing bias of DeepSeek-V3, arXiv 2412.19437, steers the
  choice only); the weights are the unbiased scores of the chosen experts, divided by
  their sum when ``normalize`` and times ``scaling``.
* ``route_fixed(logits_NE, experts_NK, ...)``: the same weights for experts chosen in
  advance, as DeepSeek-V4's hash routing does (``experts = table[token id]``).
* ``balance_loss(logits_GNE, experts_GNK, score=)``: the load-balancing loss over G groups of N
  tokens, ``E / (K N) sum_i count_i P_i`` (P_i the mean of the scores normalised over experts),
  averaged over groups: G = 1, the batch, is Switch's / Qwen's form (arXiv 2101.03961); G = the
  sequences is DeepSeek-V3's complementary sequence-wise loss (arXiv 2412.19437, eq. 17-20).
  ``bias_step(load_E, rate)``: DeepSeek-V3's auxiliary-loss-free update of the choice bias,
  ``rate * sign(mean load - load_i)`` (an overloaded expert is chosen less), made outside the gradient.
* ``swiglu(gate, up, limit=)`` is the experts' unit, silu(gate) * up, clipped first when
  ``limit`` is given (DeepSeek-V4); ``clamped_swiglu(gate, up, alpha=, limit=, up_shift=)`` is
  gpt-oss's (arXiv 2508.10925; MiniMax-M3's experts and MLPs),
  ``g sigmoid(alpha g) (u + up_shift)`` of the clipped halves: ``swiglu`` at alpha = 1, shift 0.
* ``grouped_swiglu`` runs the chosen experts (with per-expert biases where given, gpt-oss's)
  on their tokens only: sort the N*K
  (token, expert) slots by expert, run each expert once on its contiguous slice,
  put the weighted results back in slot order and sum each token's K slots (no
  scatter-add: it is slow on the CPU and not deterministic on the GPU).
  ``dense_moe_reference`` computes every expert on every token and masks: the slow
  form the tests compare against. Both take the unit as ``act(gate, up)`` (default: ``swiglu``
  with ``limit``), so a store hands them the one it chose at construction.

Fixed addresses (Engram, arXiv 2601.07372):

* ``next_prime(n)``: the smallest prime >= n (table sizes).
* ``ngram_rows(history_BS, multipliers_SJ, primes_S, offsets_S, T)``: per lookup s, the
  multiplicative-XOR hash ``(x_t m_0) ^ (x_{t-1} m_1) ^ ... ^ (x_{t-n+1} m_{n-1})``
  modulo the lookup's prime table size, plus the table's offset in the shared embedding.
"""

from __future__ import annotations

from functools import lru_cache, partial
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "ROUTER_SCORES", "route_topk", "route_fixed", "expert_load", "balance_loss", "bias_step", "swiglu", "clamped_swiglu",
    "grouped_swiglu", "dense_moe_reference", "next_prime", "is_prime", "ngram_rows",
]


def _sqrt_softplus(x: Tensor) -> Tensor:
    return F.softplus(x).sqrt()


ROUTER_SCORES = {
    "softmax": lambda x: torch.softmax(x, dim=-1),
    "sigmoid": torch.sigmoid,
    "sqrtsoftplus": _sqrt_softplus,  # DeepSeek-V4
}


def _at_least_fp32(x: Tensor) -> Tensor:
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _weights(scores_NE: Tensor, experts_NK: Tensor, normalize: bool, scaling: float) -> Tensor:
    w_NK = scores_NE.gather(1, experts_NK)
    if normalize:
        w_NK = w_NK / (w_NK.sum(-1, keepdim=True) + 1e-20)
    return w_NK * scaling


def route_topk(logits_NE: Tensor, *, top_k: int, score: str = "softmax", bias_E: Tensor | None = None,
               normalize: bool = True, scaling: float = 1.0, n_group: int = 1, topk_group: int = 1
               ) -> tuple[Tensor, Tensor]:
    """(weights_NK, at least fp32; experts_NK long) for a learned router. With ``n_group`` > 1 the choice is
    group-limited (DeepSeek-V3, arXiv 2412.19437): the experts form ``n_group`` equal groups, each group is
    scored by the sum of its two best choice scores (its best one under DeepSeek-V2's softmax), only the
    ``topk_group`` best groups stay eligible, and the top-k is taken among their experts."""
    if n_group > 1 and topk_group < n_group:
        return _route_grouped(logits_NE, top_k=top_k, score=score, bias_E=bias_E, normalize=normalize,
                              scaling=scaling, n_group=n_group, topk_group=topk_group)
    if score == "softmax" and normalize and bias_E is None:
        # the softmax renormalised over the chosen k is the softmax of their k logits (the same order
        # chooses them): no [N, E] softmax and its backward, the costlier part of routing a narrow layer
        top = torch.topk(_at_least_fp32(logits_NE), top_k, dim=-1)
        return torch.softmax(top.values, dim=-1) * scaling, top.indices
    scores_NE = ROUTER_SCORES[score](_at_least_fp32(logits_NE))
    choose_NE = scores_NE if bias_E is None else scores_NE + bias_E.to(scores_NE.dtype)
    experts_NK = torch.topk(choose_NE, top_k, dim=-1).indices
    return _weights(scores_NE, experts_NK, normalize, scaling), experts_NK


def _route_grouped(logits_NE: Tensor, *, top_k: int, score: str, bias_E: Tensor | None, normalize: bool,
                   scaling: float, n_group: int, topk_group: int) -> tuple[Tensor, Tensor]:
    N, E = logits_NE.shape
    scores_NE = ROUTER_SCORES[score](_at_least_fp32(logits_NE))
    choose_NE = scores_NE if bias_E is None else scores_NE + bias_E.to(scores_NE.dtype)
    choose_NGe = choose_NE.view(N, n_group, E // n_group)
    best = 2 if bias_E is not None else 1  # V3 (with the bias): top-2 sum per group; V2: the group's best
    group_NG = choose_NGe.topk(min(best, E // n_group), dim=-1).values.sum(-1)
    keep_NG = torch.zeros_like(group_NG, dtype=torch.bool).scatter_(1, group_NG.topk(topk_group, dim=-1).indices,
                                                                      True)
    masked_NE = choose_NGe.masked_fill(~keep_NG[..., None], float("-inf")).view(N, E)
    experts_NK = torch.topk(masked_NE, top_k, dim=-1).indices
    return _weights(scores_NE, experts_NK, normalize, scaling), experts_NK


def route_fixed(logits_NE: Tensor, experts_NK: Tensor, *, score: str = "softmax", normalize: bool = True,
                scaling: float = 1.0) -> Tensor:
    """weights_NK (at least fp32) for experts chosen in advance (hash routing)."""
    scores_NE = ROUTER_SCORES[score](_at_least_fp32(logits_NE))
    return _weights(scores_NE, experts_NK, normalize, scaling)


def expert_load(experts_NK: Tensor, n_experts: int) -> Tensor:
    """[E] number of (token, slot) pairs sent to each expert; sums to N * K."""
    return torch.bincount(experts_NK.reshape(-1), minlength=n_experts)


def balance_loss(logits_GNE: Tensor, experts_GNK: Tensor, *, score: str) -> Tensor:
    """Mean over the G groups of E / (K N) sum_i count_i P_i (1 when balanced and the scores uniform)."""
    G, N, E = logits_GNE.shape
    K = experts_GNK.shape[-1]
    s_GNE = ROUTER_SCORES[score](_at_least_fp32(logits_GNE))
    p_GE = (s_GNE / (s_GNE.sum(-1, keepdim=True) + 1e-20)).mean(1)
    count_GE = torch.zeros(G, E, device=logits_GNE.device).scatter_add_(
        1, experts_GNK.reshape(G, -1), torch.ones(G, N * K, device=logits_GNE.device))
    return (E / (K * N) * (count_GE * p_GE).sum(-1)).mean()


def bias_step(load_E: Tensor, rate: float) -> Tensor:
    """DeepSeek-V3's bias update: + rate for an expert below the mean load, - rate above it."""
    load_E = load_E.float()
    return rate * torch.sign(load_E.mean() - load_E)


def swiglu(gate: Tensor, up: Tensor, *, limit: float | None = None) -> Tensor:
    """silu(gate) * up (Shazeer, arXiv 2002.05202); DeepSeek-V4 clips both first
    (gate from above, up on both sides) when ``limit`` is given."""
    if limit is not None:
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
    return F.silu(gate) * up


def clamped_swiglu(gate: Tensor, up: Tensor, *, alpha: float, limit: float | None = None,
                   up_shift: float = 0.0) -> Tensor:
    """gpt-oss's unit (arXiv 2508.10925), gate and up halves not interleaved:

        g = min(gate, limit),  u = clamp(up, -limit, limit),  act = g * sigmoid(alpha * g) * (u + up_shift)

    (no clip without ``limit``); ``swiglu`` is alpha = 1, up_shift = 0."""
    if limit is not None:
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
    return gate * torch.sigmoid(alpha * gate) * (up + up_shift)


Unit = Callable[[Tensor, Tensor], Tensor]  # act(gate, up) of a gated expert


def grouped_swiglu(x_ND: Tensor, experts_NK: Tensor, weights_NK: Tensor, gate_up_EFD: Tensor, down_EDI: Tensor,
                   *, limit: float | None = None, act: Unit | None = None, gate_up_bias_EF: Tensor | None = None,
                   down_bias_ED: Tensor | None = None, gated: bool = True) -> Tensor:
    """sum_k w_nk * expert_{e_nk}(x_n), each expert run once on its own tokens.

    ``gated=False``: the experts are plain two-layer units (Nemotron-H's ReLU^2 experts): gate_up_EFD holds
    the up rows only, [E, I, D], and ``act(h)`` takes the one projection.

    gate_up_EFD is [E, 2I, D] (gate rows first, then up rows), down_EDI is [E, D_out, I]:
    the layout of transformers' 3-D expert tensors. ``act(gate, up)`` is the experts' unit
    (default: ``swiglu`` clipped at ``limit``). ``gate_up_bias_EF`` [E, 2I] and ``down_bias_ED``
    [E, D_out] are per-expert biases (gpt-oss's experts), both inside the weighting:
    w * (W_down act(W_gate_up x + b_gate_up) + b_down).
    """
    act = act if act is not None else partial(swiglu, limit=limit)
    N, K = experts_NK.shape
    E, D_out = gate_up_EFD.shape[0], down_EDI.shape[1]
    flat_e = experts_NK.reshape(-1)
    order = torch.argsort(flat_e, stable=True)       # slots grouped by expert
    tok = order // K                                 # token of each sorted slot
    counts = torch.bincount(flat_e, minlength=E).tolist()
    x_sorted = x_ND.index_select(0, tok)             # [N*K, D] (its backward an index_add, not a sorting index_put)
    w_sorted = weights_NK.reshape(-1)[order].to(x_ND.dtype)
    # each expert's tokens as a split and the results joined by one cat: under autograd, slices or slice
    # assignments would each cost a full-size zero-filled gradient (E of them per layer)
    gu_bias = gate_up_bias_EF.unbind(0) if gate_up_bias_EF is not None else [None] * E
    dn_bias = down_bias_ED.unbind(0) if down_bias_ED is not None else [None] * E
    outs = []
    for x_c, w_c, gu_FD, dn_DI, gu_b, dn_b in zip(x_sorted.split(counts), w_sorted.split(counts),
                                                  gate_up_EFD.unbind(0), down_EDI.unbind(0), gu_bias, dn_bias):
        if x_c.shape[0]:
            h = F.linear(x_c, gu_FD, gu_b)
            h = act(*h.chunk(2, dim=-1)) if gated else act(h)                       # [c, I]
            outs.append(F.linear(h, dn_DI, dn_b) * w_c[:, None])
    out_sorted = torch.cat(outs) if outs else x_ND.new_zeros(0, D_out)
    # back to slot order (a gather by the inverse permutation, no accumulation), then sum each token's K slots
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel(), device=order.device)
    return out_sorted.index_select(0, inverse).view(N, K, D_out).sum(1)


def dense_moe_reference(x_ND: Tensor, experts_NK: Tensor, weights_NK: Tensor, gate_up_EFD: Tensor, down_EDI: Tensor,
                        *, limit: float | None = None, act: Unit | None = None, gate_up_bias_EF: Tensor | None = None,
                        down_bias_ED: Tensor | None = None, gated: bool = True) -> Tensor:
    """The slow form: every expert on every token, then keep the chosen ones."""
    act = act if act is not None else partial(swiglu, limit=limit)
    E = gate_up_EFD.shape[0]
    gu_ENF = torch.einsum("nd,efd->enf", x_ND, gate_up_EFD)
    if gate_up_bias_EF is not None:
        gu_ENF = gu_ENF + gate_up_bias_EF[:, None, :]
    h_ENI = act(*gu_ENF.chunk(2, dim=-1)) if gated else act(gu_ENF)                 # [E, N, I]
    out_END = torch.einsum("eni,edi->end", h_ENI, down_EDI)
    if down_bias_ED is not None:
        out_END = out_END + down_bias_ED[:, None, :]
    mix_NE = torch.zeros(x_ND.shape[0], E, dtype=x_ND.dtype, device=x_ND.device)
    mix_NE.scatter_add_(1, experts_NK, weights_NK.to(x_ND.dtype))
    return torch.einsum("ne,end->nd", mix_NE, out_END)


# -- fixed addresses ------------------------------------------------------------------

_MR_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37)  # exact for n < 3.3e24


def is_prime(n: int) -> bool:
    """Deterministic Miller-Rabin primality test."""
    if n < 2:
        return False
    for p in _MR_BASES:
        if n % p == 0:
            return n == p
    d, r = n - 1, 0
    while d % 2 == 0:
        d, r = d // 2, r + 1
    for a in _MR_BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(r - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


@lru_cache(maxsize=4096)
def next_prime(n: int) -> int:
    """The smallest prime >= n."""
    n = max(n, 2)
    while not is_prime(n):
        n += 1
    return n


def ngram_rows(history_BS: Tensor, multipliers_SJ: Tensor, primes_S: Tensor, offsets_S: Tensor, T: int) -> Tensor:
    """Rows [B, T, S] read by the last T tokens of ``history_BS`` (which starts with
    J - 1 tokens of context before them, J = multipliers_SJ.shape[1]).

    Lookup s hashes the n-gram ending at token t as XOR_j (x_{t-j} * m_sj); its
    multipliers are zero for j >= n, and XOR with zero changes nothing, so lookups of
    every order share one loop. Products stay below 2^63 because each multiplier is
    below 2^63 / vocab_size.
    """
    J = multipliers_SJ.shape[1]
    mix_BTS = None
    for j in range(J):
        tok_BT = history_BS[:, J - 1 - j: J - 1 - j + T]                 # x_{t-j}
        term = tok_BT[..., None] * multipliers_SJ[:, j]                   # [B, T, S]
        mix_BTS = term if mix_BTS is None else torch.bitwise_xor(mix_BTS, term)
    return torch.remainder(mix_BTS, primes_S) + offsets_S
