"""MSA without a [T, L] tensor: the streamed block selection against ``select_blocks(block_scores(...))``,
the gathered read against the plain masked attention, the store's chunked prefill and decode steps
against the dense path it replaced, and the size of every intermediate."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from storelab.ops.attention import attend_reference
from storelab.ops.msa import attend_blocks, block_mask, block_scores, select_blocks, select_blocks_streamed
from storelab.state import reserved_bytes, upcoming
from storelab.stores import build_store, observe
from tests.helpers import assert_close

D = 32


def _cfg(**kw):
    base = dict(kind="msa", d_model=D, n_heads=4, n_kv_heads=2, head_dim=8, partial_rotary=0.5, rope_theta=100.0,
                block_size=4, top_blocks=3, local_blocks=1, index_head_dim=8)
    return build_store(base | kw)


def _randomise(mod, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in mod.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.4)
    return mod


def _reference_selection(q, k, pos, **sel):
    return select_blocks(block_scores(q, k, positions_T=pos, block_size=sel["block_size"]), positions_T=pos, **sel)


def _sets(blocks_BGTk):
    return [sorted(i for i in row if i >= 0) for row in blocks_BGTk.flatten(0, -2).tolist()]


def _forced_scores(q, k, pos, *, block_size, local_blocks, include_first_block, **_):
    """block_scores with the forced blocks at +inf, as select_blocks ranks them."""
    s = block_scores(q, k, positions_T=pos, block_size=block_size)
    blk = pos // block_size
    forced = [(blk - j).clamp(min=0) for j in range(local_blocks)] + ([blk * 0] if include_first_block else [])
    for f in forced:
        s.scatter_(-1, f.view(1, 1, -1, 1).expand(*s.shape[:-1], 1), float("inf"))
    return s


SELECTIONS = [dict(top_blocks=3, local_blocks=1, include_first_block=False),
              dict(top_blocks=4, local_blocks=2, include_first_block=True),
              dict(top_blocks=1, local_blocks=1, include_first_block=False),
              dict(top_blocks=2, local_blocks=0, include_first_block=False),
              dict(top_blocks=5, local_blocks=0, include_first_block=True)]


# -- the selection ---------------------------------------------------------------------------------

@pytest.mark.parametrize("sel", SELECTIONS)
@pytest.mark.parametrize("L,T", [(1, 1), (7, 7), (37, 37), (37, 1), (38, 12), (50, 13), (64, 16), (101, 30)])
@pytest.mark.parametrize("score_budget", [1, 100, 1 << 20])
def test_streamed_selection_keeps_select_blocks_set(sel, L, T, score_budget):
    g = torch.Generator().manual_seed(L * 100 + T)
    B, G, I, bs = 2, 3, 8, 4
    q, k = torch.randn(B, T, G, I, generator=g), torch.randn(B, L, I, generator=g)
    pos = torch.arange(L - T, L)
    want = _reference_selection(q, k, pos, block_size=bs, **sel)
    got = select_blocks_streamed(q, k, positions_T=pos, block_size=bs, score_budget=score_budget, **sel)
    assert got.shape == want.shape
    assert _sets(got) == _sets(want)
    assert torch.equal(got < 0, want < 0)        # as many -1 slots, all of them last
    # slots come best first, as topk orders them
    s = _forced_scores(q, k, pos, block_size=bs, **sel)
    v = s.gather(-1, got.clamp(min=0)).masked_fill(got < 0, float("-inf"))
    assert (v[..., :-1] >= v[..., 1:]).all()


@pytest.mark.parametrize("score_budget", [1, 100, 1 << 20])
def test_streamed_selection_never_counts_a_future_position(score_budget):
    # loud keys after the first query: leaking any of them into a block's max would change the pick
    g = torch.Generator().manual_seed(7)
    B, T, G, I, L, bs = 2, 12, 3, 8, 46, 4   # the first query (34) ends a step of one block at 35
    q, k = torch.randn(B, T, G, I, generator=g), torch.randn(B, L, I, generator=g)
    k[:, L - T + 1:] *= 1000.0
    pos = torch.arange(L - T, L)
    sel = dict(block_size=bs, top_blocks=2, local_blocks=0, include_first_block=False)
    want = _reference_selection(q, k, pos, **sel)
    got = select_blocks_streamed(q, k, positions_T=pos, score_budget=score_budget, **sel)
    assert _sets(got) == _sets(want)


@pytest.mark.parametrize("sel", SELECTIONS[:2])
def test_streamed_selection_under_ties_keeps_the_same_scores_and_the_earlier_block(sel):
    # integer index keys and queries: many blocks share a score exactly
    g = torch.Generator().manual_seed(3)
    B, T, G, I, L, bs = 1, 20, 2, 2, 60, 4
    q, k = torch.randint(-1, 2, (B, T, G, I), generator=g).float(), torch.randint(-1, 2, (B, L, I), generator=g).float()
    pos = torch.arange(L - T, L)
    want = _reference_selection(q, k, pos, block_size=bs, **sel)
    got = select_blocks_streamed(q, k, positions_T=pos, block_size=bs, score_budget=50, **sel)
    s = _forced_scores(q, k, pos, block_size=bs, **sel)

    def scores(blocks):
        return s.gather(-1, blocks.clamp(min=0)).masked_fill(blocks < 0, float("-inf")).sort(-1).values

    assert torch.equal(scores(got), scores(want))  # the same scores kept: only equal ones may differ
    ties = 0
    for (b, gg, t), row in zip([(b, gg, t) for b in range(B) for gg in range(G) for t in range(T)], _sets(got)):
        kept = s[b, gg, t, row]
        cut = kept.min()
        left = [i for i in range(s.shape[-1]) if i not in row and s[b, gg, t, i] == cut]
        ties += bool(left)
        assert all(i > max(j for j in row if s[b, gg, t, j] == cut) for i in left), "ties go to the earlier block"
    assert ties > 0, "the inputs must produce ties at the cut"


# -- the read --------------------------------------------------------------------------------------

@pytest.mark.parametrize("sinks", [False, True])
@pytest.mark.parametrize("L,T", [(1, 1), (9, 9), (40, 40), (40, 1), (57, 11)])
@pytest.mark.parametrize("gather_budget", [1, 1 << 18])
def test_attend_blocks_equals_masked_attention(sinks, L, T, gather_budget):
    g = torch.Generator().manual_seed(L + T)
    B, H, G, K, V, I, bs = 2, 4, 2, 8, 6, 8, 4
    q, k, v = torch.randn(B, T, H, K, generator=g), torch.randn(B, L, G, K, generator=g), torch.randn(B, L, G, V,
                                                                                                       generator=g)
    pos = torch.arange(L - T, L)
    sel = dict(block_size=bs, top_blocks=3, local_blocks=1, include_first_block=True)
    blocks = _reference_selection(torch.randn(B, T, G, I, generator=g), torch.randn(B, L, I, generator=g), pos, **sel)
    sinks_H = torch.randn(H, generator=g) if sinks else None
    o, read = attend_blocks(q, k, v, blocks, positions_T=pos, block_size=bs, scale=0.3, sinks_H=sinks_H,
                            gather_budget=gather_budget)
    mask_BGTL = block_mask(blocks, positions_T=pos, length=L, block_size=bs)
    want = attend_reference(q, k, v, scale=0.3, mask_TL=mask_BGTL.repeat_interleave(H // G, dim=1), sinks_H=sinks_H)
    assert_close(o, want, 1e-5, f"attend_blocks L={L} T={T}")
    assert torch.equal(read, mask_BGTL.sum(-1))
    if L == 40 and T == 40:
        assert (read < pos + 1).any()            # some query leaves blocks out


# -- the store -------------------------------------------------------------------------------------

def dense_forward(mod, x_BTD):
    """The path the store took before streaming: whole [B, G, T, L] scores and mask, one pass from 0."""
    c = mod.cfg
    T = x_BTD.shape[1]
    pos = torch.arange(T)
    q, k, v, gate = mod.project(x_BTD, pos)
    iq, ik = mod.index(x_BTD, pos)
    blocks = _reference_selection(iq, ik, pos, block_size=c.block_size, top_blocks=c.top_blocks,
                                  local_blocks=c.local_blocks, include_first_block=c.include_first_block)
    mask = block_mask(blocks, positions_T=pos, length=T, block_size=c.block_size)
    o = attend_reference(q, k, v, scale=c.scale, mask_TL=mask.repeat_interleave(c.n_heads // c.n_kv_heads, dim=1),
                         sinks_H=mod.sinks)
    return mod.finish(o, gate), blocks, mask.sum(-1)


@pytest.mark.parametrize("opts", [dict(), dict(sink=True, gate=True, include_first_block=True, local_blocks=2)])
@pytest.mark.parametrize("chunks", [[700], [300, 257, 1, 1, 141], [1] * 3 + [697]])
def test_chunked_prefill_and_steps_equal_the_dense_path(opts, chunks):
    mod = _randomise(_cfg(top_blocks=3, **opts).build())
    x = torch.randn(1, 700, D)
    with torch.no_grad(), observe(mod) as seen:
        want, want_blocks, want_read = dense_forward(mod, x)
        st, ys, blocks, reads, t = None, [], [], [], 0
        for c in chunks:
            with upcoming(700 - t - c):
                y, st = mod(x[:, t:t + c], st)
            ys.append(y), blocks.append(seen.last(mod, "blocks")), reads.append(seen.last(mod, "read_counts"))
            t += c
    assert_close(torch.cat(ys, 1), want, 1e-5, f"chunks {chunks}")
    got_sets = [s for b in blocks for s in _sets(b.transpose(1, 2))]      # per (batch, query, group)
    assert got_sets == _sets(want_blocks.transpose(1, 2))
    assert torch.equal(torch.cat(reads, -1), want_read)
    assert st.seen == st.entries == 700 and st.idx_k.shape == (1, 700, 8)


def test_index_keys_grow_in_place():
    mod = _randomise(_cfg().build())
    x = torch.randn(1, 30, D)
    with torch.no_grad():
        with upcoming(20):
            _, st = mod(x[:, :10])
        ptr = st.idx_k.data_ptr()
        for s in (10, 20):
            _, st = mod(x[:, s:s + 10], st)
            assert st.idx_k.data_ptr() == ptr, "the index keys were copied"
    assert st.nbytes() == mod.cfg.footprint(30, dtype="fp32").state_bytes
    assert reserved_bytes(st) == st.nbytes()


class _LargestOutput(TorchDispatchMode):
    """Records the largest number of elements any operation writes to new memory (views do not count)."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        given = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in given:
                self.largest = max(self.largest, t.numel())
        return out


def test_no_intermediate_grows_like_chunk_times_context():
    B, T, G, H, K, I, bs = 1, 64, 2, 4, 8, 8, 4
    g = torch.Generator().manual_seed(0)
    sizes = {}
    for L in (1024, 4096):
        q_idx, k_idx = torch.randn(B, T, G, I, generator=g), torch.randn(B, L, I, generator=g)
        q, k, v = torch.randn(B, T, H, K, generator=g), torch.randn(B, L, G, K), torch.randn(B, L, G, K)
        pos = torch.arange(L - T, L)
        with torch.no_grad(), _LargestOutput() as seen:
            blocks = select_blocks_streamed(q_idx, k_idx, positions_T=pos, block_size=bs, top_blocks=3,
                                            score_budget=4096)
            attend_blocks(q, k, v, blocks, positions_T=pos, block_size=bs, scale=0.3, gather_budget=4096)
        sizes[L] = seen.largest
    assert max(sizes.values()) <= 2 * 4096 < T * 1024, sizes
