"""MiniMax sparse attention (MSA, arXiv 2606.13392): keep every entry, read a few blocks of them.

The attention is MiniMax-M3's GQA attention (per-head QK RMSNorm, RoPE on the first
``partial_rotary * head_dim`` channels; MiniMax-M3: 64 of 128), but each group of query heads that
shares a key/value head reads only the positions of its selected blocks (``storelab.ops.msa``):

* an index branch -- one index query head per group (``n_kv_heads`` of them) and one index key
  head shared by all, width ``index_head_dim``, each with its own RMSNorm (when ``qk_norm``) and
  the same RoPE -- scores every kept position: ``s = q_idx . k_idx``;
* block score = the max of ``s`` over the block's ``block_size`` positions (block-max pooling);
* the group reads its ``top_blocks`` best blocks, causally; the query's own block and the
  ``local_blocks - 1`` before it always count among them, and with ``include_first_block`` so
  does block 0 (the attention sink MiniMax's indexers learn to pick). Forced blocks use slots of
  the budget, so a query never reads more than ``top_blocks * block_size`` positions.

Hard top-k: no gradient reaches the index branch through the selection. MiniMax trains it by
imitating the main attention: under ``training_signals()`` each call adds ``"indexer"``,
KL(the attention's weight per block, each group's heads averaged, detached || softmax of the block
scores), the index branch reading x detached, so the loss trains it alone. The selection equals transformers'
``MiniMaxM3VLIndexer`` and the masked attention its eager path with ``build_block_mask`` (among
exactly equal block scores the earlier block wins; ``topk`` leaves that order unspecified).

Update rule: cache <- cache ++ [(k_t, v_t, k_idx_t)]; y_t = softmax over the selected positions.
Parameters: those of ``attention`` (see storelab.stores.attention) + index projections
  D*G*I + D*I (+ 2I for the index norms when qk_norm).
State per token: G*(K + V) + I numbers (keys, values and the index key).
Footprint: keeps L, scores L (the indexer's work grows with the context), reads at most
min(L, top_blocks * block_size) per group. MiniMax-M3: blocks of 128, 16 of them = 2,048 positions.

Each call emits (``storelab.stores.observe``) ``"blocks"`` ([B, G, T, k] block ids, -1 = none) and
``"read_counts"`` ([B, G, T], positions each group of each query read) for inspection.
Nothing of size [T, L] is built: the index scores are made a run of blocks at a time and
merged into a running top of blocks (``select_blocks_streamed``), and each query gathers only its
selected blocks' keys and values (``attend_blocks``). A long chunk is taken ``query_block`` (1024)
queries at a time, each slice scoring the keys up to its last query; no selection changes.
With ``kernel="reference"`` (taken once at construction) each slice uses the reference forms
instead: the whole [B, G, T, L] index scores and block mask, and ``attend_reference`` over them.

Shape legend: B batch, T new tokens, L kept, H query heads, G key/value groups, K key width,
V value width, I index width, D model width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from storelab.ops.attention import attend_reference
from storelab.ops.indexer import indexer_distill_loss
from storelab.ops.msa import (attend_blocks, block_attention_target, block_mask, block_scores, select_blocks,
                             select_blocks_streamed)
from storelab.ops.norm import RMSNorm
from storelab.ops.rope import apply_rope
from storelab.state import KVCache, append_rows
from storelab.stores.attention import Attention, AttentionConfig
from storelab.stores.base import DTYPE_BYTES, Card, Footprint, ParamCount, add_loss, check_input, emit, register
from storelab.stores.selection_scores import block_selection_scores

__all__ = ["MsaConfig", "MsaCache", "BlockSparseAttention"]


@dataclass
class MsaCache(KVCache):
    """The full KV cache plus each position's index key, ``idx_k`` [B, L, I]."""

    idx_k: Tensor | None = None

    def append_index(self, idx_k_BTI: Tensor) -> Tensor:
        """Write this call's index keys; return all kept (a view of the growing buffer, no copy)."""
        return append_rows(self, ("idx_k",), (idx_k_BTI,))[0]


@register("msa")
@dataclass(kw_only=True)
class MsaConfig(AttentionConfig):
    qk_norm: bool = True                 # MiniMax-M3 normalises each q/k head (and the index heads)
    block_size: int = 128
    top_blocks: int = 16
    local_blocks: int = 1                # the query's own block and the ones just before it
    include_first_block: bool = False    # always read block 0 (the attention sink)
    index_head_dim: int = 128

    FAMILY, CARD_ORDER, MIX_LABEL, SELECTS = "selected", 90, "", True
    CARD = Card(
        name="Selected entries, blocks (MiniMax MSA)",
        written_by="each token of the context",
        holds="an entry per token",
        reading_costs="a scoring pass over all L, then top_blocks blocks per group of heads "
                      "(16 x 128 = 2,048 positions in MiniMax-M3)",
        forgets="nothing; what the indexer passes over is missed",
        source="arXiv 2606.13392 (MSA)",
    )

    def __post_init__(self):
        super().__post_init__()
        self.check_positive("block_size", "top_blocks", "index_head_dim")
        self.check(self.local_blocks >= 0, "local_blocks", f"must be >= 0, got {self.local_blocks}")
        forced = self.local_blocks + int(self.include_first_block)
        self.check(self.top_blocks >= forced, "top_blocks",
                   f"{self.top_blocks} slots cannot hold the {forced} forced blocks (local + first)")
        self.check(self.rotary_dim <= self.index_head_dim, "index_head_dim",
                   f"must be >= the rotary width {self.rotary_dim}")

    @property
    def budget(self) -> int:
        """Most positions one group of one query may read."""
        return self.top_blocks * self.block_size

    def build(self) -> nn.Module:
        return BlockSparseAttention(self)

    def footprint(self, context: int, *, dtype: str = "bf16") -> Footprint:
        L, read = context, min(context, self.budget)
        per_entry = self.n_kv_heads * (self.head_dim + self.v_head_dim) + self.index_head_dim
        score_flops = 2 * self.n_kv_heads * L * self.index_head_dim
        return Footprint(
            context=context, kept=L, read=read, scored=L,
            state_bytes=math.ceil(L * per_entry * DTYPE_BYTES[dtype]),
            read_flops=2 * self.n_heads * read * (self.head_dim + self.v_head_dim) + score_flops,
            note="read is per group of heads (at most top_blocks * block_size); read_flops include the "
                 "indexer's scoring of all L positions",
        )

    def num_params(self) -> ParamCount:
        D, G, I = self.d_model, self.n_kv_heads, self.index_head_dim
        n = D * G * I + D * I + (2 * I if self.qk_norm else 0)
        return super().num_params() + ParamCount(n, n)


class BlockSparseAttention(Attention):
    """GQA attention whose groups read only their selected blocks (see the module docstring)."""

    selection_scores = block_selection_scores  # the probe's protocol (SELECTS)

    def __init__(self, cfg: MsaConfig):
        super().__init__(cfg)
        D, G, I = cfg.d_model, cfg.n_kv_heads, cfg.index_head_dim
        self.index_q = nn.Linear(D, G * I, bias=False)
        self.index_k = nn.Linear(D, I, bias=False)
        self.index_q_norm = RMSNorm(I, cfg.norm_eps) if cfg.qk_norm else None
        self.index_k_norm = RMSNorm(I, cfg.norm_eps) if cfg.qk_norm else None
        self.query_block = 1024
        self.read = {"fused": self._read_streamed, "reference": self._read_reference}[cfg.kernel]

    def index(self, x_BTD: Tensor, positions_T: Tensor) -> tuple[Tensor, Tensor]:
        """Index queries [B, T, G, I] and index keys [B, T, I], normalised and rotated."""
        c = self.cfg
        B, T, _ = x_BTD.shape
        q_BTGI = self.index_q(x_BTD).view(B, T, c.n_kv_heads, c.index_head_dim)
        k_BT1I = self.index_k(x_BTD).view(B, T, 1, c.index_head_dim)
        if self.index_q_norm is not None:
            q_BTGI, k_BT1I = self.index_q_norm(q_BTGI), self.index_k_norm(k_BT1I)
        q_BTGI = apply_rope(q_BTGI, positions_T, rotary_dim=c.rotary_dim, theta=c.rope_theta)
        k_BT1I = apply_rope(k_BT1I, positions_T, rotary_dim=c.rotary_dim, theta=c.rope_theta)
        return q_BTGI, k_BT1I[:, :, 0]

    def forward(self, x_BTD: Tensor, state: MsaCache | None = None, *, token_ids: Tensor | None = None):
        c = self.cfg
        check_input(x_BTD, c.d_model)
        state = MsaCache() if state is None else state
        T = x_BTD.shape[1]
        pos_T = self.positions(state.seen, T, x_BTD.device)
        q_BTHK, k_BTGK, v_BTGV, gate = self.project(x_BTD, pos_T)
        iq_BTGI, ik_BTI = self.index(x_BTD, pos_T)
        k_BLGK, v_BLGV = state.append(k_BTGK, v_BTGV)
        ik_BLI = state.append_index(ik_BTI)
        add_loss(self, "indexer", lambda: self._imitation(x_BTD, q_BTHK, k_BLGK, ik_BLI, pos_T))
        outs, blocks, counts = [], [], []
        qb = self.query_block  # split, not sliced: one backward for all slices, not a zero-filled q per slice
        for i, q_BtHK, iq_BtGI in zip(range(0, T, qb), q_BTHK.split(qb, dim=1), iq_BTGI.split(qb, dim=1)):
            j = min(T, i + qb)
            L = state.seen + j  # keys up to the slice's last query
            o_BTHV, blocks_BGTk, read_BGT = self.read(q_BtHK, iq_BtGI, k_BLGK, v_BLGV, ik_BLI[:, :L], pos_T[i:j])
            outs.append(o_BTHV), blocks.append(blocks_BGTk), counts.append(read_BGT)
        width = max(b.shape[-1] for b in blocks)
        emit(self, "blocks", lambda: torch.cat([nn.functional.pad(b, (0, width - b.shape[-1]), value=-1)
                                                for b in blocks], 2))
        emit(self, "read_counts", lambda: torch.cat(counts, dim=-1))
        state.seen += T
        return self.finish(torch.cat(outs, dim=1), gate), state

    def _imitation(self, x_BTD: Tensor, q_BTHK: Tensor, k_BLGK: Tensor, ik_BLI: Tensor, pos_T: Tensor) -> Tensor:
        """The index branch's imitation loss for the call's queries over every kept block."""
        c = self.cfg
        L = ik_BLI.shape[1]
        target_BGTN = block_attention_target(q_BTHK, k_BLGK[:, :L], positions_T=pos_T, block_size=c.block_size,
                                             scale=c.scale)
        iq_BTGI, ik_new_BTI = self.index(x_BTD.detach(), pos_T)
        ik_BLI = torch.cat([ik_BLI[:, :L - ik_new_BTI.shape[1]].detach(), ik_new_BTI], dim=1)
        scores_BGTN = block_scores(iq_BTGI, ik_BLI, positions_T=pos_T, block_size=c.block_size)
        return indexer_distill_loss(scores_BGTN, target_BGTN)

    # -- the read of one slice of queries, in the config's kernel --------------------------------
    def _read_streamed(self, q_BTHK: Tensor, iq_BTGI: Tensor, k_BLGK: Tensor, v_BLGV: Tensor, ik_BLI: Tensor,
                       pos_T: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(o_BTHV, blocks_BGTk, read_BGT): the streamed selection and the gathered read (storelab.ops.msa)."""
        c = self.cfg
        blocks_BGTk = select_blocks_streamed(iq_BTGI, ik_BLI, positions_T=pos_T, block_size=c.block_size,
                                             top_blocks=c.top_blocks, local_blocks=c.local_blocks,
                                             include_first_block=c.include_first_block)
        o_BTHV, read_BGT = attend_blocks(q_BTHK, k_BLGK, v_BLGV, blocks_BGTk, positions_T=pos_T,
                                         block_size=c.block_size, scale=c.scale, sinks_H=self.sinks)
        return o_BTHV, blocks_BGTk, read_BGT

    def _read_reference(self, q_BTHK: Tensor, iq_BTGI: Tensor, k_BLGK: Tensor, v_BLGV: Tensor, ik_BLI: Tensor,
                        pos_T: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The same from the reference forms: all index scores, the block mask, every logit."""
        c = self.cfg
        L = ik_BLI.shape[1]
        scores_BGTN = block_scores(iq_BTGI, ik_BLI, positions_T=pos_T, block_size=c.block_size)
        blocks_BGTk = select_blocks(scores_BGTN, positions_T=pos_T, block_size=c.block_size, top_blocks=c.top_blocks,
                                    local_blocks=c.local_blocks, include_first_block=c.include_first_block)
        mask_BGTL = block_mask(blocks_BGTk, positions_T=pos_T, length=L, block_size=c.block_size)
        mask_BHTL = mask_BGTL.repeat_interleave(c.n_heads // c.n_kv_heads, dim=1)
        o_BTHV = attend_reference(q_BTHK, k_BLGK[:, :L], v_BLGV[:, :L], scale=c.scale, mask_TL=mask_BHTL,
                                  sinks_H=self.sinks)
        return o_BTHV, blocks_BGTk, mask_BGTL.sum(-1)
