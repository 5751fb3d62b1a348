"""Streaming long contexts: caches that grow in place, causal attention without a [T, L] mask,
and the indexer's top-k over scores made block by block. Each fast form against the plain one."""

from __future__ import annotations

import copy

import pytest
import torch

import storelab.ops.attention as attn_ops
from storelab.models.model import Model, prefill
from storelab.ops.attention import (attend_causal, attend_causal_blocks, attend_lse, attend_reference, causal_mask,
                                    merge_parts)
from storelab.ops.indexer import _top_in_order, block_pool, index_scores, top_positions, top_positions_streamed
from storelab.state import KVCache, append_rows, held_bytes, joined_rows, loose_views, reserved_bytes, upcoming
from storelab.stores.base import observe
from storelab.stores.dsa import DSAConfig, HierarchicalConfig, link_selection_states
from storelab.stores.mla import MLAConfig
from storelab.zoo import load_zoo
from tests.helpers import assert_close


# -- caches that grow in place -------------------------------------------------------------------

def test_append_rows_views_and_reservation():
    st = KVCache()
    k1, v1 = torch.randn(1, 3, 2, 4), torch.randn(1, 3, 2, 5)
    with upcoming(7):
        k, v = st.append(k1, v1)
    assert torch.equal(k, k1) and torch.equal(v, v1)
    assert st.nbytes() == 3 * 2 * (4 + 5) * 4          # the kept rows, not the capacity
    assert reserved_bytes(st) == 10 * 2 * (4 + 5) * 4  # room for the 7 announced tokens
    ptr = st.k.data_ptr()
    k2, v2 = torch.randn(1, 7, 2, 4), torch.randn(1, 7, 2, 5)
    k, v = st.append(k2, v2)
    assert st.k.data_ptr() == ptr, "a reserved cache must not move"
    assert torch.equal(k, torch.cat([k1, k2], 1)) and torch.equal(v, torch.cat([v1, v2], 1))
    # without a hint it grows geometrically, keeping what it held
    k3 = torch.randn(1, 1, 2, 4)
    k, _ = st.append(k3, torch.randn(1, 1, 2, 5))
    assert torch.equal(k, torch.cat([k1, k2, k3], 1)) and st.entries == 11
    assert reserved_bytes(st) >= st.nbytes()


def test_append_rows_copies_do_not_write_into_each_other():
    st = KVCache()
    with upcoming(10):
        st.append(torch.zeros(1, 2, 1, 3), torch.zeros(1, 2, 1, 3))
    other = copy.copy(st)                    # shares the buffer record
    st.append(torch.ones(1, 1, 1, 3), torch.ones(1, 1, 1, 3))
    k, _ = other.append(torch.full((1, 1, 1, 3), 2.0), torch.full((1, 1, 1, 3), 2.0))
    assert st.k[0, 2, 0, 0] == 1.0 and k[0, 2, 0, 0] == 2.0
    deep = copy.deepcopy(st)
    deep.append(torch.full((1, 1, 1, 3), 5.0), torch.full((1, 1, 1, 3), 5.0))
    assert st.entries == 3 and deep.entries == 4 and st.k[0, -1, 0, 0] == 1.0


def test_joined_rows_is_a_view_of_both_fields():
    from storelab.stores.mla import LatentCache

    st = LatentCache()
    a, b = torch.randn(2, 4, 3), torch.randn(2, 4, 2)
    with upcoming(4):
        st.append(a, b)
    st.append(a + 1, b + 1)
    j = st.joined()
    assert j.data_ptr() == st.latent.data_ptr()
    assert torch.equal(j, torch.cat([torch.cat([a, a + 1], 1), torch.cat([b, b + 1], 1)], -1))
    st.latent = st.latent.clone()            # replaced by hand: joined falls back to a copy, still right
    assert torch.equal(joined_rows(st, ("latent", "k_rope")), j)


def test_append_rows_under_autograd_concatenates():
    st = KVCache()
    x = torch.randn(1, 2, 1, 3, requires_grad=True)
    st.append(x, x)
    k, _ = st.append(x * 2, x * 2)
    k.sum().backward()
    assert_close(x.grad, torch.full_like(x, 3.0))


# -- causal attention in parts -------------------------------------------------------------------

CASES = [  # B, T, L, H, G, K, V, sink
    (2, 5, 5, 4, 2, 16, 16, False), (2, 7, 30, 4, 2, 24, 16, True), (1, 1, 40, 4, 1, 24, 16, False),
    (1, 9, 40, 2, 2, 8, 12, True), (1, 1, 1, 2, 1, 8, 8, True), (3, 16, 100, 6, 3, 8, 8, True),
]


@pytest.mark.parametrize("case", CASES)
def test_attend_causal_equals_masked_reference(case, monkeypatch):
    B, T, L, H, G, K, V, sink = case
    torch.manual_seed(0)
    q, k, v = torch.randn(B, T, H, K), torch.randn(B, L, G, K), torch.randn(B, L, G, V)
    s = torch.randn(H) if sink else None
    ref = attend_reference(q, k, v, scale=0.3, mask_TL=causal_mask(T, L), sinks_H=s)
    monkeypatch.setattr(attn_ops, "KEY_BLOCK", 7)   # several key blocks when the widths differ
    assert_close(attend_causal(q, k, v, scale=0.3, sinks_H=s), ref, 1e-5)
    got = attend_causal(q.bfloat16(), k.bfloat16(), v.bfloat16(), scale=0.3, sinks_H=s)
    assert got.dtype == torch.bfloat16
    assert_close(got.float(), ref, 0.05)
    blocks = attend_causal_blocks(q, lambda a, b: (k[:, a:b], v[:, a:b]), L, G=G, V=V, scale=0.3, sinks_H=s, block=3)
    assert_close(blocks, ref, 1e-5)


def test_attend_causal_reads_strided_cache_views():
    torch.manual_seed(1)
    buf = torch.randn(1, 50, 2, 16 + 16)
    k, v = buf[:, :40, :, :16], buf[:, :40, :, 16:]
    q = torch.randn(1, 8, 4, 16)
    ref = attend_reference(q, k, v, scale=0.25, mask_TL=causal_mask(8, 40))
    assert_close(attend_causal(q, k, v, scale=0.25), ref, 1e-5)


def test_parts_merge_to_one_softmax():
    torch.manual_seed(2)
    B, T, L, H, G = 2, 6, 30, 4, 2
    q, k, v, s = torch.randn(B, T, H, 24), torch.randn(B, L, G, 24), torch.randn(B, L, G, 16), torch.randn(H)
    mask = torch.rand(B, T, L) < 0.5
    mask[0, 0] = False                        # a row with nothing readable but the sink
    ref = attend_reference(q, k, v, scale=0.3, mask_TL=mask[:, None], sinks_H=s)
    parts = [attend_lse(q, k[:, :10], v[:, :10], scale=0.3, mask_TL=mask[:, :, :10]),
             attend_lse(q, k[:, 10:], v[:, 10:], scale=0.3, mask_TL=mask[:, :, 10:])]
    assert_close(merge_parts(parts, sinks_H=s), ref, 1e-5)
    open_part = attend_lse(q, k[:, :24], v[:, :24], scale=0.3)             # fused, unmasked
    own = attend_lse(q, k[:, 24:], v[:, 24:], scale=0.3, causal=True)       # fused, square causal
    full = torch.ones(T, L, dtype=torch.bool)
    full[:, 24:] = causal_mask(T, T)
    assert_close(merge_parts([open_part, own]), attend_reference(q, k, v, scale=0.3, mask_TL=full), 1e-5)


# -- the streamed top-k ----------------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(6))
def test_streamed_top_positions_equal_the_full_sort(seed):
    g = torch.Generator().manual_seed(seed)
    for _ in range(40):
        T = int(torch.randint(1, 9, (), generator=g))
        L = T + int(torch.randint(0, 40, (), generator=g))
        k = int(torch.randint(1, 12, (), generator=g))
        if seed % 2:  # ReLU-like scores: many exact ties
            sc = torch.randint(-2, 3, (2, T, L), generator=g).float().clamp_min(0)
        else:
            sc = torch.randn(2, T, L, generator=g)
        sc = sc.masked_fill(~causal_mask(T, L), float("-inf"))
        block = 2 * int(torch.randint(1, 6, (), generator=g))
        idx, valid, pool, pool_valid = top_positions_streamed(
            lambda s, e: sc[..., s:e], L, k, block=block, pool_block=2, n_pool_blocks=3,
            query_pos_T=torch.arange(L - T, L))
        ref_idx, ref_valid = top_positions(sc, k)
        ref_pool, ref_pool_valid = block_pool(sc, block=2, n_blocks=3)
        assert torch.equal(idx, ref_idx) and torch.equal(valid, ref_valid)
        assert torch.equal(pool, ref_pool) and torch.equal(pool_valid, ref_pool_valid)


# -- stores: chunked prefill through the streamed forms == one full pass with the plain forms ------

MLA = dict(d_model=32, n_heads=4, q_lora_rank=12, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4,
           v_head_dim=6)


@pytest.mark.parametrize("absorbed", [False, True])
def test_mla_streamed_read_equals_masked_read(absorbed, monkeypatch):
    torch.manual_seed(3)
    m = MLAConfig(**MLA, absorbed=absorbed).build()
    x = torch.randn(2, 37, 32)
    monkeypatch.setattr(attn_ops, "KEY_BLOCK", 5)
    with torch.no_grad():
        state, ys = None, []
        for a, b in [(0, 11), (11, 12), (12, 37)]:
            with upcoming(37 - b):
                y, state = m(x[:, a:b], state)
            ys.append(y)
        # the plain form: one pass, the explicit [T, L] mask, the naive read
        p = m.project(x, torch.arange(37))
        ref = m.finish(m._read_naive(p, p.latent_BTC, p.k_rope_BTR, causal_mask(37, 37)), x)
    assert_close(torch.cat(ys, 1), ref, 1e-5)


def test_dsa_streamed_selection_equals_full_scoring(monkeypatch):
    import storelab.stores.dsa as dsa_mod

    torch.manual_seed(4)
    cfg = DSAConfig(**{**MLA, "n_heads": 2}, index_n_heads=2, index_head_dim=8, index_topk=5)
    m = cfg.build()
    monkeypatch.setattr(dsa_mod, "SCORE_BUDGET", 16)   # blocks of a few positions
    x = torch.randn(1, 40, 32)
    with torch.no_grad():
        state = link_selection_states([cfg])[0]
        _, state = m(x[:, :17], state)
        with observe(m) as seen:
            _, state = m(x[:, 17:], state)
        got = seen.last(m, "selection")
        pos = torch.arange(17, 40)
        q, w = m.indexer.queries(x[:, 17:], m.mla.project(x[:, 17:], pos).q_src_BTQ, pos)
        full = index_scores(q, state.index_k, w, scale=m.indexer.scale, mask_TL=causal_mask(23, 40))
    assert torch.equal(got, top_positions(full, 5)[0])


def test_hierarchical_root_pool_streamed(monkeypatch):
    import storelab.stores.dsa as dsa_mod

    torch.manual_seed(5)
    cfg = HierarchicalConfig(**{**MLA, "n_heads": 2}, index_n_heads=2, index_head_dim=8, topk=3, pool_size=8,
                             pool_block=4, refresh_every=2, layer_index=0)
    m = cfg.build()
    x = torch.randn(1, 30, 32)
    with torch.no_grad():
        ref_state = link_selection_states([cfg])[0]
        m(x, ref_state)
        ref_pool = ref_state.share.pool_BTP.clone()
        monkeypatch.setattr(dsa_mod, "SCORE_BUDGET", 8)
        st = link_selection_states([cfg])[0]
        m(x, st)
    assert torch.equal(st.share.pool_BTP, ref_pool)


def test_prefill_reserves_each_cache_once():
    """A chunked prefill writes every cache in place: each buffer is allocated at the first chunk."""
    cfg = load_zoo("qwen3.8", tiny=True)
    torch.manual_seed(0)
    model = Model(cfg).eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, 96))
    ptrs: dict[int, set] = {}

    def watch(n):
        for i, st in enumerate(cache_box[0] or []):
            if isinstance(st.token, KVCache) and st.token.k is not None:
                ptrs.setdefault(i, set()).add(st.token.k.data_ptr())

    cache_box = [model.new_cache()]
    _, cache = prefill(model, prompt, chunk=16, cache=cache_box[0], on_chunk=watch)
    assert ptrs and all(len(p) == 1 for p in ptrs.values()), ptrs
    for st in cache:
        if isinstance(st.token, KVCache):
            assert reserved_bytes(st.token) == st.token.nbytes()  # exactly the prompt's rows
    with torch.no_grad():
        full, _ = model(prompt)
    chunked, _ = prefill(model, prompt, chunk=16)
    assert_close(chunked, full[:, -1], 1e-4)


def test_generate_reserves_prompt_and_new_tokens():
    from storelab.models.model import generate

    cfg = load_zoo("mimo-v2.6-pro", tiny=True)
    torch.manual_seed(0)
    model = Model(cfg).eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, 40))
    ids, cache = generate(model, prompt, 9, chunk=16)
    full = [st.token for st in cache if isinstance(st.token, KVCache)]
    assert full
    for st in full:  # 40 prompt tokens and the 8 generated ones fed back: one buffer, filled exactly
        assert st.entries == 48 and reserved_bytes(st) == st.nbytes()
    # the same ids as a plain loop without any reservation
    with torch.no_grad():
        logits, c2 = model(prompt)
        out = [logits[:, -1:].argmax(-1)]
        for _ in range(8):
            step, c2 = model(out[-1], c2)
            out.append(step[:, -1:].argmax(-1))
    assert torch.equal(ids, torch.cat(out, 1))


def test_append_rows_refuses_rows_of_another_shape_and_keeps_the_cache():
    st = KVCache()
    st.append(torch.ones(1, 3, 2, 4), torch.ones(1, 3, 2, 4))
    with pytest.raises(ValueError, match=r"state\.(k|v): holds rows of shape \[1, 2, 4\]"):
        st.append(torch.ones(2, 1, 2, 4), torch.ones(2, 1, 2, 4))
    assert st.entries == 3 and torch.equal(st.k, torch.ones(1, 3, 2, 4))


def test_loose_views_finds_a_tail_that_pins_its_call():
    from storelab.state import RecurrentState

    big = torch.randn(1, 100, 8)
    st = RecurrentState(S=big[:, -3:])               # a 3-row view of a 100-row activation
    assert loose_views(st) and held_bytes(st) == big.numel() * 4
    st = RecurrentState(S=big[:, -3:].clone())
    assert loose_views(st) == [] and held_bytes(st) == st.nbytes()


@pytest.mark.parametrize("name", ["mimo-v2.6-pro", "kimi-k3", "qwen3.8", "glm-5.3", "deepseek-v4-pro",
                                  "deepseek-v4.1-flash", "minimax-m3"])
def test_caches_keep_no_view_of_a_chunk(name):
    """After a chunked prefill and decode steps no state keeps a small slice (a convolution or
    pooling tail, the last ids) of a call's activation as a view: the whole activation would stay
    alive between calls, memory the accounting does not count (a 256-token chunk's 97 KB per
    layer for a 1 KB convolution tail)."""
    from storelab.models.model import generate

    cfg = load_zoo(name, tiny=True)
    torch.manual_seed(0)
    model = Model(cfg).eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, 90))
    with torch.inference_mode():
        _, cache = prefill(model, prompt, chunk=40)
        assert loose_views(cache) == []
        _, cache = generate(model, prompt, 3, chunk=40)
    assert loose_views(cache) == []


@pytest.mark.parametrize("n,k", [(6, 3), (12, 3), (13, 3), (64, 6), (300, 7)])
def test_top_in_order_equals_the_stable_sort(n, k):
    """Both forms (one stable sort for short rows, topk and a tie count for long ones) keep the
    k best in position order, ties to the earlier position, as a full stable sort does."""
    g = torch.Generator().manual_seed(n * 31 + k)
    v = torch.randint(-3, 4, (2, 9, n), generator=g).float().relu()   # many ties, at 0 and above
    v[0, 0] = 0.0                                                      # a row of ties only
    want = torch.sort(v, dim=-1, descending=True, stable=True).indices[..., :k].sort(dim=-1).values
    assert torch.equal(_top_in_order(v, k), want)
