"""Block selection of MiniMax sparse attention (MSA, arXiv 2606.13392) as pure functions.

An index branch scores every kept position for every query: one index query head per group of
heads that share a key/value head (G of them) against one shared index key head,
``s[g, t, l] = q_idx[t, g] . k_idx[l]`` (no scale, no activation; future positions -inf). Scores are
max-pooled over blocks of ``block_size`` consecutive positions (block-max pooling), the query's own
block and the ``local_blocks - 1`` before it are forced in (+inf), optionally the first block too
(the attention sink), and each group reads the positions of its ``top_blocks`` best blocks, causally.
Blocks are anchored at absolute positions: block b holds positions b*block_size .. (b+1)*block_size-1.

    block_scores(q_idx_BTGI, k_idx_BLI, *, positions_T, block_size)        -> [B, G, T, N] fp32
    select_blocks(scores_BGTN, *, positions_T, block_size, top_blocks,
                  local_blocks=1, include_first_block=False)                  -> [B, G, T, k] block ids, -1 = none
    block_mask(blocks_BGTk, *, positions_T, length, block_size)              -> [B, G, T, L] bool (True = read)

Keys are the whole history, entry l at absolute position l; ``positions_T`` are the queries'
absolute positions. The result for a query does not depend on how many later keys exist, so a
chunked prefill selects exactly what one full pass selects. The selection contract matches
transformers' ``MiniMaxM3VLIndexer`` (top min(top_blocks, N) slots, local blocks inside the budget,
-1 for slots that would fall on a future block).

Shape legend: B batch, T queries, L keys, G key/value groups (= index query heads), I index width,
N blocks, k selected slots.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["block_scores", "select_blocks", "block_mask"]


def block_scores(q_idx_BTGI: Tensor, k_idx_BLI: Tensor, *, positions_T: Tensor, block_size: int) -> Tensor:
    """Block-max pooled index scores, [B, G, T, ceil(L / block_size)]; -inf for wholly future blocks."""
    B, T, G, _ = q_idx_BTGI.shape
    L = k_idx_BLI.shape[1]
    s_BGTL = torch.einsum("btgi,bli->bgtl", q_idx_BTGI.float(), k_idx_BLI.float())
    future_TL = torch.arange(L, device=s_BGTL.device)[None, :] > positions_T[:, None]
    s_BGTL = s_BGTL.masked_fill(future_TL, float("-inf"))
    N = -(-L // block_size)
    pad = N * block_size - L
    if pad:
        s_BGTL = torch.nn.functional.pad(s_BGTL, (0, pad), value=float("-inf"))
    return s_BGTL.view(B, G, T, N, block_size).amax(-1)


def select_blocks(scores_BGTN: Tensor, *, positions_T: Tensor, block_size: int, top_blocks: int,
                  local_blocks: int = 1, include_first_block: bool = False) -> Tensor:
    """Each query's top blocks per group, forced blocks first; -1 pads slots with no readable block."""
    B, G, T, N = scores_BGTN.shape
    s = scores_BGTN.clone()
    q_block_T = positions_T // block_size
    forced = [(q_block_T - j).clamp(min=0) for j in range(local_blocks)]
    if include_first_block:
        forced.append(torch.zeros_like(q_block_T))
    if forced:
        idx_TF = torch.stack(forced, dim=-1)                                   # T F
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
