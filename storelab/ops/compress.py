"""Learned pooling of positions into compressed entries, and the lightning indexer's choice.

DeepSeek-V4 (arXiv 2606.19348) compresses the context before attention reads it.
Entry ``w`` pools the ``pool`` tokens that end with stride block ``w``,
absolute positions ``[w*stride + stride - pool, (w+1)*stride)``. Slot ``j`` of the
pool (``j = 0`` oldest) reads token ``a_j`` through projection series
``s_j = j // stride`` (a token belongs to ``pool / stride`` consecutive entries and
contributes a different projection to each), and per channel ``c``

    e_w[c] = sum_j softmax_j(z[a_j, s_j, c] + bias[j, c]) * kv[a_j, s_j, c].

Compressed Sparse Attention (CSA) uses pool 8 at stride 4, so adjacent entries
overlap by 4 tokens; Heavily Compressed Attention (HCA) uses pool = stride = 128.
Slots before position 0 are left out of the softmax, so entry 0 pools only the
first stride block (as transformers' ``DeepseekV4CSACompressor`` does): a context
of L tokens holds ``L // stride`` entries, and entry ``w`` is readable from the
query at position ``(w+1)*stride - 1`` on, when its last token has arrived.

Shape legend: B batch, T tokens given, S projection series (pool / stride),
C channels, P slots in a pool (``pool``), N entries, H heads, K head width.

* ``pool_entries(kv_BTSC, z_BTSC, bias_PC, *, stride, start, first)`` - fast form.
* ``pool_entries_reference(...)`` - the same, one entry and one slot at a time.
* ``readable_entries(q_pos_T, n_entries, stride)`` - causal mask [T, N].
* ``index_scores(q_BTHK, k_BNK, w_BTH, *, scale)`` - lightning-indexer scores
  ``sum_h w_h ReLU(q_h . k) * scale`` (DeepSeek Sparse Attention's indexer).
* ``imitation_loss(q_BTHK, kv_BNC, iq_BTHK, ik_BNK, w_BTH, readable_TN, *, scale, index_scale)`` - the
  indexer's training loss (the top-k passes no gradient): KL(the main attention over the readable
  entries, heads averaged, no gradient || softmax of the index scores), mean over the queries.
* ``select_topk(scores_BTN, readable_TN, k)`` - bool mask of the k best readable entries
  (the reference form: it holds every query's scores over every entry).
* ``select_topk_streamed(q_BTHK, keys, w_BTH, *, seen, n_entries, stride, k, scale, block, queries)``
  - the same choice as positions, the scores made ``queries`` by ``block`` at a time and merged
  into a running top-k (``storelab.ops.indexer.running_top``), so no [T, N] tensor is held.
"""

from __future__ import annotations

import torch
from torch import Tensor

from storelab.ops.indexer import attention_target, indexer_distill_loss, top_positions_streamed
from storelab.ops.indexer import index_scores as _indexer_scores
from storelab.ops.precision import at_least_fp32

__all__ = ["pool_entries", "pool_entries_reference", "readable_entries", "index_scores", "imitation_loss",
           "select_topk", "select_topk_streamed"]


def _span(kv_BTSC: Tensor, z_BTSC: Tensor, *, pool: int, stride: int, start: int, first: int):
    """The tokens entries ``first ..`` need, from position ``first*stride + stride - pool``;
    positions before 0 are padded with kv 0 and score -inf (softmax weight 0)."""
    T = kv_BTSC.shape[1]
    last = (start + T) // stride
    lo = first * stride + stride - pool
    if max(lo, 0) < start:
        raise ValueError(f"start: entry {first} needs tokens from position {max(lo, 0)}, the input starts at {start}")
    hi = last * stride
    kv = kv_BTSC[:, max(lo, start) - start: hi - start]
    z = at_least_fp32(z_BTSC[:, max(lo, start) - start: hi - start])
    if lo < 0:
        kv = torch.nn.functional.pad(kv, (0, 0, 0, 0, -lo, 0))
        z = torch.nn.functional.pad(z, (0, 0, 0, 0, -lo, 0), value=float("-inf"))
    return kv, z, max(last - first, 0)


def pool_entries(kv_BTSC: Tensor, z_BTSC: Tensor, bias_PC: Tensor, *, stride: int, start: int = 0,
                 first: int = 0) -> Tensor:
    """Entries ``first .. (start+T)//stride - 1`` from tokens at positions ``start ..``.

    ``kv_BTSC`` / ``z_BTSC`` are each token's S projections and scores; ``bias_PC``
    the learned bias per pool slot. Returns [B, N, C], pooled but not normalised.
    """
    pool = bias_PC.shape[0]
    B, _, S, C = kv_BTSC.shape
    kv, z, N = _span(kv_BTSC, z_BTSC, pool=pool, stride=stride, start=start, first=first)
    if N == 0:
        return kv_BTSC.new_zeros(B, 0, C)
    series_P = torch.arange(pool, device=kv.device) // stride
    slot_P = torch.arange(pool, device=kv.device)
    # unfold: [B, N, S, C, P] -> [B, N, P, S, C] -> slot j keeps its series s_j: [B, N, P, C]
    kv_w = kv.unfold(1, pool, stride).permute(0, 1, 4, 2, 3)[:, :, slot_P, series_P]
    z_w = z.unfold(1, pool, stride).permute(0, 1, 4, 2, 3)[:, :, slot_P, series_P]
    p_BNPC = torch.softmax(z_w + at_least_fp32(bias_PC), dim=2)
    return (p_BNPC.to(kv_w.dtype) * kv_w).sum(dim=2)


def pool_entries_reference(kv_BTSC: Tensor, z_BTSC: Tensor, bias_PC: Tensor, *, stride: int, start: int = 0,
                           first: int = 0) -> Tensor:
    """Plain loops over entries and slots; the fast form must agree with it."""
    pool = bias_PC.shape[0]
    B, T, S, C = kv_BTSC.shape
    out = []
    for w in range(first, (start + T) // stride):
        num = torch.zeros(B, C, dtype=torch.float64)
        den = torch.zeros(B, C, dtype=torch.float64)
        logits, values = [], []
        for j in range(pool):
            a = w * stride + stride - pool + j
            if a < 0:
                continue
            if a < start:
                raise ValueError(f"start: entry {w} needs position {a}, the input starts at {start}")
            logits.append(z_BTSC[:, a - start, j // stride].double() + bias_PC[j].double())
            values.append(kv_BTSC[:, a - start, j // stride].double())
        m = torch.stack(logits).amax(0)
        for lg, v in zip(logits, values):
            e = torch.exp(lg - m)
            num, den = num + e * v, den + e
        out.append(num / den)
    if not out:
        return kv_BTSC.new_zeros(B, 0, C)
    return torch.stack(out, dim=1).to(kv_BTSC.dtype)


def readable_entries(q_pos_T: Tensor, n_entries: int, stride: int) -> Tensor:
    """[T, N] bool: entry w is complete (its last token w*stride + stride - 1 <= t)."""
    w = torch.arange(n_entries, device=q_pos_T.device)
    return (w[None, :] + 1) * stride <= q_pos_T[:, None] + 1


def index_scores(q_BTHK: Tensor, k_BNK: Tensor, w_BTH: Tensor, *, scale: float) -> Tensor:
    """[B, T, N] lightning-indexer scores: sum over index heads of w_h * ReLU(q_h . k) * scale.

    The DSA indexer's score (``storelab.ops.indexer.index_scores``; scale > 0 commutes with
    the ReLU), in fp32: at inference one [B, H, T, N] product, ReLU in place, heads summed in place."""
    return _indexer_scores(at_least_fp32(q_BTHK), at_least_fp32(k_BNK), at_least_fp32(w_BTH), scale=scale)


def imitation_loss(q_BTHK: Tensor, kv_BNC: Tensor, iq_BTHK: Tensor, ik_BNK: Tensor, w_BTH: Tensor,
                   readable_TN: Tensor, *, scale: float, index_scale: float) -> Tensor:
    """KL(main attention over the readable entries, one KV head, heads averaged, detached || softmax
    of the index scores); every query must have a readable entry."""
    target_BTN = attention_target(q_BTHK, kv_BNC, scale=scale, mask_TL=readable_TN)
    scores_BTN = index_scores(iq_BTHK, ik_BNK, w_BTH, scale=index_scale)
    return indexer_distill_loss(scores_BTN.masked_fill(~readable_TN, float("-inf")), target_BTN)


def select_topk(scores_BTN: Tensor, readable_TN: Tensor, k: int) -> Tensor:
    """[B, T, N] bool: for each query the ``k`` highest-scoring readable entries (fewer if
    fewer are readable). Ties go to the lower index."""
    B, T, N = scores_BTN.shape
    chosen = torch.zeros(B, T, N, dtype=torch.bool, device=scores_BTN.device)
    if N == 0:
        return chosen
    masked = scores_BTN.masked_fill(~readable_TN, float("-inf"))
    # a stable sort, not topk: ReLU scores tie at 0 often, and the choice must not depend
    # on how many entries exist yet (chunked and full passes must pick the same)
    idx = masked.sort(dim=-1, descending=True, stable=True).indices[..., :k]
    chosen.scatter_(-1, idx, True)
    return chosen & readable_TN


def select_topk_streamed(q_BTHK: Tensor, keys, w_BTH: Tensor, *, seen: int, n_entries: int, stride: int, k: int,
                         scale: float, block: int, queries: int) -> tuple[Tensor, Tensor]:
    """``select_topk(index_scores(q, k_all, w), readable_entries(pos, N, stride), k)`` as positions.

    The T queries sit at positions ``seen ..``; ``keys(s, e)`` returns the index keys of entries
    s..e-1, [B, e - s, K]. ``queries`` queries at a time, scores are made ``block`` entries at a
    time, unreadable ones -inf (only blocks past the entries complete before the pass's first
    query hold any), and merged into a running top-k that keeps the older entry on a tie, as the
    stable sort does. Few queries by wide blocks: the top-k's cost per query row is paid once
    per block. Returns (idx_BTk, valid_BTk), k' = min(k, N) columns best first; ``valid`` is
    False where fewer than k entries are readable, which ``select_topk`` leaves unchosen.
    """
    T = q_BTHK.shape[1]
    picks = []
    for a in range(0, T, max(1, queries)):
        b = min(T, a + max(1, queries))
        pos_T = torch.arange(seen + a, seen + b, device=q_BTHK.device)
        complete = (seen + a) // stride

        def score_fn(s: int, e: int) -> Tensor:
            scores_BTn = index_scores(q_BTHK[:, a:b], keys(s, e), w_BTH[:, a:b], scale=scale)
            if e > complete:
                readable_Tn = (torch.arange(s, e, device=pos_T.device)[None, :] + 1) * stride <= pos_T[:, None] + 1
                scores_BTn = scores_BTn.masked_fill(~readable_Tn, float("-inf"))
            return scores_BTn

        picks.append(top_positions_streamed(score_fn, n_entries, k, block=max(1, block)))
    if len(picks) == 1:
        return picks[0]
    return torch.cat([i for i, _ in picks], dim=1), torch.cat([v for _, v in picks], dim=1)
