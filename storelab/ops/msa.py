"""Block selection of MiniMax sparse attention (MSA, arXiv 2606.13392) as pure functions.

An index branch scores every kept position for every query: one index query head per group of
heads that share a key/value head (G of them) against one shared index key head,
``s[g, t, l] = q_idx[t, g] . k_idx[l]`` (no scale, no activation; future positions -inf). Scores are
max-pooled over blocks of ``block_size`` consecutive positions (block-max pooling), the query's own
block and the ``local_blocks - 1`` before it are forced in (+inf), optionally the first block too
(the attention sink), and each group reads the positions of its ``top_blocks`` best blocks, causally.
Blocks are anchored at absolute positions: block b holds positions b*block_size .. (b+1)*block_size-1.

Reference forms (the whole [B, G, T, L] scores and mask):

    block_scores(q_idx_BTGI, k_idx_BLI, *, positions_T, block_size)        -> [B, G, T, N] fp32
    select_blocks(scores_BGTN, *, positions_T, block_size, top_blocks,
                  local_blocks=1, include_first_block=False)                  -> [B, G, T, k] block ids, -1 = none
    block_mask(blocks_BGTk, *, positions_T, length, block_size)              -> [B, G, T, L] bool (True = read)

Streamed forms (nothing of size [T, L]):

    select_blocks_streamed(q_idx_BTGI, k_idx_BLI, *, positions_T, block_size, top_blocks,
                           local_blocks=1, include_first_block=False)         -> what select_blocks(block_scores(..))
                                                                                 gives, the same set per query
    attend_blocks(q_BTHK, k_BLGK, v_BLGV, blocks_BGTk, *, positions_T, block_size, scale,
                  sinks_H=None)                                               -> (o_BTHV, read_BGT)

``select_blocks_streamed`` makes the scores ``SCORE_BUDGET`` logits at a time (a run of whole
blocks of positions), pools them per block, gives the forced blocks +inf, and merges the block
scores into a running top of blocks per (group, query) (``running_top``: ties to the earlier
block; ``topk``'s order among exact ties is unspecified, so with continuous scores the two agree).
``attend_blocks`` gathers each (query, group)'s at most ``top_blocks * block_size`` positions
(queries folded into the batch, ``GATHER_BUDGET`` numbers at a time) and attends to them with a
[k * block_size] mask per query (causal cut, -1 slots): that is the softmax of the reference over
``block_mask``'s positions.

Training the index branch (the top-k passes no gradient): ``block_attention_target(q_BTHK, k_BLGK, *,
positions_T, block_size, scale)`` -> [B, G, T, N], the main attention's weight per block (each group's
heads averaged, causal, no gradient), which the block scores' softmax imitates (KL; MiniMax's recipe).

Keys are the whole history, entry l at absolute position l; ``positions_T`` are the queries'
absolute positions. The result for a query does not depend on how many later keys exist, so a
chunked prefill selects exactly what one full pass selects. The selection contract matches
transformers' ``MiniMaxM3VLIndexer`` (top min(top_blocks, N) slots, local blocks inside the budget,
-1 for slots that would fall on a future block).

Shape legend: B batch, T queries, L keys, G key/value groups (= index query heads), H query heads,
I index width, K key width, V value width, N blocks, n blocks of one merge, k selected slots,
P gathered positions (k * block_size), X rows of the index scores (B * G * T).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from storelab.ops.attention import attend_lse, merge_parts
from storelab.ops.indexer import running_top
from storelab.ops.precision import at_least_fp32

__all__ = ["block_scores", "select_blocks", "block_mask", "select_blocks_streamed", "attend_blocks",
           "block_attention_target"]

SCORE_BUDGET = 1 << 19   # index logits held at once while scoring a long context (2 MiB in fp32)
GATHER_BUDGET = 1 << 18  # gathered key/value numbers held at once by the read (1 MiB in fp32)


def block_scores(q_idx_BTGI: Tensor, k_idx_BLI: Tensor, *, positions_T: Tensor, block_size: int) -> Tensor:
    """Block-max pooled index scores, [B, G, T, ceil(L / block_size)]; -inf for wholly future blocks."""
    B, T, G, _ = q_idx_BTGI.shape
    L = k_idx_BLI.shape[1]
    s_BGTL = torch.einsum("btgi,bli->bgtl", at_least_fp32(q_idx_BTGI), at_least_fp32(k_idx_BLI))
    future_TL = torch.arange(L, device=s_BGTL.device)[None, :] > positions_T[:, None]
    s_BGTL = s_BGTL.masked_fill(future_TL, float("-inf"))
    N = -(-L // block_size)
    pad = N * block_size - L
    if pad:
        s_BGTL = torch.nn.functional.pad(s_BGTL, (0, pad), value=float("-inf"))
    return s_BGTL.view(B, G, T, N, block_size).amax(-1)


@torch.no_grad()
def block_attention_target(q_BTHK: Tensor, k_BLGK: Tensor, *, positions_T: Tensor, block_size: int,
                           scale: float) -> Tensor:
    """The main attention's weight per block, [B, G, T, N] (rows sum to 1): each group's heads averaged."""
    B, T, H, _ = q_BTHK.shape
    L, G = k_BLGK.shape[1], k_BLGK.shape[2]
    k_BLHK = k_BLGK.repeat_interleave(H // G, dim=2)
    logits_BHTL = torch.einsum("bthk,blhk->bhtl", at_least_fp32(q_BTHK), at_least_fp32(k_BLHK)) * scale
    future_TL = torch.arange(L, device=q_BTHK.device)[None, :] > positions_T[:, None]
    w_BGTL = logits_BHTL.masked_fill(future_TL, float("-inf")).softmax(-1).view(B, G, H // G, T, L).mean(2)
    N = -(-L // block_size)
    w_BGTL = F.pad(w_BGTL, (0, N * block_size - L))
    return w_BGTL.view(B, G, T, N, block_size).sum(-1)


def _forced_blocks(positions_T: Tensor, *, block_size: int, local_blocks: int, include_first_block: bool) -> Tensor:
    """[T, F] the blocks each query always reads: its own, the local_blocks - 1 before, block 0 if asked."""
    q_block_T = positions_T // block_size
    forced = [(q_block_T - j).clamp(min=0) for j in range(local_blocks)]
    if include_first_block:
        forced.append(torch.zeros_like(q_block_T))
    return torch.stack(forced, dim=-1) if forced else q_block_T.new_zeros(q_block_T.shape[0], 0)


def select_blocks(scores_BGTN: Tensor, *, positions_T: Tensor, block_size: int, top_blocks: int,
                  local_blocks: int = 1, include_first_block: bool = False) -> Tensor:
    """Each query's top blocks per group, forced blocks first; -1 pads slots with no readable block."""
    B, G, T, N = scores_BGTN.shape
    s = scores_BGTN.clone()
    idx_TF = _forced_blocks(positions_T, block_size=block_size, local_blocks=local_blocks,
                            include_first_block=include_first_block)
    if idx_TF.shape[-1]:
        s.scatter_(-1, idx_TF.expand(B, G, T, idx_TF.shape[-1]), float("inf"))
    top_s, top_i = s.topk(min(top_blocks, N), dim=-1)
    return top_i.masked_fill(top_s == float("-inf"), -1)


def block_mask(blocks_BGTk: Tensor, *, positions_T: Tensor, length: int, block_size: int) -> Tensor:
    """[B, G, T, L] bool: key l is read iff its block was selected and l <= the query's position."""
    B, G, T, _ = blocks_BGTk.shape
    N = -(-length // block_size)
    safe = blocks_BGTk.masked_fill(blocks_BGTk < 0, N)                       # -1 -> a discarded column
    keep_BGTN = torch.zeros(B, G, T, N + 1, dtype=torch.bool, device=blocks_BGTk.device)
    keep_BGTN.scatter_(-1, safe, True)
    keep_BGTL = keep_BGTN[..., :N].repeat_interleave(block_size, dim=-1)[..., :length]
    causal_TL = torch.arange(length, device=blocks_BGTk.device)[None, :] <= positions_T[:, None]
    return keep_BGTL & causal_TL


def select_blocks_streamed(q_idx_BTGI: Tensor, k_idx_BLI: Tensor, *, positions_T: Tensor, block_size: int,
                           top_blocks: int, local_blocks: int = 1, include_first_block: bool = False,
                           score_budget: int = SCORE_BUDGET) -> Tensor:
    """``select_blocks(block_scores(...))`` with the scores made a run of blocks at a time.

    One matmul scores the positions of whole blocks, about ``score_budget`` logits (X = B * G * T
    rows, one per (group, query)); the future is cut (-inf) and each block max-pooled. The block
    scores of several matmuls (at least 64 * k where the budget allows: torch's ``topk`` takes its
    fast path from there) get the forced blocks' +inf and are merged into a running top of
    min(top_blocks, N) per row. The slots come out by score, best first (forced blocks first),
    -1 last, as ``topk`` orders them. The selection passes no gradient.
    """
    B, T, G, I = q_idx_BTGI.shape
    L = k_idx_BLI.shape[1]
    N = -(-L // block_size)
    k = min(top_blocks, N)
    X = B * G * T
    q_BXI = q_idx_BTGI.detach().float().permute(0, 2, 1, 3).reshape(B, G * T, I)   # all groups: one matmul
    k_idx_BLI = k_idx_BLI.detach()
    forced_TF = _forced_blocks(positions_T, block_size=block_size, local_blocks=local_blocks,
                               include_first_block=include_first_block)
    f_lo, f_hi = (int(forced_TF.min()), int(forced_TF.max())) if forced_TF.numel() else (N, -1)
    first_q = int(positions_T.min())   # positions up to it are visible to every query
    sub = max(1, score_budget // max(1, X * block_size))      # blocks per matmul: about score_budget logits
    per_merge = sub * max(1, min(64 * k, score_budget // X) // sub)   # blocks per merge, pooled scores <= budget
    best_v = best_p = None
    for s in range(0, L, per_merge * block_size):
        e = min(L, s + per_merge * block_size)
        b0, nb = s // block_size, -(-(e - s) // block_size)
        m_BGTn = q_BXI.new_empty(B, G, T, nb)
        for u in range(s, e, sub * block_size):
            w = min(e, u + sub * block_size)
            logits_BXn = torch.bmm(q_BXI, k_idx_BLI[:, u:w].float().transpose(1, 2))
            if w - 1 > first_q:   # some position here lies after some query
                future_Tn = torch.arange(u, w, device=positions_T.device)[None, :] > positions_T[:, None]
                logits_BXn.view(B, G, T, w - u).masked_fill_(future_Tn, float("-inf"))
            # block-max pooling; a partly filled last block pools what it has (ceil_mode)
            j = (u - s) // block_size
            m_BGTn[..., j:j + sub] = F.max_pool1d(logits_BXn.view(X, 1, w - u), block_size,
                                                  ceil_mode=True).view(B, G, T, -1)
            del logits_BXn   # freed before the next matmul: one matmul's logits held at a time
        bid_n = torch.arange(b0, b0 + nb, device=positions_T.device)
        if f_lo < b0 + nb and f_hi >= b0:   # forced blocks take their slots: +inf, as select_blocks does
            m_BGTn.masked_fill_((forced_TF[:, :, None] == bid_n).any(1), float("inf"))
        # this step's own top first, then the merge: the running top is never concatenated with all n
        step_v, step_p = running_top(None, None, m_BGTn, bid_n.expand(B, G, T, nb), k)
        best_v, best_p = running_top(best_v, best_p, step_v, step_p, k)
    order = torch.sort(best_v, dim=-1, descending=True, stable=True).indices
    top_s, top_i = best_v.gather(-1, order), best_p.gather(-1, order)
    return top_i.masked_fill(top_s == float("-inf"), -1)


def attend_blocks(q_BTHK: Tensor, k_BLGK: Tensor, v_BLGV: Tensor, blocks_BGTk: Tensor, *, positions_T: Tensor,
                  block_size: int, scale: float, sinks_H: Tensor | None = None,
                  gather_budget: int = GATHER_BUDGET) -> tuple[Tensor, Tensor]:
    """Each query's heads of group g read the positions of g's selected blocks, up to their own.

    Returns (o [B, T, H, V], read [B, G, T] positions each group read). The same as
    ``attend(q, k, v, mask_TL=block_mask(...) per head, sinks_H=...)``, with per query only its
    P = k * block_size gathered keys and values and a [P] mask: queries are folded into the batch,
    a slice of them at a time so at most about ``gather_budget`` numbers are gathered at once.
    """
    B, T, H, K = q_BTHK.shape
    G, V = k_BLGK.shape[2], v_BLGV.shape[-1]
    P = blocks_BGTk.shape[-1] * block_size
    offs = torch.arange(block_size, device=blocks_BGTk.device)
    pos_BGTP = (blocks_BGTk[..., None] * block_size + offs).flatten(-2)
    read_BGTP = (pos_BGTP >= 0) & (pos_BGTP <= positions_T[:, None])   # -1 slots give negative positions
    pos_BTPG = torch.where(read_BGTP, pos_BGTP, 0).permute(0, 2, 3, 1)  # an unread slot gathers entry 0
    read_BTHP = read_BGTP.repeat_interleave(H // G, dim=1).transpose(1, 2)
    b_idx = torch.arange(B, device=k_BLGK.device)[:, None, None, None]
    g_idx = torch.arange(G, device=k_BLGK.device)
    step = max(1, gather_budget // max(1, B * P * G * (K + V)))
    outs = []
    q_chunks = q_BTHK.split(step, dim=1)  # split, not sliced: one backward, not a zero-filled q per slice
    for i, t in enumerate(range(0, T, step)):
        u = min(T, t + step)
        n_q = B * (u - t)   # the slice's queries, each a batch entry of one query
        k_BtPGK = k_BLGK[b_idx, pos_BTPG[:, t:u], g_idx]
        v_BtPGV = v_BLGV[b_idx, pos_BTPG[:, t:u], g_idx]
        part = attend_lse(q_chunks[i].reshape(n_q, 1, H, K), k_BtPGK.reshape(n_q, P, G, K),
                          v_BtPGV.reshape(n_q, P, G, V), scale=scale,
                          mask_TL=read_BTHP[:, t:u].reshape(n_q, H, 1, P))
        o_n1HV = part[0] if sinks_H is None else merge_parts([part], sinks_H=sinks_H)
        outs.append(o_n1HV.reshape(B, u - t, H, V))
    return torch.cat(outs, dim=1) if len(outs) > 1 else outs[0], read_BGTP.sum(-1)
