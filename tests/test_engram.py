"""Engram: hashing against a plain per-token loop, same n-gram -> same rows, collisions
share a row, a constant number of lookups, chunked == full, state bytes, gate range."""

import math

import pytest
import torch

from storelab.ops.norm import rms_norm
from storelab.ops.routing import is_prime, next_prime
from storelab.state import loose_views
from storelab.stores import build_store, observe
from storelab.stores.engram import EngramConfig, EngramState
from tests.helpers import assert_close

D, VOCAB = 16, 50


def _cfg(**kw):
    base = dict(d_model=D, vocab_size=VOCAB, orders=(2, 3, 4), heads_per_order=2, rows=101, head_dim=4)
    return EngramConfig(**{**base, **kw})


def _trial_division(n):
    return n >= 2 and all(n % d for d in range(2, math.isqrt(n) + 1))


def test_primes():
    assert all(is_prime(n) == _trial_division(n) for n in range(3000))
    assert [next_prime(n) for n in (0, 2, 14, 17, 65536)] == [2, 2, 17, 17, 65537]
    sizes = _cfg(rows=1000).table_sizes()
    assert len(set(sizes)) == 6 and all(is_prime(p) and p >= 1000 for p in sizes)
    assert sizes == sorted(sizes) and sizes[0] == 1009


def test_rows_match_a_plain_hash_loop():
    torch.manual_seed(0)
    cfg = _cfg()
    m = cfg.build()
    ids = torch.randint(0, VOCAB, (2, 7))
    rows = m.rows(ids)
    J = max(cfg.orders)
    mult, primes, offs = m.multipliers.tolist(), m.primes.tolist(), m.offsets.tolist()
    for b in range(2):
        seq = [cfg.pad_id] * (J - 1) + ids[b].tolist()
        for t in range(7):
            s = 0
            for n in cfg.orders:
                for _ in range(cfg.heads_per_order):
                    mix = 0
                    for j in range(n):
                        mix ^= seq[J - 1 + t - j] * mult[s][j]
                    assert mix < 2 ** 63
                    assert rows[b, t, s].item() == mix % primes[s] + offs[s]
                    s += 1


def test_same_ngram_same_rows_and_orders_see_their_own_length():
    cfg = _cfg(rows=100_003)
    m = cfg.build()
    #                0  1  2  3  4  5  6  7  8  9
    ids = torch.tensor([[5, 6, 7, 8, 9, 5, 6, 7, 8, 1]])
    rows = m.rows(ids)
    assert torch.equal(rows[0, 3], rows[0, 8])                 # same 4-gram (5,6,7,8): every lookup equal
    ids2 = torch.tensor([[1, 2, 7, 8, 9, 3, 4, 7, 8, 1]])     # only the bigram (7, 8) repeats
    rows2 = m.rows(ids2)
    bigram = slice(0, cfg.heads_per_order)
    assert torch.equal(rows2[0, 3, bigram], rows2[0, 8, bigram])
    assert (rows2[0, 3, cfg.heads_per_order:] != rows2[0, 8, cfg.heads_per_order:]).all()


def test_collisions_share_a_row():
    # 2 rows per table (primes 2, 3, ...) and 20 distinct bigrams: some collide in lookup 0
    cfg = EngramConfig(d_model=D, vocab_size=VOCAB, orders=(2,), heads_per_order=1, rows=2, head_dim=4)
    m = cfg.build()
    assert cfg.table_sizes() == [2]
    ids = torch.arange(21).reshape(1, 21)
    rows = m.rows(ids)[0, 1:, 0]                               # bigrams (t-1, t) for t = 1..20, all distinct
    a, b = [i for i in range(20) if rows[i] == rows[0]][:2]
    assert a != b
    x = torch.randn(1, 21, D)
    y0, _ = m(x, token_ids=ids)
    with torch.no_grad():
        m.table.weight[rows[0]] += 1.0                         # write the shared row once ...
    y1, _ = m(x, token_ids=ids)
    changed = (y1 - y0).abs().amax(-1)[0, 1:] > 1e-6
    assert changed[a] and changed[b]                           # ... and both n-grams read the change


def test_lookups_per_token_do_not_grow_with_the_tables():
    reads, actives, stored = set(), set(), []
    for rows in (11, 1_000, 1_000_000):
        cfg = _cfg(rows=rows)
        reads.add(cfg.footprint(4096).read)
        actives.add(cfg.num_params().active)
        stored.append(cfg.num_params().stored)
        if rows <= 1_000:
            assert cfg.build().rows(torch.zeros(1, 5, dtype=torch.long)).shape == (1, 5, 6)
    assert reads == {6} and len(actives) == 1 and stored == sorted(stored)


@pytest.mark.parametrize("conv_kernel", [0, 4])
@pytest.mark.parametrize("chunks", [[10], [1] * 10, [2, 1, 3, 4], [3, 7], [1, 9]])
def test_chunked_equals_full_and_state_bytes(conv_kernel, chunks):
    torch.manual_seed(1)
    cfg = _cfg(conv_kernel=conv_kernel)
    m = cfg.build()
    x, ids = torch.randn(2, 10, D), torch.randint(0, VOCAB, (2, 10))
    full, _ = m(x, token_ids=ids)
    st, outs, t = None, [], 0
    for c in chunks:
        y, st = m(x[:, t:t + c], st, token_ids=ids[:, t:t + c])
        outs.append(y)
        t += c
        fp = cfg.footprint(t, dtype="fp32")
        assert isinstance(st, EngramState) and st.seen == t
        assert st.nbytes() == 2 * fp.state_bytes                 # footprint is for batch 1
        assert st.entries == fp.kept == 3
        assert loose_views(st) == []                              # the tails are copies, not views of the call
    assert_close(torch.cat(outs, 1), full, 1e-5, "chunked")
    assert torch.equal(st.ids, ids[:, -3:])


def test_state_at_batch_one_equals_footprint_before_the_tail_fills():
    cfg = _cfg(conv_kernel=4)
    m = cfg.build()
    _, st = m(torch.randn(1, 2, D), token_ids=torch.tensor([[3, 4]]))
    assert st.ids.tolist() == [[cfg.pad_id, 3, 4]]
    assert st.nbytes() == cfg.footprint(2, dtype="fp32").state_bytes == 3 * 8 + 3 * 4 * D * 4


def test_forward_by_hand_and_gate_in_unit_interval():
    torch.manual_seed(2)
    cfg = _cfg()
    m = cfg.build().double()
    with torch.no_grad():
        m.norm_key.weight.copy_(torch.rand(D) + 0.5)
        m.norm_query.weight.copy_(torch.rand(D) + 0.5)
    x, ids = 30 * torch.randn(1, 6, D, dtype=torch.float64), torch.randint(0, VOCAB, (1, 6))
    with observe(m) as seen:
        y, _ = m(x, token_ids=ids)
    rows = m.rows(ids)
    for t in range(6):
        e = torch.cat([m.table.weight[r] for r in rows[0, t]])
        k = rms_norm(m.key_proj.weight @ e, m.norm_key.weight, cfg.norm_eps)
        q = rms_norm(x[0, t], m.norm_query.weight, cfg.norm_eps)
        g = (k @ q).item() / math.sqrt(D)
        a = 1 / (1 + math.exp(-math.copysign(math.sqrt(max(abs(g), 1e-6)), g)))
        assert_close(y[0, t], a * (m.value_proj.weight @ e), 1e-10, f"token {t}")
    assert ((seen.last(m, "gate") > 0) & (seen.last(m, "gate") < 1)).all()


def test_num_params_count_the_module():
    for kw in (dict(), dict(conv_kernel=4), dict(orders=(2,), heads_per_order=3)):
        cfg = _cfg(**kw)
        assert cfg.num_params().stored == sum(p.numel() for p in cfg.build().parameters())
        E = cfg.lookups * cfg.head_dim
        assert cfg.num_params().active == E + cfg.num_params().stored - sum(cfg.table_sizes()) * cfg.head_dim


def test_deepseek_v4_1_flash_tables_from_config_alone():
    # 2 layers x 3 orders x 8 heads x ~16M rows x 256 dims: the published 196B of Engram tables
    cfg = EngramConfig(d_model=5120, vocab_size=129280, orders=(2, 3, 4), heads_per_order=8, rows=16_000_000,
                       head_dim=256)
    tables = sum(cfg.table_sizes()) * cfg.head_dim
    assert 195e9 < 2 * tables < 198e9
    assert cfg.footprint(1_000_000).read == 24 and cfg.footprint(1_000_000).state_bytes == 3 * 8


@pytest.mark.parametrize("bad,field", [
    (dict(orders=()), "orders"), (dict(orders=(2, 2)), "orders"), (dict(orders=(0, 2)), "orders"),
    (dict(pad_id=VOCAB), "pad_id"), (dict(rows=0), "rows"), (dict(heads_per_order=0), "heads_per_order"),
    (dict(head_dim=0), "head_dim"), (dict(vocab_size=0), "vocab_size"), (dict(conv_kernel=-1), "conv_kernel"),
])
def test_bad_config_names_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        _cfg(**bad)


def test_bad_inputs_name_token_ids():
    m = _cfg().build()
    x = torch.randn(1, 4, D)
    with pytest.raises(ValueError, match="token_ids"):
        m(x)
    with pytest.raises(ValueError, match="token_ids"):
        m(x, token_ids=torch.zeros(1, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="token_ids"):
        m(x, token_ids=torch.full((1, 4), VOCAB))
    cfg = build_store({"kind": "engram", "d_model": D, "vocab_size": VOCAB, "orders": [2, 3]})
    assert cfg.orders == (2, 3)
    with pytest.raises(ValueError, match="n_tables"):
        build_store({**cfg.to_dict(), "n_tables": 4})


def test_short_conv_is_the_papers_causal_dilated_conv():
    # Y = V + SiLU(conv(RMSNorm(V))), kernel 4, dilation max(orders), zero history (engram_demo_v1's ShortConv)
    torch.manual_seed(3)
    cfg = _cfg(conv_kernel=4)
    m = cfg.build().double()
    x, ids = torch.randn(1, 13, D, dtype=torch.float64), torch.randint(0, VOCAB, (1, 13))
    y, _ = m(x, token_ids=ids)
    plain = _cfg().build().double()
    plain.load_state_dict({k: v for k, v in m.state_dict().items() if k in plain.state_dict()})
    v, _ = plain(x, token_ids=ids)
    conv = torch.nn.Conv1d(D, D, 4, groups=D, bias=False, padding=3 * 4, dilation=4).double()
    with torch.no_grad():
        conv.weight.copy_(m.conv_weight[:, None, :])
    u = rms_norm(v, m.norm_conv.weight, cfg.norm_eps)
    want = v + torch.nn.functional.silu(conv(u.transpose(1, 2))[..., :13].transpose(1, 2))
    assert_close(y, want, 1e-12, "short conv")


def test_gradients_reach_only_the_rows_read():
    torch.manual_seed(4)
    m = _cfg(rows=1000).build()
    ids = torch.randint(0, VOCAB, (1, 6))
    y, _ = m(torch.randn(1, 6, D), token_ids=ids)
    y.sum().backward()
    touched = m.table.weight.grad.abs().sum(-1).nonzero().flatten()
    assert set(touched.tolist()) <= set(m.rows(ids).flatten().tolist())
    assert m.key_proj.weight.grad.abs().sum() > 0 and m.value_proj.weight.grad.abs().sum() > 0
