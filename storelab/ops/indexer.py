"""The lightning indexer of DeepSeek Sparse Attention as pure functions
(DeepSeek-V3.2; GLM-5, arXiv 2602.15763), and the block pools of DeepSeek-V4.1-Flash's
hierarchical selection (arXiv 2609.19969).

The indexer is a second, cheap store in front of the main cache: each query t has
``Hi`` small index heads ``q[t, h]`` and a weight per head ``w[t, h]``; each
position s has one index key ``k[s]``. The score of position s for query t is

    I[t, s] = sum_h  w[t, h] * relu(scale * q[t, h] . k[s])

and the main attention reads only the top-k positions by I. ``w`` is token
dependent (a projection of the token), so a query decides how much each index
head counts.

* ``index_scores(q_BTHK, k_BLK, w_BTH, *, scale, mask_TL=None)``  -> I, [B, T, L]
  (-inf where the mask forbids reading);
* ``index_scores_at(q_BTHK, k_BLK, w_BTH, pos_BTP, valid_BTP, *, scale)`` -> I at
  the given positions only, [B, T, P] (the indexer scores P entries, not L);
* ``top_positions(scores_BTL, k)`` -> (idx_BTk, valid_BTk): the best min(k, L)
  entries per query, ties to the earlier position; ``valid`` is False where
  fewer than k were readable;
* ``selection_mask(idx_BTk, valid_BTk, L)`` -> bool [B, T, L], True where selected;
* ``block_pool(scores_BTL, *, block, n_blocks)`` -> (pos_BTP, valid_BTP): the
  positions of the ``n_blocks`` blocks of ``block`` consecutive positions with the
  highest block-max score (P = n_blocks * block, fewer when fewer blocks exist);
* ``top_positions_streamed(score_fn, L, k, block=...)`` -> what ``top_positions`` gives on
  the full [B, T, L] scores, with the scores made ``block`` positions at a time by
  ``score_fn(s, e)`` and a running top-k kept between blocks: the scores are never whole
  (a long prefill's indexer would otherwise hold T * L of them); ``pool_block`` /
  ``n_pool_blocks`` also keep a running top of aligned block maxima (``block_pool``'s pool);
* ``indexer_distill_loss(scores_BTL, target_BTL)``: the top-k passes no gradient,
  so the indexer is trained to imitate the main attention: KL(target || softmax(I))
  with target the main attention's weights averaged over heads (DeepSeek-V3.2's
  objective, also GLM-5's); ``attention_target(q_BTHX, k_BLX, *, scale, mask_TL)`` is that target
  (one shared key head, softmax per head, averaged over heads, no gradient), and
  ``restrict_to_selection(scores_BTL, target_BTL, k)`` both restricted to the indexer's top k
  (the sparse training stage).

Legend: B batch, T queries, L positions kept, H index heads, K index head width,
k entries selected, P pool positions.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from storelab.ops.precision import at_least_fp32

__all__ = ["index_scores", "index_scores_at", "top_positions", "selection_mask", "block_pool", "indexer_distill_loss",
           "attention_target", "restrict_to_selection", "top_positions_streamed", "running_top"]


def index_scores(q_BTHK: Tensor, k_BLK: Tensor, w_BTH: Tensor, *, scale: float,
                 mask_TL: Tensor | None = None) -> Tensor:
    """I[b, t, s] = sum_h w[b,t,h] relu(scale q[b,t,h] . k[b,s]); masked entries are -inf."""
    dt = torch.promote_types(q_BTHK.dtype, torch.float32)
    if torch.is_grad_enabled() and (q_BTHK.requires_grad or k_BLK.requires_grad or w_BTH.requires_grad):
        logits_BTHL = torch.einsum("bthk,blk->bthl", q_BTHK.to(dt), k_BLK.to(dt)) * scale
        scores_BTL = torch.einsum("bth,bthl->btl", w_BTH.to(dt), F.relu(logits_BTHL))
    else:  # inference: the scale folded into q, ReLU in place, the heads summed one by one
        B, T, H, _ = q_BTHK.shape
        q_BXK = (q_BTHK.to(dt) * scale).transpose(1, 2).reshape(B, H * T, -1)   # heads folded into the rows
        logits_BHTL = torch.bmm(q_BXK, k_BLK.to(dt).transpose(1, 2)).view(B, H, T, -1)
        logits_BHTL.relu_()
        w_BHT1 = w_BTH.to(dt).transpose(1, 2)[..., None]
        scores_BTL = logits_BHTL[:, 0] * w_BHT1[:, 0]
        for h in range(1, logits_BHTL.shape[1]):
            scores_BTL.addcmul_(logits_BHTL[:, h], w_BHT1[:, h])
    if mask_TL is not None:
        scores_BTL = scores_BTL.masked_fill(~mask_TL, float("-inf"))
    return scores_BTL


def index_scores_at(q_BTHK: Tensor, k_BLK: Tensor, w_BTH: Tensor, pos_BTP: Tensor, valid_BTP: Tensor, *,
                    scale: float, max_gather: int = 1 << 20) -> Tensor:
    """The same score, computed only at positions ``pos_BTP`` (invalid ones are -inf).

    Each query gathers its own P index keys, so the work is T * P, not T * L;
    queries go in chunks that gather at most about ``max_gather`` numbers at once.
    """
    B, T, P = pos_BTP.shape
    step = max(1, max_gather // max(1, B * P * k_BLK.shape[-1]))
    dt = torch.promote_types(q_BTHK.dtype, torch.float32)
    b_idx = torch.arange(B, device=k_BLK.device)[:, None, None]
    out = []
    for t, q_BtHK, w_BtH in zip(range(0, T, step), q_BTHK.split(step, dim=1), w_BTH.split(step, dim=1)):
        k_BTPK = k_BLK[b_idx, pos_BTP[:, t:t + step]].to(dt)                  # gather: B T P K
        logits_BTHP = torch.einsum("bthk,btpk->bthp", q_BtHK.to(dt), k_BTPK) * scale
        out.append(torch.einsum("bth,bthp->btp", w_BtH.to(dt), F.relu(logits_BTHP)))
    return torch.cat(out, dim=1).masked_fill(~valid_BTP, float("-inf"))


def top_positions(scores_BTL: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Indices of the min(k, L) best entries per query and whether each is readable."""
    if k <= 0:
        raise ValueError(f"k: must be > 0, got {k}")
    vals_BTk, idx_BTk = _best(scores_BTL, k)
    return idx_BTk, torch.isfinite(vals_BTk)


def _best(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """The min(k, n) largest along the last axis; ties go to the lower index.

    The ReLU makes exact ties common (every head's overlap negative gives a score of
    exactly 0), and ``topk`` breaks them differently for different shapes, so a
    chunked prefill would read other entries than a full pass. A stable sort
    fixes the order.
    """
    vals, idx = torch.sort(x, dim=-1, descending=True, stable=True)
    kk = min(k, x.shape[-1])
    return vals[..., :kk], idx[..., :kk]


def selection_mask(idx_BTk: Tensor, valid_BTk: Tensor, L: int) -> Tensor:
    """Bool [B, T, L]: True at the selected, readable positions."""
    B, T, _ = idx_BTk.shape
    mask = torch.zeros(B, T, L + 1, dtype=torch.bool, device=idx_BTk.device)
    # unreadable picks are sent to a spare column L and dropped
    mask.scatter_(-1, torch.where(valid_BTk, idx_BTk, L), True)
    return mask[..., :L]


def block_pool(scores_BTL: Tensor, *, block: int, n_blocks: int) -> tuple[Tensor, Tensor]:
    """Positions of the ``n_blocks`` blocks with the highest block-max score.

    Blocks are aligned (block j holds positions j*block .. j*block + block - 1).
    A block's score is the max of its positions' scores, so any block that holds
    one of the top-m positions scores at least the m-th score: with
    ``n_blocks >= m`` the pool contains the top-m positions (ties aside).
    Returns pos_BTP (long, ascending) and valid_BTP (False for positions beyond L, not
    readable by the query, or in a block with nothing readable).
    """
    if block <= 0 or n_blocks <= 0:
        raise ValueError(f"block: block and n_blocks must be > 0, got {block}, {n_blocks}")
    B, T, L = scores_BTL.shape
    nb = -(-L // block)
    padded_BTN = F.pad(scores_BTL, (0, nb * block - L), value=float("-inf"))
    block_BTnb = padded_BTN.view(B, T, nb, block).amax(-1)
    _, bidx_BTb = _best(block_BTnb, n_blocks)
    bidx_BTb = bidx_BTb.sort(dim=-1).values   # positions ascending: ties inside the pool go to the earlier, as in L
    offs = torch.arange(block, device=scores_BTL.device)
    pos_BTP = (bidx_BTb[..., None] * block + offs).flatten(-2)
    valid_BTP = torch.isfinite(padded_BTN.gather(-1, pos_BTP))
    return pos_BTP.clamp_max(L - 1), valid_BTP


def indexer_distill_loss(scores_BTL: Tensor, target_BTL: Tensor) -> Tensor:
    """Mean over queries of KL(target || softmax(scores)); entries with score -inf must have target 0."""
    logq_BTL = torch.log_softmax(at_least_fp32(scores_BTL), dim=-1)
    t = at_least_fp32(target_BTL)
    kl_BTL = torch.where(t > 0, t * (torch.log(t.clamp_min(1e-30)) - logq_BTL), torch.zeros_like(t))
    return kl_BTL.sum(-1).mean()


@torch.no_grad()
def attention_target(q_BTHX: Tensor, k_BLX: Tensor, *, scale: float, mask_TL: Tensor) -> Tensor:
    """The main attention's weights over L entries (one key head), averaged over the H heads, [B, T, L]."""
    logits_BTHL = torch.einsum("bthx,blx->bthl", at_least_fp32(q_BTHX), at_least_fp32(k_BLX)) * scale
    return logits_BTHL.masked_fill(~mask_TL[..., None, :], float("-inf")).softmax(-1).nan_to_num(0.0).mean(2)


def restrict_to_selection(scores_BTL: Tensor, target_BTL: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Scores and target restricted to the top k of the (detached) scores, the target renormalised."""
    keep_BTL = selection_mask(*top_positions(scores_BTL.detach(), k), scores_BTL.shape[-1])
    target_BTL = target_BTL * keep_BTL
    return scores_BTL.masked_fill(~keep_BTL, float("-inf")), target_BTL / target_BTL.sum(-1, keepdim=True)


def _top_in_order(v_BTn: Tensor, k: int) -> Tensor:
    """Indices (ascending) of the k best of each row, ties to the lower index; n > k.

    ``topk`` of k + 1 (O(n)) decides every row whose k-th and (k+1)-th values differ: its
    k best are the same set whatever the order among equals. A row tied across that
    boundary (more entries equal to the k-th value ``vk`` than fit) takes the entries above
    ``vk`` and the earliest of those equal to it (a cumulative count, O(n), no sort). A short
    row (at most 2k: the merge of a running top-k with a block's) takes one stable sort, fewer ops.
    """
    if v_BTn.shape[-1] <= 2 * k:
        return torch.sort(v_BTn, dim=-1, descending=True, stable=True).indices[..., :k].sort(dim=-1).values
    vals, idx = torch.topk(v_BTn, k + 1, dim=-1, sorted=True)
    j = idx[..., :k].sort(dim=-1).values
    tied = (vals[..., k] == vals[..., k - 1]).nonzero(as_tuple=True)
    if tied[0].numel():
        v_rn, vk_r = v_BTn[tied], vals[..., k - 1][tied][:, None]
        gt, eq = v_rn > vk_r, v_rn == vk_r
        room = k - gt.sum(-1, keepdim=True)
        keep = gt | (eq & (eq.to(torch.int32).cumsum(-1, dtype=torch.int32) <= room))
        j[tied] = keep.nonzero()[:, -1].view(-1, k)  # row-major: position order within each row
    return j


def running_top(best_v: Tensor | None, best_p: Tensor | None, v_BTn: Tensor, p_BTn: Tensor | int, k: int) \
        -> tuple[Tensor, Tensor]:
    """Merge a block of scores into a running top-k; ties go to the earlier position.

    ``p_BTn``: the block's positions (a tensor, or the int first position of consecutive ones);
    they must be later than ``best_p``'s. The running top is kept in position order. The block's
    own top-k is taken first (an entry it drops has k of its own that beat it), then merged with
    the running one, so nothing of the block's size is concatenated or copied.
    """
    n = v_BTn.shape[-1]
    if n > k:
        j = _top_in_order(v_BTn, k)
        v_BTn = v_BTn.gather(-1, j)
        p_BTn = j + p_BTn if isinstance(p_BTn, int) else p_BTn.gather(-1, j)
    elif isinstance(p_BTn, int):
        p_BTn = torch.arange(p_BTn, p_BTn + n, device=v_BTn.device).expand(v_BTn.shape)
    if best_v is None:
        return v_BTn, p_BTn
    v, p = torch.cat([best_v, v_BTn], dim=-1), torch.cat([best_p, p_BTn], dim=-1)
    if v.shape[-1] <= k:
        return v, p
    j = _top_in_order(v, k)
    return v.gather(-1, j), p.gather(-1, j)


def top_positions_streamed(score_fn, L: int, k: int, *, block: int, pool_block: int = 0, n_pool_blocks: int = 0,
                           query_pos_T: Tensor | None = None):
    """``top_positions`` (and with ``n_pool_blocks`` also ``block_pool``) of scores never held whole.

    ``score_fn(s, e)`` returns the [B, T, e - s] scores of positions s..e-1 (-inf where a query
    may not read). Returns (idx_BTk, valid_BTk), plus (pos_BTP, valid_BTP) of the pool when
    ``n_pool_blocks`` > 0; then ``block`` must be a multiple of ``pool_block`` and
    ``query_pos_T`` gives each query's position (what it may read: positions <= its own).
    """
    if k <= 0:
        raise ValueError(f"k: must be > 0, got {k}")
    pooled = n_pool_blocks > 0
    if pooled and (pool_block <= 0 or block % pool_block):
        raise ValueError(f"block: {block} must be a multiple of pool_block {pool_block}")
    bv = bp = pv = pp = None
    for s in range(0, L, block):
        e = min(L, s + block)
        v_BTn = score_fn(s, e)
        B, T, n = v_BTn.shape
        bv, bp = running_top(bv, bp, v_BTn, s, k)
        if pooled:
            nb = -(-n // pool_block)
            padded = F.pad(v_BTn, (0, nb * pool_block - n), value=float("-inf"))
            m_BTnb = padded.view(B, T, nb, pool_block).amax(-1)
            pv, pp = running_top(pv, pp, m_BTnb, s // pool_block, n_pool_blocks)
    order = torch.sort(bv, dim=-1, descending=True, stable=True).indices  # positions ascending: ties earlier
    vals, idx = bv.gather(-1, order), bp.gather(-1, order)
    if not pooled:
        return idx, torch.isfinite(vals)
    offs = torch.arange(pool_block, device=pp.device)
    pos_BTP = (pp[..., None] * pool_block + offs).flatten(-2)   # block indices kept ascending
    valid_BTP = pos_BTP <= query_pos_T.view(1, -1, 1)
    return idx, torch.isfinite(vals), pos_BTP.clamp_max(L - 1), valid_BTP
