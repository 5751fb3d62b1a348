"""CSA and HCA (DeepSeek-V4, arXiv 2606.19348): pooling, streaming, accounting, budget, essay claims."""

import pytest
import torch

from storelab.ops.attention import attend
from storelab.ops.compress import pool_entries, pool_entries_reference, readable_entries, select_topk
from storelab.stores import build_store
from storelab.stores.compressed import CSAConfig, HCAConfig
from tests.helpers import assert_close

TINY = dict(d_model=32, n_heads=2, head_dim=16, rope_dim=4, q_lora=12, o_groups=2, o_lora=8, window=6, quant_block=8)
TINY_CSA = dict(TINY, pool=8, stride=4, index_heads=2, index_head_dim=8, index_topk=3)
TINY_HCA = dict(TINY, pool=8)


def _build(kind: str, **over):
    cfg = CSAConfig(**{**TINY_CSA, **over}) if kind == "csa" else HCAConfig(**{**TINY_HCA, **over})
    torch.manual_seed(0)
    store = cfg.build()
    with torch.no_grad():   # learned biases and sinks start at 0: give them values
        for name, p in store.named_parameters():
            if name.endswith("bias") or name == "sinks":
                p.copy_(torch.randn(p.shape))
    return cfg, store


def _run_chunks(store, x, chunks):
    state, ys = None, []
    t = 0
    for c in chunks:
        y, state = store(x[:, t:t + c], state)
        ys.append(y)
        t += c
    assert t == x.shape[1]
    return torch.cat(ys, dim=1), state


# --- the pure pooling functions -------------------------------------------------------


@pytest.mark.parametrize("pool,stride", [(8, 4), (8, 8), (12, 4), (4, 4), (6, 2)])
def test_pool_entries_fast_equals_reference(pool, stride):
    gen = torch.Generator().manual_seed(pool * 10 + stride)
    S = pool // stride
    kv, z = torch.randn(2, 29, S, 5, generator=gen), torch.randn(2, 29, S, 5, generator=gen)
    bias = torch.randn(pool, 5, generator=gen)
    fast = pool_entries(kv, z, bias, stride=stride)
    assert fast.shape[1] == 29 // stride     # the first pool is partial: entry 0 pools the first stride block
    assert_close(fast, pool_entries_reference(kv, z, bias, stride=stride), 1e-5, "pool_entries")
    # streaming: the same entries from a later start, given the tokens their pools need
    first = 3
    start = max(0, first * stride + stride - pool)
    part = pool_entries(kv[:, start:], z[:, start:], bias, stride=stride, start=start, first=first)
    assert_close(part, fast[:, first:], 1e-6, "pool_entries from a later start")
    with pytest.raises(ValueError, match="start"):
        pool_entries(kv[:, start + 1:], z[:, start + 1:], bias, stride=stride, start=start + 1, first=first)


def test_an_entry_is_readable_only_once_its_pool_is_complete():
    r = readable_entries(torch.arange(12), 3, 4)
    assert r.sum(-1).tolist() == [0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3]
    # and entry 1 of a pool-8 stride-4 store does not depend on tokens after position 7
    kv, z = torch.randn(1, 12, 2, 3), torch.randn(1, 12, 2, 3)
    bias = torch.randn(8, 3)
    e = pool_entries(kv, z, bias, stride=4)
    kv2 = kv.clone()
    kv2[:, 8:] += 1.0
    e2 = pool_entries(kv2, z, bias, stride=4)
    assert torch.equal(e[:, :2], e2[:, :2]) and not torch.allclose(e[:, 2], e2[:, 2])


def test_select_topk_picks_the_best_readable():
    scores = torch.tensor([[[5.0, 1.0, 3.0, 9.0], [5.0, 1.0, 3.0, 9.0]]])
    readable = torch.tensor([[True, True, False, False], [True, True, True, True]])
    got = select_topk(scores, readable, 2)
    assert got.tolist() == [[[True, True, False, False], [True, False, False, True]]]


# --- the essay's claims about pooling (Section 3, "Compression pools positions") ----------


def test_two_facts_in_one_pool_cannot_be_separated():
    """Pooled, facts A and B are one vector: a query for A and a query for B read the same
    mix of A and B. Kept per token, the same two queries separate them."""
    C = 16
    eye = torch.eye(C)
    a, b = 3 * eye[0], 3 * eye[1]
    tokens = torch.zeros(1, 24, 1, C)
    tokens[0, 2, 0], tokens[0, 5, 0] = a, b          # both facts in pool 0 (tokens 0..7)
    for t in range(8, 24):                           # later pools: distractors, orthogonal to A and B
        tokens[0, t, 0] = eye[2 + t % (C - 2)]
    z = torch.randn(1, 24, 1, C)
    entries = pool_entries(tokens, z, torch.zeros(8, C), stride=8)[:, :, None]       # [1, 3, 1, C], HCA-like
    q_a, q_b = (5 * a)[None, None, None], (5 * b)[None, None, None]
    read_a = attend(q_a, entries, entries, scale=1.0)[0, 0, 0]
    read_b = attend(q_b, entries, entries, scale=1.0)[0, 0, 0]
    ratio = lambda r: (r @ a / (r @ b)).item()       # noqa: E731
    assert ratio(read_a) == pytest.approx(ratio(read_b), rel=1e-5)

    kept = tokens[:, [2, 5]]                         # the same facts kept one entry per token
    read_a = attend(q_a, kept, kept, scale=1.0)[0, 0, 0]
    read_b = attend(q_b, kept, kept, scale=1.0)[0, 0, 0]
    assert ratio(read_a) > 100 and ratio(read_b) < 0.01


def test_one_fact_spread_over_two_tokens_of_a_pool_still_reads():
    """Per-channel softmax weights let each channel take its half of the fact from its own token."""
    C = 16
    fact = torch.randn(C)
    tokens = torch.randn(1, 8, 1, C)                 # six other tokens: noise
    tokens[0, 2, 0, :8], tokens[0, 3, 0, 8:] = fact[:8], fact[8:]
    z = torch.zeros(1, 8, 1, C)
    z[0, 2, 0, :8] = z[0, 3, 0, 8:] = 12.0           # the pooling scores pick token 2 for the first half
    entry = pool_entries(tokens, z, torch.zeros(8, C), stride=8)[0, 0]
    assert torch.nn.functional.cosine_similarity(entry, fact, dim=0) > 0.999
    # one weight per token (the same in all channels) cannot do it
    z_flat = z.amax(-1, keepdim=True).expand_as(z)
    entry_flat = pool_entries(tokens, z_flat, torch.zeros(8, C), stride=8)[0, 0]
    assert torch.nn.functional.cosine_similarity(entry_flat, fact, dim=0) < 0.9


def test_store_cannot_tell_the_order_of_two_tokens_in_one_pool():
    """Swap two tokens inside one pool: a query beyond the window reads the same. Swap them
    across two pools: it does not."""
    cfg, store = _build("hca", window=1)
    with torch.no_grad():
        store.pooler.bias.zero_()                    # no position bias: a pool is a set of tokens
    x = torch.randn(1, 17, cfg.d_model)
    def swapped(i, j):                               # noqa: E306
        y = x.clone()
        y[:, [i, j]] = x[:, [j, i]]
        return y
    with torch.no_grad():
        base = store(x)[0][:, 16]
        inside = store(swapped(2, 5))[0][:, 16]
        across = store(swapped(2, 10))[0][:, 16]
    assert_close(inside, base, 1e-5, "swap inside a pool")
    assert (across - base).abs().max() > 1e-3


# --- streaming: chunked prefill + decode == one full pass ----------------------------


CHUNKINGS = [[29], [1] * 29, [3, 5, 7, 14], [4, 4, 8, 13], [9, 1, 1, 18], [7, 1, 6, 15], [5, 11, 13]]


@pytest.mark.parametrize("kind", ["csa", "hca"])
@pytest.mark.parametrize("fmt", [None, "fp8", "fp4"])
def test_prefill_then_step_equals_full_pass(kind, fmt):
    cfg, store = _build(kind, cache_format=fmt)
    x = torch.randn(2, 29, cfg.d_model, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full, full_state = store(x)
        for chunks in CHUNKINGS if fmt is None else CHUNKINGS[1:3] + CHUNKINGS[-2:-1]:
            y, state = _run_chunks(store, x, chunks)
            assert_close(y, full, 1e-5, f"{kind} {fmt} chunks {chunks}")
            assert state.seen == 29 and state.entries == full_state.entries
            assert state.nbytes() == full_state.nbytes()


def test_quantised_entries_stay_close_to_exact():
    cfg, exact = _build("csa")
    x = torch.randn(1, 29, cfg.d_model)
    with torch.no_grad():
        y32 = exact(x)[0]
        for fmt, tol in [("bf16", 0.02), ("fp8", 0.05), ("fp4", 0.5)]:
            _, q = _build("csa", cache_format=fmt)
            yq = q(x)[0]
            rel = ((yq - y32).norm() / y32.norm()).item()
            assert 0 < rel < tol, f"{fmt}: relative output error {rel:.3g}"


def test_causal():
    cfg, store = _build("csa")
    x = torch.randn(1, 24, cfg.d_model)
    x2 = x.clone()
    x2[:, 13:] += torch.randn(1, 11, cfg.d_model)
    with torch.no_grad():
        y, y2 = store(x)[0], store(x2)[0]
    assert_close(y2[:, :13], y[:, :13], 1e-6, "outputs before the change")
    assert (y2[:, 13:] - y[:, 13:]).abs().max() > 1e-3


# --- a reader of another layer's cache (cache_owner, DeepSeek-V4.1-Flash) ----------------

KV_PATH = ("kv_proj.", "kv_norm.", "pooler.", "index_pooler.")


@pytest.mark.parametrize("kind", ["csa", "hca"])
def test_reader_reads_the_owners_cache_and_holds_nothing(kind):
    """A reader with ``shared=`` the owner's cache equals a layer with the reader's query and
    output weights and the owner's KV-path weights, which writes an identical private copy."""
    cfg, owner = _build(kind)
    torch.manual_seed(1)
    reader = cfg.build()                                     # its own weights everywhere
    private = cfg.build()
    with torch.no_grad():
        for (name, p), q, o in zip(private.named_parameters(), reader.parameters(), owner.parameters()):
            p.copy_(o if name.startswith(KV_PATH) else q)
    x = torch.randn(2, 29, cfg.d_model, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want, copy = private(x)
        for chunks in ([29], [3, 5, 7, 14], [9, 1, 1, 18], [7, 1, 6, 15]):
            own = mine = None
            ys, t = [], 0
            for c in chunks:
                _, own = owner(x[:, t:t + c], own)
                y, mine = reader(x[:, t:t + c], mine, shared=own)
                ys.append(y)
                t += c
            assert_close(torch.cat(ys, 1), want, 1e-5, f"{kind} reader, chunks {chunks}")
            assert mine.nbytes() == 0 and mine.entries == 0 and mine.seen == 29
            assert own.nbytes() == copy.nbytes() > 0
        # the reader's own KV path is not used; its queries come from its own input
        for name, p in reader.named_parameters():
            if name.startswith(KV_PATH):
                p.add_(1.0)
        _, own = owner(x)
        assert_close(reader(x, shared=own)[0], want, 1e-5, "reader with other KV-path weights")
        x2 = x + torch.randn_like(x)
        assert (reader(x2, shared=own)[0] - want).abs().max() > 1e-3
        # a reader that runs ahead of the owner, or without it, is refused
        _, own = owner(x[:, :5])
        _, mine = reader(x[:, :5], shared=own)
        with pytest.raises(ValueError, match="shared"):
            reader(x[:, 5:7], mine, shared=own)
        with pytest.raises(ValueError, match="shared"):
            reader(x[:, 5:7], mine)


# --- accounting ------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["csa", "hca"])
@pytest.mark.parametrize("fmt", [None, "fp32", "bf16", "fp8", "fp4"])
@pytest.mark.parametrize("L", [1, 3, 6, 9, 31])
def test_nbytes_equals_footprint(kind, fmt, L):
    cfg, store = _build(kind, cache_format=fmt)
    with torch.no_grad():
        _, state = store(torch.randn(1, L, cfg.d_model))
    fp = cfg.footprint(L, dtype=fmt or "fp32")
    assert state.nbytes() == fp.state_bytes
    assert state.entries == fp.kept == L // cfg.stride


@pytest.mark.parametrize("kind", ["csa", "hca"])
def test_bf16_model_keeps_bf16_bytes(kind):
    cfg, store = _build(kind)
    store = store.to(torch.bfloat16)
    x = torch.randn(1, 21, cfg.d_model, dtype=torch.bfloat16)
    with torch.no_grad():
        y, state = store(x)
        y1, s1 = store(x[:, :10])
        y2, s1 = store(x[:, 10:], s1)
    assert y.dtype == torch.bfloat16
    assert state.nbytes() == s1.nbytes() == cfg.footprint(21, dtype="bf16").state_bytes
    assert_close(torch.cat([y1, y2], dim=1), y, 1e-2, "bf16 chunked")


@pytest.mark.parametrize("kind", ["csa", "hca"])
def test_num_params_counts_the_module(kind):
    cfg, store = _build(kind)
    n = sum(p.numel() for p in store.parameters())
    assert cfg.num_params().stored == cfg.num_params().active == n


def test_csa_reads_at_most_topk_plus_window():
    cfg, store = _build("csa")
    x = torch.randn(1, 40, cfg.d_model)
    state, counts = None, []
    with torch.no_grad():
        for chunk in [17, 1, 1, 9, 12]:
            t = state.seen if state else 0
            _, state, read = store.step(x[:, t:t + chunk], state)
            n_win = read.shape[-1] - state.entries
            win, pooled = read[..., :n_win].sum(-1), read[..., n_win:].sum(-1)
            pos = torch.arange(t, t + chunk)
            assert torch.equal(win[0], torch.clamp(pos + 1, max=cfg.window))
            assert torch.equal(pooled[0], torch.clamp((pos + 1) // cfg.stride, max=cfg.index_topk))
            counts.append(read.sum(-1))
    counts = torch.cat(counts, dim=-1)
    assert counts.max() == cfg.index_topk + cfg.window   # reached, never exceeded
    assert cfg.footprint(40).read == cfg.index_topk + cfg.window


def test_worked_example_2_a_million_tokens():
    L = 1_000_000
    csa = CSAConfig(d_model=7168).footprint(L)       # DeepSeek-V4-Pro defaults
    assert csa.kept == 250_000                       # "about 250,000", one per 4 tokens
    assert csa.read == 1024 + 128 and csa.scored == 250_000
    hca = HCAConfig(d_model=7168).footprint(L)
    assert hca.kept == 7_812                         # "about 7,800", one per 128 tokens
    assert hca.read == 7_812 + 128 and hca.scored == 0
    # V4-Pro's fp8 entry: 584 bytes; the CSA layer's cache is dominated by its pooled entries
    fp8 = CSAConfig(d_model=7168).footprint(L, dtype="fp8")
    assert fp8.state_bytes > 250_000 * (584 + 132) > 0.99 * fp8.state_bytes


# --- configs --------------------------------------------------------------------------


@pytest.mark.parametrize("kind,bad,field", [
    ("csa", dict(stride=16), "stride"),
    ("csa", dict(pool=0), "pool"),
    ("hca", dict(pool=-8), "pool"),
    ("csa", dict(pool=10), "pool"),
    ("csa", dict(window=0), "window"),
    ("hca", dict(window=-1), "window"),
    ("csa", dict(index_topk=0), "index_topk"),
    ("csa", dict(cache_format="int3"), "cache_format"),
    ("csa", dict(rope_dim=3), "rope_dim"),
    ("csa", dict(o_groups=3), "o_groups"),
])
def test_bad_configs_name_the_field(kind, bad, field):
    with pytest.raises(ValueError, match=field):
        (CSAConfig if kind == "csa" else HCAConfig)(**{**(TINY_CSA if kind == "csa" else TINY_HCA), **bad})


def test_registry_and_input_shape():
    cfg = build_store({"kind": "csa", **TINY_CSA})
    assert isinstance(cfg, CSAConfig) and cfg.to_dict()["kind"] == "csa"
    with pytest.raises(ValueError, match="index_topk"):
        build_store({"kind": "hca", **TINY_HCA, "index_topk": 4})    # HCA has no indexer
    store = cfg.build()
    with pytest.raises(ValueError, match="x_BTD"):
        store(torch.randn(1, 5, cfg.d_model + 1))
