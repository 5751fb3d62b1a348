"""Selection stores: DeepSeek Sparse Attention with IndexShare, and hierarchical selection.

``dsa`` (DeepSeek-V3.2's DeepSeek Sparse Attention; GLM-5, arXiv 2602.15763): an MLA
cache (arXiv 2405.04434) read through a lightning indexer. The indexer has its own
small heads: index queries from the query latent (from x when there is no query
latent), one index key per token ``k = RoPE(LayerNorm(W_k x))`` (rotary on the first
``qk_rope_head_dim`` channels), and a token-dependent weight per head
``w = W_w x / sqrt(Hi)``. Query t scores position s as ``sum_h w[t,h] relu(q[t,h] . k[s] / sqrt(Ki))``
and the main attention reads only the top ``index_topk`` positions (all when fewer are visible).
IndexShare (GLM-5): layer i runs its own indexer iff
``max(i - index_share_offset + 1, 0) % index_share_freq == 0``; the others read
the selection of the most recent layer that ran one, and keep no index keys.
GLM-5.3: offset 3, freq 4 -> layers 0, 1, 2, 6, 10, ..., 74 (21 of 78).

``hierarchical`` (DeepSeek-V4.1-Flash, arXiv 2609.19969): in a group of layers the
first (``layer_index == 0``, the root) scores every position, reads its own top
``topk`` and picks a pool of candidate blocks (``pool_block`` consecutive positions,
the ``pool_size / pool_block`` blocks of highest block-max score); every
``refresh_every``-th layer after it scores only the pool's positions with its own
indexer and reads a fresh top ``topk`` inside the pool; the other layers reuse the
last selection. Choice: the kept entries are an MLA latent cache, read in the
absorbed form, where the latent is exactly one shared key/value head of width
kv_lora_rank + rope (V4 has a single shared KV head; the layer's cache is its own
here, V4.1's cross-layer cache sharing is a model-level matter).

Sharing mechanism. A ``SelectionShare`` carries, for the call in progress, the selection (and
pool) published by the group's latest indexer layer; every layer's state (``SelectionCache``)
of the group holds a reference to the same share (its ``LINKS``).
The config makes that state: ``cfg.new_state(groups)`` links it through ``groups``,
a scratch dict the layers of one model fill in order (a group starts at a dsa layer
that runs its indexer, or a hierarchical root, and runs to the next one of the same
kind); ``link_selection_states(configs)`` does it for a stack of store configs (None
for the other stores). A layer that runs an indexer given ``state=None`` makes a
share of its own; a reusing layer must be given one. Layers must run in order within
each call, and a reuser checks that the published selection is for the same tokens
(``seen`` and ``T``). The share is per-call scratch, not context state: it is not
counted in ``nbytes()``. A layer that reads another layer's latent cache (``cache_owner``)
gets a ``SelectionView`` (mla.py's ``LatentView`` plus its share and the owner's index keys).

The selection half is a ``Selector`` module (indexer + role): it needs a state with ``share``
and ``append_index``. Ties in the index score (frequent: the ReLU zeroes whole rows) go to the
earlier position, so chunked prefill reads what one full pass reads. Each call emits (``emit``,
inside ``observe()``) ``"selection"``, the positions read [B, T, k], and ``"reads"`` (``ReadLog``).
The top-k passes no gradient to the indexer: under ``training_signals()`` each layer with
one adds ``"indexer"``, KL(main attention averaged over heads, detached || softmax of the
index scores) over the kept entries (DeepSeek-V3.2, arXiv 2512.02556; refresh layers too);
``indexer_loss(x)`` is the same on a fresh context, dense or restricted to the selection.

Parameters: MLA's (see mla.py), plus for a layer with an indexer
``Qs*Hi*Ki + D*Ki + 2*Ki + D*Hi`` (Qs = q_lora_rank, or d_model without it).
State per token: kv_lora_rank + qk_rope_head_dim numbers, plus index_head_dim for
a layer that runs an indexer (dsa, or a root/refresh layer of hierarchical).

Legend: B batch, T new tokens, L kept, H heads, Hi index heads, Ki index head
width, k entries read per query, P pool positions, D d_model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from storelab.ops.indexer import (attention_target, index_scores, index_scores_at, indexer_distill_loss,
                                  restrict_to_selection, top_positions, top_positions_streamed)
from storelab.ops.rope import apply_rope
from storelab.state import append_rows
from storelab.stores.base import TOKEN, Card, Footprint, ParamCount, add_loss, check_input, emit, register
from storelab.stores.mla import MLA, LatentCache, LatentFields, LatentView, entry_bytes, latent_row_bytes
from storelab.stores.selection_scores import latent_selection_scores

# submodule names in transformers' DeepseekV32Indexer / GlmMoeDsaIndexer -> ours (LightningIndexer)
HF_INDEXER_NAMES = {"wq_b": "q_up", "wk": "k_proj", "k_norm": "k_norm", "weights_proj": "head_weights"}

SCORE_BUDGET = 1 << 18  # index logits held at once while scoring a long context (1 MiB in fp32)

SELECTION_CARD = dict(written_by="each token of the context", holds="an entry per token",
                      forgets="nothing; what the indexer passes over is missed")


# -- the sharing mechanism and the state ------------------------------------------------

@dataclass
class SelectionShare:
    """The latest selection of a group, for the call in progress (per-call scratch)."""

    seen: int = -1                        # tokens seen before the call it belongs to
    T: int = 0                            # tokens in that call
    pos_BTk: Tensor | None = None         # positions each query reads
    valid_BTk: Tensor | None = None       # False where fewer than k were readable
    pool_BTP: Tensor | None = None        # hierarchical: each query's candidate positions
    pool_valid_BTP: Tensor | None = None

    def publish(self, *, seen: int, T: int, pos_BTk: Tensor, valid_BTk: Tensor, pool_BTP: Tensor | None = None,
                pool_valid_BTP: Tensor | None = None) -> None:
        if pool_BTP is None and self.seen == seen and self.T == T:  # a refresh keeps the root's pool
            pool_BTP, pool_valid_BTP = self.pool_BTP, self.pool_valid_BTP
        self.seen, self.T = seen, T
        self.pos_BTk, self.valid_BTk = pos_BTk, valid_BTk
        self.pool_BTP, self.pool_valid_BTP = pool_BTP, pool_valid_BTP

    def _check(self, seen: int, T: int, what: str) -> None:
        if self.seen != seen or self.T != T or self.pos_BTk is None:
            raise ValueError(f"state: no {what} published for tokens {seen}..{seen + T - 1} in this group "
                             f"(have {self.seen}..{self.seen + self.T - 1}); run the group's indexer layer first")

    def take(self, seen: int, T: int) -> tuple[Tensor, Tensor]:
        self._check(seen, T, "selection")
        return self.pos_BTk, self.valid_BTk

    def take_pool(self, seen: int, T: int) -> tuple[Tensor, Tensor]:
        self._check(seen, T, "pool")
        if self.pool_BTP is None:
            raise ValueError("state: the group's selection has no pool; a refresh layer needs a hierarchical root")
        return self.pool_BTP, self.pool_valid_BTP

    def narrow(self, start: int) -> None:
        """Keep the published selection of the call's tokens from ``start`` on: the first decoder
        layer selected for every token, the decoder layers after it see only those."""
        if self.pos_BTk is None:
            return
        self.seen, self.T = self.seen + start, self.T - start
        # copies: the narrowed selection must not keep the encoder tokens' rows alive
        self.pos_BTk, self.valid_BTk = self.pos_BTk[:, start:].clone(), self.valid_BTk[:, start:].clone()
        if self.pool_BTP is not None:
            self.pool_BTP = self.pool_BTP[:, start:].clone()
            self.pool_valid_BTP = self.pool_valid_BTP[:, start:].clone()


@dataclass
class SelectionCache(LatentCache):
    """MLA's latent cache, the layer's index keys ``index_k`` [B, L, Ki] (None in a layer
    without an indexer), and a reference to the group's ``SelectionShare``."""

    index_k: Tensor | None = None
    share: SelectionShare | None = None

    LINKS = ("share",)

    def append_index(self, k_BTK: Tensor) -> Tensor:
        return append_rows(self, ("index_k",), (k_BTK,))[0]

    def imitation_keys(self, k_new_BTK: Tensor) -> Tensor:  # the kept keys, the call's own replaced by k_new
        return torch.cat([self.index_k[:, :self.index_k.shape[1] - k_new_BTK.shape[1]].detach(), k_new_BTK], dim=1)

    def narrow(self, start: int) -> None:
        if self.share is not None:
            self.share.narrow(start)


@dataclass
class SelectionView(LatentView):
    """A selection layer's view of another layer's latent cache (``cache_owner``): the owner's
    entries and index keys, read, never written, plus a reference to its own group's share."""

    share: SelectionShare | None = None

    LINKS = ("owner", "share")

    def append_index(self, k_BTK: Tensor) -> Tensor:
        if not isinstance(self.owner, SelectionCache) or self.owner.index_k is None:
            raise ValueError("cache_owner: the owner layer keeps no index keys for this reader's indexer")
        return self.owner.index_k

    def imitation_keys(self, k_new_BTK: Tensor) -> Tensor:  # the owner's keys: this reader's own go unused
        return self.append_index(k_new_BTK).detach()

    def narrow(self, start: int) -> None:
        if self.share is not None:
            self.share.narrow(start)


@dataclass
class ReadLog:
    """Per-query counts of one call: entries read and entries scored, [B, T] (emitted as ``"reads"``)."""

    read: Tensor
    scored: Tensor


def link_selection_states(configs: list) -> list[SelectionCache | None]:
    """Initial states for a stack of store configs: a linked ``SelectionCache`` per selection store, else None."""
    groups: dict = {}
    states: list[SelectionCache | None] = []
    for i, cfg in enumerate(configs):
        try:
            states.append(cfg.new_state(groups) if cfg.SHARES_SELECTION else None)
        except ValueError as e:
            raise ValueError(f"layers[{i}]: {e}") from None
    return states


# -- the indexer module -------------------------------------------------------------------

class LightningIndexer(nn.Module):
    """Index queries from the query source, one LayerNorm'd rotary index key per token, head weights."""

    def __init__(self, *, d_model: int, q_src_dim: int, n_heads: int, head_dim: int, rope_dim: int,
                 rope_theta: float, interleaved: bool):
        super().__init__()
        self.n_heads, self.head_dim = n_heads, head_dim
        self.rope_dim, self.theta, self.interleaved = rope_dim, rope_theta, interleaved
        self.q_up = nn.Linear(q_src_dim, n_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(d_model, head_dim, bias=False)
        self.k_norm = nn.LayerNorm(head_dim, eps=1e-6)
        self.head_weights = nn.Linear(d_model, n_heads, bias=False)
        self.scale = head_dim ** -0.5

    @staticmethod
    def n_params(*, d_model: int, q_src_dim: int, n_heads: int, head_dim: int) -> int:
        return q_src_dim * n_heads * head_dim + d_model * head_dim + 2 * head_dim + d_model * n_heads

    def _rope(self, x_BTHK: Tensor, positions_T: Tensor) -> Tensor:
        return apply_rope(x_BTHK, positions_T, rotary_dim=self.rope_dim, theta=self.theta,
                          interleaved=self.interleaved)

    def keys(self, x_BTD: Tensor, positions_T: Tensor) -> Tensor:
        k_BT1K = self.k_norm(self.k_proj(x_BTD))[:, :, None, :]
        return self._rope(k_BT1K, positions_T)[:, :, 0]

    def queries(self, x_BTD: Tensor, q_src_BTQ: Tensor, positions_T: Tensor) -> tuple[Tensor, Tensor]:
        B, T, _ = x_BTD.shape
        q_BTHK = self.q_up(q_src_BTQ).view(B, T, self.n_heads, self.head_dim)
        w_BTH = self.head_weights(x_BTD) * self.n_heads ** -0.5
        return self._rope(q_BTHK, positions_T), w_BTH


class Selector(nn.Module):
    """The selection half of a selection store, usable in front of any cache.

    ``role``: "index" (a dsa layer that runs its indexer), "root" (also picks the
    pool), "refresh" (scores the pool only) or "reuse" (no indexer).
    ``select(x_BTD, q_src_BTQ, positions_T, state)`` returns (pos_BTk, valid_BTk,
    scored_BT) for the T new tokens at ``positions_T``; ``state`` is any state with
    ``share`` (a SelectionShare) and ``append_index`` (as SelectionCache and SelectionView),
    and positions index the main cache, which holds positions_T[-1] + 1 entries.
    """

    def __init__(self, *, role: str, k: int, indexer: LightningIndexer | None, pool_size: int = 0,
                 pool_block: int = 1):
        super().__init__()
        if (indexer is None) != (role == "reuse"):
            raise ValueError(f"role: {role!r} {'needs' if indexer is None else 'takes no'} indexer")
        self.role, self.k, self.indexer = role, k, indexer
        self.pool_block, self.pool_blocks = pool_block, pool_size // pool_block

    def select(self, x_BTD: Tensor, q_src_BTQ: Tensor, positions_T: Tensor, state) -> tuple[Tensor, Tensor, Tensor]:
        B, T, _ = x_BTD.shape
        seen, L = int(positions_T[0]), int(positions_T[-1]) + 1
        share = state.share
        if self.indexer is None:
            pos_BTk, valid_BTk = share.take(seen, T)
            return pos_BTk, valid_BTk, torch.zeros(B, T, dtype=torch.long, device=x_BTD.device)
        k_idx_BLK = state.append_index(self.indexer.keys(x_BTD, positions_T))
        q_BTHK, w_BTH = self.indexer.queries(x_BTD, q_src_BTQ, positions_T)
        if self.role == "refresh":
            pool_BTP, pool_valid_BTP = share.take_pool(seen, T)
            with torch.no_grad():  # the top-k passes no gradient: autograd keeps none of the scores
                j_BTk, valid_BTk = top_positions(index_scores_at(q_BTHK, k_idx_BLK, w_BTH, pool_BTP, pool_valid_BTP,
                                                                 scale=self.indexer.scale), self.k)
            pos_BTk = pool_BTP.gather(-1, j_BTk)
            share.publish(seen=seen, T=T, pos_BTk=pos_BTk, valid_BTk=valid_BTk)
            return pos_BTk, valid_BTk, pool_valid_BTP.sum(-1)
        scale, H = self.indexer.scale, q_BTHK.shape[2]

        def score_fn(s: int, e: int) -> Tensor:  # positions s..e-1; the last T are the queries' own
            mask = None
            if e > L - T:  # the block reaches the queries' own positions: position <= query position
                mask = torch.arange(s, e, device=x_BTD.device)[None, :] <= positions_T[:, None]
            return index_scores(q_BTHK, k_idx_BLK[:, s:e], w_BTH, scale=scale, mask_TL=mask)

        unit = self.pool_block if self.role == "root" else 1  # blocks of positions: ~SCORE_BUDGET logits held
        block = max(unit, SCORE_BUDGET // max(1, B * T * H) // unit * unit)
        pool = {}
        with torch.no_grad():  # as above: none of the T x L scores kept
            if self.role == "root":
                pos_BTk, valid_BTk, pool_BTP, pool_valid_BTP = top_positions_streamed(
                    score_fn, L, self.k, block=block, pool_block=self.pool_block, n_pool_blocks=self.pool_blocks,
                    query_pos_T=positions_T)
                pool = dict(pool_BTP=pool_BTP, pool_valid_BTP=pool_valid_BTP)
            else:
                pos_BTk, valid_BTk = top_positions_streamed(score_fn, L, self.k, block=block)
        share.publish(seen=seen, T=T, pos_BTk=pos_BTk, valid_BTk=valid_BTk, **pool)
        return pos_BTk, valid_BTk, (positions_T + 1).expand(B, T)


# -- configs --------------------------------------------------------------------------------

@dataclass(kw_only=True)
class _IndexFields(LatentFields):
    """MLA's fields plus the lightning indexer's, shared by dsa and hierarchical."""

    index_n_heads: int
    index_head_dim: int
    index_rope_interleaved: bool = False  # DeepSeek-V3.2: rotate-half; GLM-5: interleaved
    layer_index: int = 0

    def __post_init__(self):
        super().__post_init__()
        self.check_positive("index_n_heads", "index_head_dim")
        self.check(self.layer_index >= 0, "layer_index", f"must be >= 0, got {self.layer_index}")
        self.check(not self.use_rope or self.index_head_dim >= self.qk_rope_head_dim, "index_head_dim",
                   f"must hold the {self.qk_rope_head_dim} rotary channels, got {self.index_head_dim}")

    READER_UNUSED = ("mla.kv_down", "mla.kv_norm",  # a reader takes the owner's latent and index keys
                     "selector.indexer.k_proj", "selector.indexer.k_norm")

    def index_bytes(self, L: int, dtype: str) -> int:
        return math.ceil(L * self.index_head_dim * entry_bytes(dtype))

    def index_key_bytes(self, fmt: str) -> float:
        return latent_row_bytes(self.index_head_dim, 0, fmt) if self.runs_indexer else 0.0

    def _footprint(self, L: int, dtype: str, *, read: int, scored: int, note: str) -> Footprint:
        has_indexer = self.runs_indexer
        state = self.cache_bytes(L, dtype) + (self.index_bytes(L, dtype) if has_indexer else 0)
        index_flops = 2 * scored * self.index_n_heads * (self.index_head_dim + 1)
        return Footprint(context=L, kept=L, read=read, scored=scored, state_bytes=state,
                         read_flops=self.mla_read_flops(read, L, absorbed=True) + index_flops, note=note)

    def new_state(self, groups: dict, *, owner: LatentCache | None = None) -> SelectionCache | SelectionView:
        """The layer's empty state in a new model cache, holding its group's share: a layer that
        starts a group puts a new one in ``groups`` (under its kind), the others take the latest.
        With ``owner`` (the layer reads that layer's latent cache) a view of the owner's state."""
        if self.starts_group:
            groups[self.KIND] = SelectionShare()
        share = groups.get(self.KIND)
        if share is None:
            raise ValueError(f"a {self.KIND} layer that reuses a selection has no earlier indexer layer")
        return SelectionCache(share=share) if owner is None else SelectionView(share=share, owner=owner)

    def indexer_shape(self) -> dict[str, int]:
        return dict(d_model=self.d_model, q_src_dim=self.q_lora_rank or self.d_model, n_heads=self.index_n_heads,
                    head_dim=self.index_head_dim)

    def num_params(self) -> ParamCount:
        n = self.mla_params()
        if self.runs_indexer:
            n += LightningIndexer.n_params(**self.indexer_shape())
        return ParamCount(n, n)


@register("dsa")
@dataclass(kw_only=True)
class DSAConfig(_IndexFields):
    index_topk: int
    index_share_freq: int = 1
    index_share_offset: int = 1

    SLOTS, FAMILY, CARD_ORDER, CACHE_SHARING, SHARES_SELECTION, SELECTS = (TOKEN,), "selected", 70, "latent", True, True
    CARD = Card(name="Selected entries (DeepSeek Sparse Attention, IndexShare)", **SELECTION_CARD,
                reading_costs="a scoring pass over all L, then 512 to 2,048 entries; with IndexShare one "
                              "scoring pass serves a group of layers",
                source="arXiv 2602.15763 (GLM-5: DSA, IndexShare); arXiv 2405.04434 (MLA)")

    def __post_init__(self):
        super().__post_init__()
        self.check_positive("index_topk", "index_share_freq")
        self.check(self.index_share_offset >= 0, "index_share_offset", f"must be >= 0, got {self.index_share_offset}")

    @property
    def runs_indexer(self) -> bool:
        """IndexShare: max(i - offset + 1, 0) % freq == 0."""
        return max(self.layer_index - self.index_share_offset + 1, 0) % self.index_share_freq == 0

    @property
    def starts_group(self) -> bool:
        return self.runs_indexer

    def build(self) -> nn.Module:
        return SelectionAttention(self)

    def footprint(self, context: int, *, dtype: str = "bf16") -> Footprint:
        L = context
        role = "indexer" if self.runs_indexer else "reuses the group's selection"
        return self._footprint(L, dtype, read=min(L, self.index_topk), scored=L if self.runs_indexer else 0,
                               note=f"MLA cache + top {self.index_topk}; {role}")


@register("hierarchical")
@dataclass(kw_only=True)
class HierarchicalConfig(_IndexFields):
    topk: int = 512
    pool_size: int = 16384
    pool_block: int = 8
    refresh_every: int = 4

    SLOTS, FAMILY, CARD_ORDER, CACHE_SHARING, SHARES_SELECTION, SELECTS = (TOKEN,), "selected", 80, "latent", True, True
    CARD = Card(name="Selected entries, two levels (DeepSeek-V4.1-Flash hierarchical indexer)", **SELECTION_CARD,
                reading_costs="a scoring pass over all L in the group's first layer and over a pool of up to "
                              "16,384 candidates in every fourth, then 512 entries",
                source="arXiv 2609.19969 (DeepSeek-V4.1-Flash); arXiv 2602.15763 (DSA)")

    def __post_init__(self):
        super().__post_init__()
        self.check_positive("topk", "pool_size", "pool_block", "refresh_every")
        self.check(self.pool_size % self.pool_block == 0, "pool_size",
                   f"must be a whole number of blocks of {self.pool_block}, got {self.pool_size}")
        self.check(self.pool_size >= self.topk, "pool_size", f"must be >= topk ({self.topk}), got {self.pool_size}")

    @property
    def role(self) -> str:
        """'root' (first layer of the group), 'refresh' (every refresh_every-th after it) or 'reuse'."""
        if self.layer_index == 0:
            return "root"
        return "refresh" if self.layer_index % self.refresh_every == 0 else "reuse"

    @property
    def runs_indexer(self) -> bool:
        return self.role != "reuse"

    @property
    def starts_group(self) -> bool:
        return self.role == "root"

    def build(self) -> nn.Module:
        return SelectionAttention(self)

    def footprint(self, context: int, *, dtype: str = "bf16") -> Footprint:
        L = context
        scored = {"root": L, "refresh": min(L, self.pool_size), "reuse": 0}[self.role]
        return self._footprint(L, dtype, read=min(L, self.topk), scored=scored,
                               note=f"MLA cache; {self.role} (top {self.topk} of a pool of {self.pool_size})")


# -- the module -----------------------------------------------------------------------------

class SelectionAttention(nn.Module):
    """MLA whose queries each read only a selection of the cache (dsa or hierarchical)."""
    selection_scores = latent_selection_scores  # the probe's protocol (SELECTS)

    def __init__(self, cfg: DSAConfig | HierarchicalConfig):
        super().__init__()
        self.cfg = cfg
        self.mla = MLA(cfg, absorbed=True)
        indexer = None
        if cfg.runs_indexer:
            indexer = LightningIndexer(**cfg.indexer_shape(), rope_dim=cfg.qk_rope_head_dim if cfg.use_rope else 0,
                                       rope_theta=cfg.rope_theta, interleaved=cfg.index_rope_interleaved)
        if isinstance(cfg, HierarchicalConfig):
            self.selector = Selector(role=cfg.role, k=cfg.topk, indexer=indexer, pool_size=cfg.pool_size,
                                     pool_block=cfg.pool_block)
        else:
            self.selector = Selector(role="index" if cfg.runs_indexer else "reuse", k=cfg.index_topk, indexer=indexer)

    @property
    def indexer(self) -> LightningIndexer | None:
        return self.selector.indexer

    def forward(self, x_BTD: Tensor, state: SelectionCache | None = None, *, token_ids=None):
        check_input(x_BTD, self.cfg.d_model)
        state = SelectionCache() if state is None else state
        if state.share is None:
            if self.selector.role in ("reuse", "refresh"):
                raise ValueError("state: a layer that reuses its group's selection needs a SelectionCache holding "
                                 "the group's SelectionShare (the config's new_state, or link_selection_states)")
            state.share = SelectionShare()
        T = x_BTD.shape[1]
        positions_T = torch.arange(state.seen, state.seen + T, device=x_BTD.device)
        p = self.mla.project(x_BTD, positions_T)
        latent_BLC, k_rope_BLR = state.append(p.latent_BTC, p.k_rope_BTR)
        pos_BTk, valid_BTk, scored_BT = self.selector.select(x_BTD, p.q_src_BTQ, positions_T, state)
        state.seen += T
        if self.indexer is not None:  # the top-k passes no gradient: the indexer imitates the attention
            add_loss(self, "indexer", lambda: self._imitation(x_BTD, p, latent_BLC, k_rope_BLR, positions_T,
                                                              state.imitation_keys))
        o_BTHV = self.mla.read_selected(p, latent_BLC, k_rope_BLR, pos_BTk, valid_BTk)
        emit(self, "selection", pos_BTk)
        emit(self, "reads", lambda: ReadLog(read=valid_BTk.sum(-1), scored=scored_BT))
        return self.mla.finish(o_BTHV, x_BTD), state

    def indexer_loss(self, x_BTD: Tensor, *, sparse: bool = False) -> Tensor:
        """The indexer's imitation loss on a fresh context x (``forward`` adds it, dense, as ``"indexer"``).
        ``sparse``: both distributions restricted to the indexer's own selection (the sparse stage)."""
        check_input(x_BTD, self.cfg.d_model)
        if self.indexer is None:
            raise ValueError("layer_index: this layer reuses its group's selection and has no indexer to train")
        positions_T = torch.arange(x_BTD.shape[1], device=x_BTD.device)
        with torch.no_grad():
            p = self.mla.project(x_BTD, positions_T)
        return self._imitation(x_BTD, p, p.latent_BTC, p.k_rope_BTR, positions_T, lambda k_BTK: k_BTK, sparse=sparse)

    def _imitation(self, x_BTD: Tensor, p, latent_BLC: Tensor, k_rope_BLR: Tensor, positions_T: Tensor, keys_fn,
                   *, sparse: bool = False) -> Tensor:
        """KL(main attention over the L kept entries, head mean, detached || softmax(index scores)); the
        indexer reads x detached, so only it learns. ``keys_fn(k_new_BTK)``: the L keys the selection scores."""
        L = latent_BLC.shape[1]
        mask_TL = torch.arange(L, device=x_BTD.device)[None, :] <= positions_T[:, None]
        with torch.no_grad():
            target_BTL = attention_target(self.mla.absorbed_query(p), torch.cat([latent_BLC, k_rope_BLR], dim=-1),
                                          scale=self.cfg.scale, mask_TL=mask_TL)
        xd = x_BTD.detach()
        q_BTHK, w_BTH = self.indexer.queries(xd, p.q_src_BTQ.detach(), positions_T)
        k_BLK = keys_fn(self.indexer.keys(xd, positions_T))
        scores_BTL = index_scores(q_BTHK, k_BLK, w_BTH, scale=self.indexer.scale, mask_TL=mask_TL)
        if sparse:
            scores_BTL, target_BTL = restrict_to_selection(scores_BTL, target_BTL, self.selector.k)
        return indexer_distill_loss(scores_BTL, target_BTL)
