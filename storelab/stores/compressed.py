"""Compressed entries: DeepSeek-V4's compressed sparse (CSA) and heavily compressed (HCA)
attention (DeepSeek-V4 report, arXiv 2606.19348), kinds ``csa`` and ``hca``.

Update rule. Each token writes three things: its own entry ``kv_t = RoPE(RMSNorm(W_kv x_t))``
(one KV head of ``head_dim`` channels, the last ``rope_dim`` rotary; the same vector is
key and value for every query head), into a window of the last ``window`` tokens; and
its compressor projections, kept in a tail until the pools they belong to are complete.
When stride block ``w`` completes, entry ``w`` is pooled from the ``pool`` tokens ending
there (``storelab.ops.compress``: per-channel softmax weights over the pool's tokens,
from a projection of each token plus a learned bias per slot), then RMSNorm-ed and
rotated at position ``w * stride``. CSA also pools a narrower index key per entry the
same way; its lightning indexer (as in DeepSeek Sparse Attention) scores every complete
entry for each query, ``sum_h w_h ReLU(q_h . k)``, and the query reads the top
``index_topk``. HCA (stride = pool, no overlap) reads every complete entry. A query
at position t reads, in one softmax with a learned sink logit per head (StreamingLLM,
arXiv 2309.17453; gpt-oss), its selected entries and the own entries of positions
(t - window, t]. The output's rope channels are rotated back by -t (K = V carries a
rotation), then a grouped low-rank output projection maps heads to ``d_model``.

Parameters (D d_model, H heads, C head_dim, Q q_lora, g o_groups, r o_lora, S = pool/stride,
P pool, IH x IC index heads):
``D*Q + Q + Q*H*C`` (low-rank query) ``+ D*C + C`` (own entry) ``+ H*C*r + g*r*D``
(output) ``+ H`` (sinks) ``+ 2*D*S*C + P*C + C`` (compressor); CSA adds
``2*D*S*IC + P*IC + IC + Q*IH*IC + D*IH`` (indexer). All are active for every token.

State and cache formats: ``storelab.stores.compressed_cache`` (``CompressedCache``; 1/stride
pooled entries per token, a window and a tail of open pools; entries stored as computed or in
a quantised ``cache_format``, chosen once at construction).

Agreement and differences: pooled entries, the indexer's choice and the layer's output
match transformers' ``DeepseekV4CSACompressor`` / ``DeepseekV4HCACompressor`` /
``DeepseekV4Indexer`` / ``DeepseekV4Attention`` (tests/test_compressed_oracle.py). As
there, entry 0 of CSA pools only the first stride block (its older slots lie before
position 0), so L tokens give ``L // stride`` entries. Ties in the indexer's scores
(ReLU makes exact zeros) go to the older entry; the compressed rope is plain RoPE at
``rope_theta`` (the released config adds YaRN scaling, not modelled here).

Shared caches (a model layer with ``cache_owner``, as in DeepSeek-V4.1-Flash, arXiv
2609.19969, where each encoder cache serves six layers): the config says
``CACHE_SHARING = "handed"`` and a reader layer is called with ``shared=`` the owner's
``CompressedCache``, after the owner has run on the same tokens: the whole cache (window, pooled
entries, CSA's index keys). The reader writes nothing (``READER_UNUSED``) and keeps a
``SharedCompressedCache`` of 0 bytes, only its token count; it computes its own queries, sinks,
output and, for CSA, index queries and head weights: its own top-k over the owner's index keys
(the selection depends on its queries; the report shares one only in the decoder). A reader's early
queries in a long chunk read the owner's ``read_window`` (see ``CompressedCache``).

Training: the top-k passes no gradient, so under ``training_signals()`` each CSA call adds ``"indexer"``
(``storelab.ops.compress.imitation_loss``); the index keys are pooled from x detached.

Streaming (a long prompt read in chunks; DeepSeek-V4's 1M context). The owner's state is
updated in place, with no copy of the cache per call. The read is one softmax written as
parts over disjoint entries merged by their log-sum-exps with the sinks (``merge_parts``;
blockwise softmax, arXiv 1805.02867), and never holds a [T, N] tensor: every query gathers
its own window rows (and, CSA, its selected entries) into one small masked part, the queries
folded into the batch; HCA reads the entries complete before the call in one unmasked fused
part, in place (in blocks of rows when a cache format must be decoded), and those completed
inside the call in a small masked part. CSA's indexer scores a few queries by a block of
entries at a time into a running top-k (``select_topk_streamed``), with the tie rule of the
stable sort. Every transient is bounded by ``SCORE_BUDGET`` / ``READ_BUDGET`` and the chunk;
the read mask of ``step`` is built only when asked for.

Shape legend: B batch, T tokens in this call, N pooled entries, L entries read
(window then pooled), H query heads, K/C head width, S projection series, D d_model,
r stored row width, J rows one query gathers, X queries folded into the batch, Y query-head
rows (the heads on the query axis, t-major).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from storelab.ops.attention import attend_lse, merge_parts, window_mask
from storelab.ops.compress import imitation_loss, pool_entries, readable_entries, select_topk_streamed
from storelab.ops.indexer import selection_mask
from storelab.ops.norm import rms_norm
from storelab.ops.quant import FORMATS, entry_bytes
from storelab.state import State, append_rows
from storelab.stores.base import (TOKEN, DTYPE_BYTES, STATE_DTYPES, Card, Footprint, MemoryTerms, ParamCount, StoreConfig,
                                  add_loss, check_input, register)
from storelab.stores.compressed_cache import CompressedCache, Pooler, SharedCompressedCache
from storelab.stores.selection_scores import compressed_selection_scores
from storelab.stores.v4_parts import add_v4_projections, check_v4_fields, v4_rope

__all__ = ["CSAConfig", "HCAConfig", "CompressedAttention", "CompressedCache", "SharedCompressedCache"]

SCORE_BUDGET = 1 << 17  # indexer logits made at once (a few queries by one block of entries)
SCORE_BLOCK = 1024      # entries per block of the indexer's running top-k (its cost per query row amortised)
READ_BUDGET = 1 << 17   # numbers of one masked part, one gathered selection or one decoded block
INFER_READ_BUDGET = 1 << 20  # the same for the query chunks of a read outside training (4 MiB of fp32: at 8 rows of
                             # 8,192 tokens HCA's chunks held one query at 1 << 17, and the read ran 3.2x longer)
MIN_TRAIN_READ_QUERIES = 256  # a training read chunk's least queries (HCA's budget alone gives 1 / T: docs/bench.md)


# --- configs -------------------------------------------------------------------------


@dataclass(kw_only=True)
class _CompressedConfig(StoreConfig):
    """Fields shared by CSA and HCA; defaults are DeepSeek-V4-Pro's published config."""

    d_model: int
    n_heads: int = 128
    head_dim: int = 512
    rope_dim: int = 64
    q_lora: int = 1536
    o_groups: int = 16
    o_lora: int = 1024
    pool: int = 8
    window: int = 128
    rope_theta: float = 160000.0
    eps: float = 1e-6
    cache_format: str | None = None
    quant_block: int = 64

    def __post_init__(self) -> None:
        self.check_positive("d_model", "n_heads", "head_dim", "q_lora", "o_groups", "o_lora", "pool", "window",
                            "quant_block")
        check_v4_fields(self)

    READER_UNUSED = ("kv_proj", "kv_norm", "pooler", "index_pooler")  # a reader writes nothing

    @property
    def series(self) -> int:
        return self.pool // self.stride

    @property
    def indexed(self) -> bool:
        return False

    def build(self) -> "CompressedAttention":
        return CompressedAttention(self)

    def cache_entry_bytes(self, fmt: str) -> float:
        """One entry: fp8/fp4 in DeepSeek's mixed layout (``storelab.ops.quant.entry_bytes``), else a plain row."""
        return self._row(self.head_dim, self.rope_dim, fmt)

    def _row(self, width: int, rope: int, fmt: str) -> float:
        return entry_bytes(width, rope, fmt, self.quant_block) if fmt in FORMATS else width * DTYPE_BYTES[fmt]

    def memory_terms(self, *, cache: str = "bf16", state: str = "fp32") -> MemoryTerms:
        """Per token: an entry (and index key) per ``stride`` tokens. Per sequence: the window ring in the
        cache's format, the open pools at their fullest (``pool - 1`` tokens) in ``state``."""
        self.check(state in STATE_DTYPES, "state dtype", f"unknown {state!r} (accepted: {', '.join(STATE_DTYPES)})")
        entry = self._row(self.head_dim, self.rope_dim, cache)
        index = self._row(self.index_head_dim, 0, cache) if self.indexed else 0
        pool = 2 * self.series * (self.head_dim + (self.index_head_dim if self.indexed else 0)) * DTYPE_BYTES[state]
        return MemoryTerms(per_token=(entry + index) / self.stride, cache_per_token=entry / self.stride,
                           per_sequence=self.window * entry + (self.pool - 1) * pool)

    def _pooler_params(self, width: int) -> int:
        return 2 * self.d_model * self.series * width + self.pool * width + width

    def num_params(self) -> ParamCount:
        D, H, C, Q = self.d_model, self.n_heads, self.head_dim, self.q_lora
        n = D * Q + Q + Q * H * C + D * C + C + H * C * self.o_lora + self.o_groups * self.o_lora * D + H
        n += self._pooler_params(C)
        if self.indexed:
            n += self._pooler_params(self.index_head_dim) + Q * self.index_heads * self.index_head_dim
            n += D * self.index_heads
        return ParamCount(n, n)

    def footprint(self, context: int, *, dtype: str = "bf16") -> Footprint:
        L = context
        kept, win = L // self.stride, min(L, self.window)
        n_tail = min(L, L % self.stride + self.pool - self.stride)
        tail_elem = 4 if dtype == "fp32" else 2
        index = self.index_head_dim if self.indexed else 0
        rows = (kept + win) * self._row(self.head_dim, self.rope_dim, dtype) + kept * (
            self._row(index, 0, dtype) if index else 0)
        state = -int(-rows // 1) + n_tail * 2 * self.series * (self.head_dim + index) * tail_elem
        # per head: q.k and p.v over what is read; the indexer scores every kept entry
        read, scored = (min(kept, self.index_topk) + win, kept) if self.indexed else (kept + win, 0)
        flops = 4 * self.n_heads * self.head_dim * read + 2 * (self.index_heads if index else 0) * index * scored
        return Footprint(context=L, kept=kept, read=read, scored=scored, state_bytes=state, read_flops=flops,
                         note=f"pool {self.pool} stride {self.stride}, window {self.window}")


@register("csa")
@dataclass(kw_only=True)
class CSAConfig(_CompressedConfig):
    """Compressed sparse attention: overlapping pools (8 at stride 4) read through a lightning indexer."""

    stride: int = 4
    index_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 1024

    SLOTS, FAMILY, CARD_ORDER, CACHE_SHARING, SELECTS = (TOKEN,), "compressed sparse", 100, "handed", True
    CARD = Card(
        name="Compressed entries, selected (DeepSeek-V4 CSA)",
        written_by="each group of tokens, pooled: overlapping pools of 8 at a stride of 4, per-channel softmax weights",
        holds="one entry per 4 tokens (overlapping pools of 8), plus the last 128 tokens uncompressed",
        reading_costs="a scoring pass over all L/4 entries, then the 1,024 the indexer selects "
                      "plus the 128-token window",
        forgets="distinctions within a pool; what the indexer passes over is missed",
        source="arXiv 2606.19348",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_positive("stride", "index_heads", "index_head_dim", "index_topk")
        self.check(self.stride <= self.pool, "stride", f"must be <= pool {self.pool}, got {self.stride}")
        self.check(self.pool % self.stride == 0, "pool", f"must be a multiple of stride {self.stride}, got {self.pool}")
        self.check(self.rope_dim <= self.index_head_dim, "index_head_dim",
                   f"must be >= rope_dim {self.rope_dim} (index keys are rotated too), got {self.index_head_dim}")

    @property
    def indexed(self) -> bool:
        return True


@register("hca")
@dataclass(kw_only=True)
class HCAConfig(_CompressedConfig):
    """Heavily compressed attention: pools of ``pool`` tokens without overlap, all read."""

    pool: int = 128

    SLOTS, FAMILY, CARD_ORDER, CACHE_SHARING = (TOKEN,), "heavily compressed", 110, "handed"
    CARD = Card(
        name="Compressed entries, all read (DeepSeek-V4 HCA)",
        written_by="each group of 128 tokens, pooled with per-channel softmax weights",
        holds="one entry per 128 tokens, plus the last 128 tokens uncompressed",
        reading_costs="all L/128 entries plus the 128-token window",
        forgets="distinctions within a pool",
        source="arXiv 2606.19348",
    )

    @property
    def stride(self) -> int:
        return self.pool


# --- the module ----------------------------------------------------------------------


class CompressedAttention(nn.Module):
    """CSA (with ``cfg.indexed``) or HCA; see the module docstring."""
    selection_scores = compressed_selection_scores  # the probe's protocol (config SELECTS: csa)

    def __init__(self, cfg: _CompressedConfig):
        super().__init__()
        self.cfg = cfg
        add_v4_projections(self, cfg)
        D, C, Q = cfg.d_model, cfg.head_dim, cfg.q_lora
        self.pooler = Pooler(D, C, cfg.pool, cfg.stride, cfg.eps)
        if cfg.indexed:
            self.index_pooler = Pooler(D, cfg.index_head_dim, cfg.pool, cfg.stride, cfg.eps)
            self.index_q = nn.Linear(Q, cfg.index_heads * cfg.index_head_dim, bias=False)
            self.index_weights = nn.Linear(D, cfg.index_heads, bias=False)

    # -- small helpers ---------------------------------------------------------------
    def _rope(self, x_BTHK: Tensor, pos_T: Tensor) -> Tensor:
        """Interleaved RoPE on the trailing ``rope_dim`` channels (V4 lays heads out [nope | rope])."""
        return v4_rope(x_BTHK, pos_T, rope_dim=self.cfg.rope_dim, theta=self.cfg.rope_theta)

    def _encode(self, x: Tensor, rope_dim: int) -> Tensor:
        return self.fmt.encode(x, rope_dim)

    def _decode(self, rows: Tensor, width: int, rope_dim: int, dtype: torch.dtype) -> Tensor:
        return self.fmt.decode(rows, width, rope_dim, dtype)

    def _pool(self, pooler: Pooler, x_BTD: Tensor, tail_kv: Tensor | None, tail_z: Tensor | None, seen: int):
        """New pooled entries [B, N_new, C] (normalised, rotated) and the new tail."""
        cfg = self.cfg
        kv, z = pooler.project(x_BTD)
        td = self.fmt.tail_dtype(x_BTD.dtype)
        kv, z = kv.to(td), z.to(td)                      # what the tail would hold: same in every path
        if tail_kv is not None:
            kv, z = torch.cat([tail_kv, kv], dim=1), torch.cat([tail_z, z], dim=1)
        start = seen + x_BTD.shape[1] - kv.shape[1]      # absolute position of kv[:, 0]
        first = seen // cfg.stride                       # entries written so far
        pooled = pool_entries(kv.to(x_BTD.dtype), z.to(x_BTD.dtype), pooler.bias, stride=cfg.stride,
                              start=start, first=first)
        n_new = pooled.shape[1]
        pos_N = (torch.arange(n_new, device=x_BTD.device) + first) * cfg.stride
        entries = self._rope(pooler.norm(pooled)[:, :, None], pos_N)[:, :, 0]
        keep_from = max(0, ((seen + x_BTD.shape[1]) // cfg.stride) * cfg.stride - (cfg.pool - cfg.stride))
        # copies: the tail (under one pool of tokens) must not keep the call's projections alive
        return entries, kv[:, keep_from - start:].clone(), z[:, keep_from - start:].clone()

    # -- the protocol: a reader layer takes the owner's cache as ``shared=`` (CACHE_SHARING) --------
    def forward(self, x_BTD: Tensor, state: State | None = None, *, token_ids: Tensor | None = None,
                shared: CompressedCache | None = None):
        y_BTD, state, _ = self.step(x_BTD, state, shared=shared, want_mask=False)
        return y_BTD, state

    def step(self, x_BTD: Tensor, state: State | None = None, *, shared: CompressedCache | None = None,
             want_mask: bool = True):
        """Like ``forward``, and also the read mask [B, T, W' + N] (window entries oldest first, then pooled)
        when ``want_mask`` (None otherwise; the read never builds it). An owner's state is updated in place."""
        cfg = self.cfg
        check_input(x_BTD, cfg.d_model, "x_BTD")
        B, T, _ = x_BTD.shape
        H, C, dt = cfg.n_heads, cfg.head_dim, x_BTD.dtype
        if shared is None:
            if isinstance(state, SharedCompressedCache):
                raise ValueError("shared: a reader layer's state needs the owner's cache passed as shared=")
            cache = self._write(x_BTD, state if state is not None else CompressedCache())
            new_state = cache
        else:
            cache = self._check_shared(shared, state, T)
            new_state = SharedCompressedCache(seen=cache.seen)
        seen = cache.seen - T
        pos_T = torch.arange(seen, seen + T, device=x_BTD.device)

        q_res = self.q_a_norm(self.q_a(x_BTD))
        q_BTHK = self._rope(rms_norm(self.q_b(q_res).view(B, T, H, C), None, cfg.eps), pos_T)
        picks = self._select(x_BTD, q_res, cache, pos_T) if cfg.indexed else None
        if cfg.indexed:  # the top-k passes no gradient: the indexer imitates the attention over the entries
            add_loss(self, "indexer", lambda: self._imitation(x_BTD, q_res, q_BTHK, cache, pos_T))
        o_BTHK = self._read(q_BTHK, cache, picks)
        o_BTHK = self._rope(o_BTHK, -pos_T)              # undo the rotation the values carry
        o_BTGI = o_BTHK.reshape(B, T, cfg.o_groups, -1)
        y_BTD = self.o_b(torch.einsum("btgi,goi->btgo", o_BTGI, self.o_a.to(dt)).flatten(2))
        mask_BTL = self._read_mask(B, cache, pos_T, picks) if want_mask else None
        return y_BTD, new_state, mask_BTL

    # -- the read ----------------------------------------------------------------------
    def _select(self, x_BTD: Tensor, q_res: Tensor, cache: CompressedCache, pos_T: Tensor):
        """CSA's indexer: each query's top ``index_topk`` readable entries, (idx_BTk, valid_BTk), scored
        ``SCORE_BUDGET`` logits at a time (blocks of ``SCORE_BLOCK`` entries); None while there are none."""
        cfg = self.cfg
        B, T, _ = x_BTD.shape
        IH, IC, N = cfg.index_heads, cfg.index_head_dim, cache.entries
        if N == 0:
            return None
        iq_BTHK = self._rope(self.index_q(q_res).view(B, T, IH, IC), pos_T)
        w_BTH = self.index_weights(x_BTD) * IH ** -0.5
        keys = lambda s, e: self._decode(cache.index_keys[:, s:e], IC, 0, x_BTD.dtype)  # noqa: E731
        block = min(N, SCORE_BLOCK)
        with torch.no_grad():  # the top-k passes no gradient: autograd keeps none of the scores
            return select_topk_streamed(iq_BTHK, keys, w_BTH, seen=int(pos_T[0]), n_entries=N, stride=cfg.stride,
                                        k=cfg.index_topk, scale=IC ** -0.5, block=block,
                                        queries=SCORE_BUDGET // (B * IH * block))

    def _imitation(self, x_BTD: Tensor, q_res: Tensor, q_BTHK: Tensor, cache: CompressedCache, pos_T: Tensor):
        """``imitation_loss`` of the queries with an entry to read (None if none has), from x detached."""
        cfg = self.cfg
        IH, IC, N = cfg.index_heads, cfg.index_head_dim, cache.entries
        rows_T = readable_entries(pos_T, N, cfg.stride).any(-1)
        if not bool(rows_T.any()):
            return None
        q_BTHK, pos_T = q_BTHK[:, rows_T], pos_T[rows_T]
        B, T = q_BTHK.shape[:2]
        iq_BTHK = self._rope(self.index_q(q_res.detach()[:, rows_T]).view(B, T, IH, IC), pos_T)
        return imitation_loss(q_BTHK, self._decode(cache.pooled[:, :N], cfg.head_dim, cfg.rope_dim, x_BTD.dtype),
                              iq_BTHK, self._decode(cache.index_keys[:, :N], IC, 0, x_BTD.dtype),
                              self.index_weights(x_BTD.detach()[:, rows_T]) * IH ** -0.5,
                              readable_entries(pos_T, N, cfg.stride), scale=cfg.head_dim ** -0.5,
                              index_scale=IC ** -0.5)

    def _read(self, q_BTHK: Tensor, cache: CompressedCache, picks) -> Tensor:
        """One softmax (with the sinks) over each query's window and pooled entries, as parts merged by
        log-sum-exp, a chunk of queries at a time (see the module docstring: gathered window and CSA
        selection; HCA's entries complete before the call in place, those completed inside it masked)."""
        cfg = self.cfg
        B, T, H, C = q_BTHK.shape
        seen = cache.seen - T
        n_done = min(cache.entries, seen // cfg.stride)   # complete before the first query
        old = None if cfg.indexed or n_done == 0 else self._attend_rows(q_BTHK, cache.pooled[:, :n_done])
        k = 0 if picks is None else picks[0].shape[-1]
        n_new = 0 if cfg.indexed else T // cfg.stride + 1
        per_query = B * (H * (cfg.window + k + n_new) + (cfg.window + k) * C)   # logits and gathered numbers
        # training: each chunk's scores are recomputed in backward, not kept (HCA's would be T x T / stride)
        train = torch.is_grad_enabled() and q_BTHK.requires_grad
        step = max(MIN_TRAIN_READ_QUERIES, READ_BUDGET // per_query) if train else max(1, INFER_READ_BUDGET // per_query)
        # HCA: the entries completed inside the call, decoded once (each chunk reads a prefix of them)
        n_all = min(cache.entries, cache.seen // cfg.stride)
        new_kv = None if cfg.indexed or n_all <= n_done else \
            self._decode(cache.pooled[:, n_done:n_all], C, cfg.rope_dim, q_BTHK.dtype)[:, :, None]
        outs, out = [], None
        q_chunks = q_BTHK.split(step, dim=1)  # split, not sliced: a slice's backward zero-fills a whole q
        old_chunks = None if old is None else zip(old[0].split(step, dim=1), old[1].split(step, dim=2))
        for i, a in enumerate(range(0, T, step)):
            b = min(T, a + step)
            sel = None if picks is None else (picks[0][:, a:b], picks[1][:, a:b])
            old_i = None if old_chunks is None else next(old_chunks)

            def chunk(q_i, a=a, b=b, sel=sel, old_i=old_i):
                parts = [self._gathered_part(q_i, cache, T, a, sel)] + ([] if old_i is None else [old_i])
                n_hi = min(cache.entries, (seen + b) // cfg.stride)
                if new_kv is not None and n_hi > n_done:
                    parts.append(self._new_entries_part(q_i, new_kv[:, :n_hi - n_done], seen + a, n_done))
                return merge_parts(parts, sinks_H=self.sinks)
            if train:
                outs.append(checkpoint(chunk, q_chunks[i], use_reentrant=False))
                continue
            o_i = chunk(q_chunks[i])
            if step >= T:
                return o_i
            # inference: one output, made at the first chunk and filled, so that nothing the loop keeps sits between
            # the later chunks' growing transients (glibc's heap would grow with their sum: storelab.models.peaks)
            if out is None:
                out = o_i.new_empty(B, T, *o_i.shape[2:])
            out[:, a:b] = o_i
        if out is not None:
            return out
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)

    def _attend_rows(self, q_BTHK: Tensor, rows_BNr: Tensor) -> tuple[Tensor, Tensor]:
        """Unmasked part over stored rows: in place, or decoded ``READ_BUDGET`` numbers at a time and folded."""
        cfg = self.cfg
        B, _, H, C = q_BTHK.shape
        scale = C ** -0.5
        if self.fmt.in_place:
            kv_BN1C = rows_BNr[:, :, None]
            return attend_lse(q_BTHK, kv_BN1C, kv_BN1C, scale=scale)
        block = max(1, READ_BUDGET // (B * C))

        def part(s: int) -> tuple[Tensor, Tensor]:
            kv_BN1C = self._decode(rows_BNr[:, s:s + block], C, cfg.rope_dim, q_BTHK.dtype)[:, :, None]
            return attend_lse(q_BTHK, kv_BN1C, kv_BN1C, scale=scale)

        return merge_parts((part(s) for s in range(0, rows_BNr.shape[1], block)), keep_lse=True)

    def _gathered_part(self, q_BTHK: Tensor, cache: CompressedCache, T_call: int, a: int, sel):
        """Queries a.. of the call (of ``T_call``) over their own ``window`` entries of ``read_window`` and,
        CSA, their selected entries ``sel`` = (idx_BTk, valid_BTk), gathered, queries folded into the batch."""
        cfg = self.cfg
        B, T, H, C = q_BTHK.shape
        dev = q_BTHK.device
        own_T = torch.arange(a, a + T, device=dev) + cache.read_window.shape[1] - T_call
        idx_TW = own_T[:, None] + torch.arange(1 - cfg.window, 1, device=dev)
        rows_BTJr = cache.read_window[:, idx_TW.clamp_min(0)]
        valid_BTJ = (idx_TW >= 0).expand(B, T, cfg.window)
        if sel is not None:
            b_idx = torch.arange(B, device=dev)[:, None, None]
            rows_BTJr = torch.cat([rows_BTJr, cache.pooled[b_idx, sel[0]]], dim=2)
            valid_BTJ = torch.cat([valid_BTJ, sel[1]], dim=-1)
        J = rows_BTJr.shape[2]
        kv_XJ1C = self._decode(rows_BTJr, C, cfg.rope_dim, q_BTHK.dtype).reshape(B * T, J, 1, C)
        # one KV head: the H heads of a query go on the query axis, so nothing is repeated per head
        o_XH1C, lse_X1H = attend_lse(q_BTHK.reshape(B * T, H, 1, C), kv_XJ1C, kv_XJ1C, scale=C ** -0.5,
                                     mask_TL=valid_BTJ.reshape(B * T, 1, J))
        return o_XH1C.reshape(B, T, H, C), lse_X1H.reshape(B, T, H).transpose(1, 2)

    def _new_entries_part(self, q_BTHK: Tensor, kv_BN1C: Tensor, first_pos: int, first_entry: int):
        """HCA: queries at ``first_pos ..`` over entries ``first_entry ..`` completed inside the call (decoded)."""
        cfg = self.cfg
        B, T, H, C = q_BTHK.shape
        pos_T = torch.arange(first_pos, first_pos + T, device=q_BTHK.device)
        w_N = torch.arange(first_entry, first_entry + kv_BN1C.shape[1], device=q_BTHK.device)
        readable_TN = (w_N[None, :] + 1) * cfg.stride <= pos_T[:, None] + 1
        # the heads on the query axis (rows t-major), as in _gathered_part
        o_BY1C, lse_B1Y = attend_lse(q_BTHK.reshape(B, T * H, 1, C), kv_BN1C, kv_BN1C, scale=C ** -0.5,
                                     mask_TL=readable_TN.repeat_interleave(H, dim=0))
        return o_BY1C.reshape(B, T, H, C), lse_B1Y.reshape(B, T, H).transpose(1, 2)

    def _read_mask(self, B: int, cache: CompressedCache, pos_T: Tensor, picks) -> Tensor:
        """[B, T, W' + N]: the window entries, then the pooled entries each query read."""
        cfg = self.cfg
        T, n_win, N = pos_T.shape[0], cache.read_window.shape[1], cache.entries
        win_BTW = window_mask(T, n_win, cfg.window, device=pos_T.device).expand(B, T, n_win)
        if not cfg.indexed:
            chosen_BTN = readable_entries(pos_T, N, cfg.stride).expand(B, T, N)
        elif picks is None:
            chosen_BTN = torch.zeros(B, T, N, dtype=torch.bool, device=pos_T.device)
        else:
            chosen_BTN = selection_mask(picks[0], picks[1], N)
        return torch.cat([win_BTW, chosen_BTN], dim=-1)

    # -- the write ---------------------------------------------------------------------
    def _write(self, x_BTD: Tensor, st: CompressedCache) -> CompressedCache:
        """The owner's write, in place: own entries join the window, completed pools become entries (through
        the cache format), growing in buffers kept by ``st`` (``append_rows``): no copy of the cache per call."""
        cfg = self.cfg
        T, R, seen = x_BTD.shape[1], cfg.rope_dim, st.seen
        pos_T = torch.arange(seen, seen + T, device=x_BTD.device)
        kv_BTC = self._rope(self.kv_norm(self.kv_proj(x_BTD))[:, :, None], pos_T)[:, :, 0]
        window_rows = self._encode(kv_BTC, R)
        if st.window_kv is not None:
            window_rows = torch.cat([st.window_kv, window_rows], dim=1)   # at most window + T rows

        new, st.tail_kv, st.tail_z = self._pool(self.pooler, x_BTD, st.tail_kv, st.tail_z, seen)
        append_rows(st, ("pooled",), (self._encode(new, R),), tokens_per_row=cfg.stride)
        if cfg.indexed:
            # from x detached: the index keys reach the output through the top-k alone (no gradient)
            inew, st.tail_index_kv, st.tail_index_z = self._pool(self.index_pooler, x_BTD.detach(), st.tail_index_kv,
                                                                 st.tail_index_z, seen)
            append_rows(st, ("index_keys",), (self._encode(inew, 0),), tokens_per_row=cfg.stride)
        st.seen, st.window_kv, st.read_window = seen + T, window_rows[:, -cfg.window:], window_rows
        return st

    def _check_shared(self, shared: CompressedCache, state: State | None, T: int) -> CompressedCache:
        """The owner's cache must hold this call's entries, in this layer's layout."""
        if not isinstance(shared, CompressedCache) or shared.read_window is None:
            raise ValueError(f"shared: expected the owner's CompressedCache after its call, got {type(shared).__name__}")
        return shared.check_reader(state, T, window=self.cfg.window, indexed=self.cfg.indexed)
