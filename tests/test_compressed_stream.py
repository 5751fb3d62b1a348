"""CSA and HCA read streamed (DeepSeek-V4, arXiv 2606.19348): the streamed top-k, the parts merged
by log-sum-exp and the cache grown in place equal the plain dense form, and nothing [T, N] is built."""

import copy

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from storelab.ops.attention import attend_reference, window_mask
from storelab.ops.compress import index_scores, readable_entries, select_topk, select_topk_streamed
from storelab.ops.indexer import selection_mask
from storelab.ops.norm import rms_norm
from storelab.state import upcoming
from storelab.stores import compressed
from storelab.stores.compressed import CSAConfig, HCAConfig
from tests.helpers import assert_close

TINY = dict(d_model=32, n_heads=2, head_dim=16, rope_dim=4, q_lora=12, o_groups=2, o_lora=8, window=5, quant_block=8)
TINY_CSA = dict(TINY, pool=4, stride=2, index_heads=2, index_head_dim=8, index_topk=3)
TINY_HCA = dict(TINY, pool=4)


def _build(kind: str, **over):
    cfg = CSAConfig(**{**TINY_CSA, **over}) if kind == "csa" else HCAConfig(**{**TINY_HCA, **over})
    torch.manual_seed(0)
    store = cfg.build()
    with torch.no_grad():
        for name, p in store.named_parameters():
            if name.endswith("bias") or name == "sinks":
                p.copy_(torch.randn(p.shape))
    return cfg, store


@pytest.fixture
def small_budgets(monkeypatch):
    """Budgets so small that every loop of the read runs many times on a short context."""
    monkeypatch.setattr(compressed, "SCORE_BUDGET", 64)
    monkeypatch.setattr(compressed, "SCORE_BLOCK", 3)
    monkeypatch.setattr(compressed, "READ_BUDGET", 96)
    monkeypatch.setattr(compressed, "INFER_READ_BUDGET", 96)


def _reference_step(store, x_BTD, state):
    """The dense form the streamed read replaces: all entries decoded and concatenated after the
    window, the indexer's scores over every entry, one [T, W' + N] mask, one softmax."""
    cfg = store.cfg
    B, T, _ = x_BTD.shape
    H, C, R, dt = cfg.n_heads, cfg.head_dim, cfg.rope_dim, x_BTD.dtype
    cache = store._write(x_BTD, copy.deepcopy(state) if state is not None else compressed.CompressedCache())
    seen = cache.seen - T
    pos_T = torch.arange(seen, seen + T)
    q_res = store.q_a_norm(store.q_a(x_BTD))
    q_BTHK = store._rope(rms_norm(store.q_b(q_res).view(B, T, H, C), None, cfg.eps), pos_T)
    win_BLC = store._decode(cache.read_window, C, R, dt)
    ent_BNC = store._decode(cache.pooled, C, R, dt)
    N, n_win = ent_BNC.shape[1], win_BLC.shape[1]
    readable_TN = readable_entries(pos_T, N, cfg.stride)
    if cfg.indexed:
        IH, IC = cfg.index_heads, cfg.index_head_dim
        iq_BTHK = store._rope(store.index_q(q_res).view(B, T, IH, IC), pos_T)
        w_BTH = store.index_weights(x_BTD) * IH ** -0.5
        scores_BTN = index_scores(iq_BTHK, store._decode(cache.index_keys, IC, 0, dt), w_BTH, scale=IC ** -0.5)
        chosen_BTN = select_topk(scores_BTN, readable_TN, cfg.index_topk)
    else:
        chosen_BTN = readable_TN.expand(B, T, N)
    mask_BTL = torch.cat([window_mask(T, n_win, cfg.window).expand(B, T, n_win), chosen_BTN], dim=-1)
    kv_BL1C = torch.cat([win_BLC, ent_BNC], dim=1)[:, :, None]
    o_BTHK = attend_reference(q_BTHK, kv_BL1C, kv_BL1C, scale=C ** -0.5, mask_TL=mask_BTL[:, None], sinks_H=store.sinks)
    o_BTHK = store._rope(o_BTHK, -pos_T)
    o_BTGI = o_BTHK.reshape(B, T, cfg.o_groups, -1)
    y_BTD = store.o_b(torch.einsum("btgi,goi->btgo", o_BTGI, store.o_a.to(dt)).flatten(2))
    return y_BTD, mask_BTL


# --- the streamed top-k ------------------------------------------------------------------


@pytest.mark.parametrize("seen,T,N,block,queries", [(0, 23, 11, 3, 23), (40, 9, 24, 5, 4), (40, 1, 20, 4, 1),
                                                    (7, 30, 18, 1, 7), (3, 26, 14, 40, 5)])
def test_streamed_topk_chooses_what_select_topk_does(seen, T, N, block, queries):
    """Scores with many exact ties (duplicated keys, ReLU zeros): the same entries are chosen."""
    gen = torch.Generator().manual_seed(seen + T + N)
    stride, k = 2, 4
    q_BTHK = torch.randn(2, T, 3, 6, generator=gen)
    keys_BNK = torch.randn(2, N, 6, generator=gen)
    keys_BNK[:, 1::3] = keys_BNK[:, 0:1]              # equal scores: the older entry must win
    keys_BNK[:, 2::5] = -q_BTHK.mean((1, 2))[:, None]  # mostly negative overlaps: scores of exactly 0
    w_BTH = torch.randn(2, T, 3, generator=gen).abs()
    pos_T = torch.arange(seen, seen + T)
    N = min(N, (seen + T) // stride)
    keys_BNK = keys_BNK[:, :N]
    want_BTN = select_topk(index_scores(q_BTHK, keys_BNK, w_BTH, scale=0.3), readable_entries(pos_T, N, stride), k)
    idx_BTk, valid_BTk = select_topk_streamed(q_BTHK, lambda s, e: keys_BNK[:, s:e], w_BTH, seen=seen, n_entries=N,
                                              stride=stride, k=k, scale=0.3, block=block, queries=queries)
    assert torch.equal(selection_mask(idx_BTk, valid_BTk, N), want_BTN)
    assert want_BTN.sum(-1).max() == min(k, N)


# --- the store: streamed read == dense reference ------------------------------------------

CHUNKINGS = [[41], [1] * 41, [3, 9, 1, 1, 27], [12, 1, 13, 15]]


@pytest.mark.parametrize("kind", ["csa", "hca"])
@pytest.mark.parametrize("fmt", [None, "bf16", "fp8", "fp4"])
@pytest.mark.parametrize("read_budget", [96, 1200])
def test_streamed_read_equals_the_dense_form(kind, fmt, read_budget, small_budgets, monkeypatch):
    """Chunked calls, T == 1 decode steps and contexts many blocks long (the budgets are tiny:
    one query per chunk, or a few): each call's output and read mask equal the dense form's."""
    monkeypatch.setattr(compressed, "READ_BUDGET", read_budget)
    monkeypatch.setattr(compressed, "INFER_READ_BUDGET", read_budget)
    cfg, store = _build(kind, cache_format=fmt)
    x = torch.randn(2, 41, cfg.d_model, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        for chunks in CHUNKINGS:
            state, t = None, 0
            for c in chunks:
                want_y, want_mask = _reference_step(store, x[:, t:t + c], state)
                y, state, mask = store.step(x[:, t:t + c], state)
                assert_close(y, want_y, 1e-5, f"{kind} {fmt} chunks {chunks} at {t}")
                assert torch.equal(mask, want_mask), f"{kind} {fmt} read mask, chunks {chunks} at {t}"
                t += c
            assert state.nbytes() == 2 * cfg.footprint(41, dtype=fmt or "fp32").state_bytes  # batch of 2


@pytest.mark.parametrize("kind", ["csa", "hca"])
def test_a_reader_reads_the_owners_cache_streamed(kind, small_budgets):
    cfg, owner = _build(kind)
    torch.manual_seed(2)
    reader = cfg.build()
    x = torch.randn(1, 37, cfg.d_model, generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        own = mine = None
        t = 0
        for c in [10, 1, 14, 12]:
            before = copy.deepcopy(own)
            _, own = owner(x[:, t:t + c], own)
            # the dense form of the reader: the owner's cache, this reader's queries
            want_y, _ = _reference_step(_with_kv_path(reader, owner), x[:, t:t + c], before)
            y, mine = reader(x[:, t:t + c], mine, shared=own)
            assert_close(y, want_y, 1e-5, f"{kind} reader at {t}")
            t += c


def _with_kv_path(reader, owner):
    """A copy of the reader whose KV path (own entry, poolers) is the owner's."""
    m = copy.deepcopy(reader)
    with torch.no_grad():
        for (name, p), o in zip(m.named_parameters(), owner.parameters()):
            if name.startswith(("kv_proj.", "kv_norm.", "pooler.", "index_pooler.")):
                p.copy_(o)
    return m


# --- the cache grows in place; forward builds no [T, N] tensor ------------------------------


@pytest.mark.parametrize("kind", ["csa", "hca"])
def test_entries_grow_in_one_buffer_kept_by_the_state(kind):
    cfg, store = _build(kind)
    x = torch.randn(1, 64, cfg.d_model)
    with torch.no_grad():
        state, t, ptrs = None, 0, set()
        for c in [16, 16, 1, 15, 16]:
            with upcoming(64 - t - c):
                y, new = store(x[:, t:t + c], state)
            assert state is None or new is state
            state, t = new, t + c
            ptrs.add(state.pooled.data_ptr())
            if cfg.indexed:
                ptrs.add(state.index_keys.data_ptr())
    assert len(ptrs) == (2 if cfg.indexed else 1), "the cache was copied to a new buffer"
    assert state.nbytes() == cfg.footprint(64, dtype="fp32").state_bytes


class _Largest(TorchDispatchMode):
    """Records the largest storage any op allocates (bytes; outputs sharing an input's storage,
    views and aliases, left out)."""

    largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {t.untyped_storage().data_ptr() for t in tree_flatten((args, kwargs))[0]
                  if isinstance(t, torch.Tensor)}
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in inputs:
                self.largest = max(self.largest, t.untyped_storage().nbytes())
        return out


@pytest.mark.parametrize("kind", ["csa", "hca"])
@pytest.mark.parametrize("fmt", [None, "fp8"])
def test_forward_builds_nothing_of_size_queries_times_entries(kind, fmt, small_budgets, monkeypatch):
    """After 4,096 tokens (2,048 CSA entries), a 64-token call allocates nothing near T * N, nor a
    copy of the cache: every transient is bounded by the budgets and the chunk. The read mask,
    which is [T, W' + N], is never built by ``forward``."""
    monkeypatch.setattr(compressed, "SCORE_BUDGET", 512)
    monkeypatch.setattr(compressed, "SCORE_BLOCK", 64)
    monkeypatch.setattr(compressed, "READ_BUDGET", 512)
    monkeypatch.setattr(compressed, "INFER_READ_BUDGET", 512)
    cfg, store = _build(kind, cache_format=fmt)
    L, T = 4096, 64
    x = torch.randn(1, L + T, cfg.d_model)
    with torch.no_grad(), upcoming(T):
        _, state = store(x[:, :L])
    monkeypatch.setattr(type(store), "_read_mask", lambda *a: pytest.fail("forward built the read mask"))
    with torch.no_grad(), _Largest() as rec:
        store(x[:, L:], state)
    N = state.entries
    assert N == (L + T) // cfg.stride
    assert rec.largest <= 8 * 512 * 4 < T * N * 4 // 8, f"largest transient {rec.largest} bytes"
