"""What a selecting layer's queries weigh and select: the protocol behind ``storelab probe selection``.

A store whose config says ``SELECTS`` (dsa, hierarchical, msa, csa) has a method
``selection_scores(x_BQD, state, *, owner=None) -> SelectionScores``: for the layer's input at the
last Q positions of the context its ``state`` holds (the state after the forward: every entry kept),
it returns, over the entries the layer selects among (N: positions for dsa / hierarchical, blocks
for msa, window slots then pooled entries for csa), per selection group G (msa: one per key/value
head; the others: 1):

* ``exact_BGQN``  - the main attention's softmax weight on each entry (the layer's own scores over
  every entry, as if it could read them all; its sinks in the denominator; the group's heads averaged;
  an msa block's weight is the sum over its positions);
* ``index_BGQN``  - the indexer's score of each entry (-inf: not a candidate); for a layer that reuses
  its group's selection (IndexShare, a hierarchical reuse layer), the ``owner``'s scores;
* ``candidate_BGQN`` - the readable entries that are not forced (what recall is measured over);
* ``within_BGQN`` - None, or the entries the indexer may choose from (a hierarchical refresh layer: its
  root's pool; the exact top-k is still taken over every candidate, so the pool's misses count);
* ``forced_BGQN`` - entries read whatever the indexer says (msa's local and first blocks, csa's window);
* ``k``           - entries the indexer picks per query (msa: the slots left after the forced blocks);
* ``own_indexer`` - False when ``index_BGQN`` is the owner's (the layer keeps no indexer).

``owner`` is the ``SelectionScores`` of the latest earlier layer of the same kind (the group's latest
selection, as ``SelectionShare`` carries it in the forward). ``selected(scores, k)`` is the read mask:
the forced entries and the indexer's top k (ties to the earlier entry, as the stores' top-k), so at
``k = scores.k`` it is what the forward read. Queries go ``QUERY_BUDGET`` logits at a time.

Legend: B batch, Q queries, N entries, L positions, G selection groups, H heads, D d_model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from storelab.ops.compress import index_scores as csa_index_scores, readable_entries
from storelab.ops.indexer import block_pool, index_scores, selection_mask, top_positions
from storelab.ops.msa import block_scores
from storelab.ops.norm import rms_norm

QUERY_BUDGET = 1 << 22  # exact-attention logits held at once (16 MiB in fp32)


@dataclass
class SelectionScores:
    exact_BGQN: Tensor
    index_BGQN: Tensor
    candidate_BGQN: Tensor
    forced_BGQN: Tensor
    k: int
    own_indexer: bool = True
    within_BGQN: Tensor | None = None   # hierarchical refresh: the indexer picks inside its root's pool
    pool_BGQN: Tensor | None = None     # hierarchical: the root's pool of candidates, carried by its group

    def last(self, Q: int) -> "SelectionScores":
        """The last Q queries (an encoder-decoder's decoder layers see only the prompt's last tokens)."""
        cut = lambda t: None if t is None else t[:, :, -Q:]  # noqa: E731
        return SelectionScores(cut(self.exact_BGQN), cut(self.index_BGQN), cut(self.candidate_BGQN),
                               cut(self.forced_BGQN), self.k, self.own_indexer, cut(self.within_BGQN),
                               cut(self.pool_BGQN))


def selected(s: SelectionScores, k: int) -> Tensor:
    """Bool [B, G, Q, N]: the forced entries and the top ``k`` candidates by the indexer's score."""
    B, G, Q, N = s.index_BGQN.shape
    pick_from = s.candidate_BGQN if s.within_BGQN is None else s.candidate_BGQN & s.within_BGQN
    scores = s.index_BGQN.masked_fill(~pick_from, float("-inf")).reshape(B * G, Q, N)
    idx, valid = top_positions(scores, k)
    return selection_mask(idx, valid, N).view(B, G, Q, N) | s.forced_BGQN


def _softmax_with_sinks(logits_BHQN: Tensor, sinks_H: Tensor | None) -> Tensor:
    """Softmax over the entries, the sink logit (one per head) in the denominator only."""
    if sinks_H is None:
        return torch.softmax(logits_BHQN, dim=-1)
    sink_BHQ1 = sinks_H.float().view(1, -1, 1, 1).expand(*logits_BHQN.shape[:3], 1)
    return torch.softmax(torch.cat([logits_BHQN, sink_BHQ1], dim=-1), dim=-1)[..., :-1]


def _in_query_chunks(fn, Q: int, per_query: int) -> Tensor:
    """``fn(a, b)`` -> [B, H, b - a, N] for queries a..b-1, ``QUERY_BUDGET`` numbers at a time, on axis 2."""
    step = max(1, QUERY_BUDGET // max(1, per_query))
    return torch.cat([fn(a, min(Q, a + step)) for a in range(0, Q, step)], dim=2)


# -- dsa and hierarchical (SelectionAttention) ------------------------------------------------

@torch.no_grad()
def latent_selection_scores(store, x_BQD: Tensor, state, *, owner: SelectionScores | None = None) -> SelectionScores:
    """dsa / hierarchical: the absorbed MLA attention over every kept position, and the lightning indexer."""
    c = store.cfg
    B, Q, _ = x_BQD.shape
    keys_BLX = state.joined()
    L = keys_BLX.shape[1]
    pos_Q = torch.arange(L - Q, L, device=x_BQD.device)
    p = store.mla.project(x_BQD, pos_Q)
    q_BQHX = store.mla.absorbed_query(p).float()
    readable_QL = torch.arange(L, device=x_BQD.device)[None, :] <= pos_Q[:, None]

    def exact(a: int, b: int) -> Tensor:
        logits = torch.einsum("bqhx,blx->bhql", q_BQHX[:, a:b], keys_BLX.float()) * c.scale
        return torch.softmax(logits.masked_fill(~readable_QL[a:b], float("-inf")), dim=-1).mean(1, keepdim=True)
    exact_B1QL = _in_query_chunks(exact, Q, B * c.n_heads * L)
    candidate = readable_QL.expand(B, 1, Q, L)
    role, k, pool = store.selector.role, store.selector.k, None
    owner = None if owner is None else owner.last(Q)
    if role == "reuse":
        if owner is None:
            raise ValueError("owner: a layer that reuses its group's selection needs the owner's SelectionScores")
        return SelectionScores(exact_B1QL, owner.index_BGQN, candidate, owner.forced_BGQN, k, own_indexer=False,
                               within_BGQN=owner.within_BGQN, pool_BGQN=owner.pool_BGQN)
    ix, within = store.indexer, None
    q_BQHK, w_BQH = ix.queries(x_BQD, p.q_src_BTQ, pos_Q)
    k_BLK = state.imitation_keys(q_BQHK.new_zeros(B, 0, ix.head_dim))  # every kept index key (a view's: owner's)
    index_BQL = index_scores(q_BQHK, k_BLK, w_BQH, scale=ix.scale, mask_TL=readable_QL)
    if role == "root":
        pos_BQP, valid_BQP = block_pool(index_BQL, block=store.selector.pool_block, n_blocks=store.selector.pool_blocks)
        pool = torch.zeros(B, Q, L + 1, dtype=torch.bool, device=x_BQD.device)
        pool.scatter_(-1, torch.where(valid_BQP, pos_BQP, L), True)
        pool = pool[:, None, :, :L]
    elif role == "refresh":
        if owner is None or owner.pool_BGQN is None:
            raise ValueError("owner: a hierarchical refresh layer needs its group's scores, with the root's pool")
        pool = within = owner.pool_BGQN
    return SelectionScores(exact_B1QL, index_BQL[:, None], candidate, torch.zeros_like(candidate), k,
                           within_BGQN=within, pool_BGQN=pool)


# -- msa (BlockSparseAttention) ------------------------------------------------------------------

@torch.no_grad()
def block_selection_scores(store, x_BQD: Tensor, state, *, owner: SelectionScores | None = None) -> SelectionScores:
    """msa: each group's attention weight per block, the block-max index scores, the forced blocks."""
    c = store.cfg
    B, Q, _ = x_BQD.shape
    k_BLGK = state.k
    L, G, bs = k_BLGK.shape[1], c.n_kv_heads, c.block_size
    pos_Q = torch.arange(L - Q, L, device=x_BQD.device)
    q_BQHK = store.project(x_BQD, pos_Q)[0].float()
    k_BLHK = k_BLGK.float().repeat_interleave(c.n_heads // G, dim=2)
    N = -(-L // bs)
    future_QL = torch.arange(L, device=x_BQD.device)[None, :] > pos_Q[:, None]

    def exact(a: int, b: int) -> Tensor:
        logits = torch.einsum("bqhk,blhk->bhql", q_BQHK[:, a:b], k_BLHK) * c.scale
        w = _softmax_with_sinks(logits.masked_fill(future_QL[a:b], float("-inf")), store.sinks)
        w = torch.nn.functional.pad(w, (0, N * bs - L)).view(B, G, -1, b - a, N, bs)
        return w.sum(-1).mean(2)                     # per block, the group's heads averaged
    exact_BGQN = _in_query_chunks(exact, Q, B * c.n_heads * L)
    iq_BQGI, _ = store.index(x_BQD, pos_Q)
    index_BGQN = block_scores(iq_BQGI, state.idx_k, positions_T=pos_Q, block_size=bs)
    blk_N, own_Q = torch.arange(N, device=x_BQD.device), pos_Q // bs
    forced_QN = (blk_N[None, :] <= own_Q[:, None]) & (blk_N[None, :] > own_Q[:, None] - c.local_blocks)
    if c.include_first_block:
        forced_QN = forced_QN | (blk_N[None, :] == 0)
    candidate_QN = (blk_N[None, :] <= own_Q[:, None]) & ~forced_QN
    k = c.top_blocks - c.local_blocks - int(c.include_first_block)
    return SelectionScores(exact_BGQN, index_BGQN, candidate_QN.expand(B, G, Q, N), forced_QN.expand(B, G, Q, N), k)


# -- csa (CompressedAttention with an indexer) ------------------------------------------------------

@torch.no_grad()
def compressed_selection_scores(store, x_BQD: Tensor, state, *, owner: SelectionScores | None = None) \
        -> SelectionScores:
    """csa: one softmax over the query's window entries and the pooled entries (sinks in it); the indexer's
    scores of the pooled entries. ``state``: the layer's cache, or the owner's for a reader (``shared=``)."""
    c = store.cfg
    B, Q, _ = x_BQD.shape
    H, C, W, N = c.n_heads, c.head_dim, c.window, state.entries
    seen = state.seen
    pos_Q = torch.arange(seen - Q, seen, device=x_BQD.device)
    q_res = store.q_a_norm(store.q_a(x_BQD))
    q_BQHK = store._rope(rms_norm(store.q_b(q_res).view(B, Q, H, C), None, c.eps), pos_Q).float()
    # the window's rows: read_window holds the last call's tokens (and the window before them)
    first_row = seen - state.read_window.shape[1]
    rows_QW = pos_Q[:, None] - first_row + torch.arange(1 - W, 1, device=x_BQD.device)
    win_ok_QW = (rows_QW >= 0) & (pos_Q[:, None] + torch.arange(1 - W, 1, device=x_BQD.device) >= 0)
    win_BQWC = store._decode(state.read_window[:, rows_QW.clamp_min(0)], C, c.rope_dim, torch.float32)
    pooled_BNC = store._decode(state.pooled[:, :N], C, c.rope_dim, torch.float32)
    readable_QN = readable_entries(pos_Q, N, c.stride)

    def exact(a: int, b: int) -> Tensor:
        lw = torch.einsum("bqhc,bqwc->bhqw", q_BQHK[:, a:b], win_BQWC[:, a:b]).masked_fill(~win_ok_QW[a:b], -torch.inf)
        lp = torch.einsum("bqhc,bnc->bhqn", q_BQHK[:, a:b], pooled_BNC).masked_fill(~readable_QN[a:b], -torch.inf)
        return _softmax_with_sinks(torch.cat([lw, lp], dim=-1) * C ** -0.5, store.sinks).mean(1, keepdim=True)
    exact_B1QE = _in_query_chunks(exact, Q, B * H * (W + N))
    IH, IC = c.index_heads, c.index_head_dim
    iq_BQHK = store._rope(store.index_q(q_res).view(B, Q, IH, IC), pos_Q)
    w_BQH = store.index_weights(x_BQD) * IH ** -0.5
    keys_BNK = store._decode(state.index_keys[:, :N], IC, 0, torch.float32)
    idx_BQN = csa_index_scores(iq_BQHK, keys_BNK, w_BQH, scale=IC ** -0.5).masked_fill(~readable_QN, -torch.inf)
    no_win = torch.zeros(B, Q, W, dtype=torch.bool, device=x_BQD.device)
    index_B1QE = torch.cat([torch.full((B, Q, W), -torch.inf, device=x_BQD.device), idx_BQN], dim=-1)[:, None]
    candidate = torch.cat([no_win, readable_QN.expand(B, Q, N)], dim=-1)[:, None]
    forced = torch.cat([win_ok_QW.expand(B, Q, W), torch.zeros_like(readable_QN).expand(B, Q, N)], dim=-1)[:, None]
    return SelectionScores(exact_B1QE, index_B1QE, candidate, forced, c.index_topk)
