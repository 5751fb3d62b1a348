"""The protocol pieces every store relies on: window ring buffer, registry errors, CLI JSON."""

import json

import pytest
import torch
from typer.testing import CliRunner

from storelab.cli import app
from storelab.ops.attention import attend, causal_mask
from storelab.state import KVCache, WindowCache
from storelab.stores import build_store
from tests.helpers import assert_close


@pytest.mark.parametrize("chunks", [[5], [2, 3], [1, 1, 1, 1, 1], [7, 1, 1], [3, 9]])
def test_window_cache_keeps_exactly_the_last_w(chunks):
    W = 4
    cache = WindowCache(window=W)
    allk = torch.randn(1, sum(chunks), 2, 3)
    t = 0
    for c in chunks:
        cache.write(allk[:, t:t + c], allk[:, t:t + c] * 2)
        t += c
        k, v = cache.ordered()
        want = allk[:, max(0, t - W):t]
        assert_close(k, want, 0, "window keys")
        assert_close(v, want * 2, 0, "window values")
        assert cache.entries == min(W, t)
        assert cache.nbytes() == want.numel() * 4 * 2


def test_kv_cache_appends():
    c = KVCache()
    c.append(torch.zeros(1, 3, 2, 4), torch.zeros(1, 3, 2, 5))
    c.append(torch.zeros(1, 2, 2, 4), torch.zeros(1, 2, 2, 5))
    assert c.entries == 5 and c.nbytes() == 5 * 2 * (4 + 5) * 4


def test_attend_matches_plain_softmax():
    q, k, v = torch.randn(2, 5, 4, 8), torch.randn(2, 5, 2, 8), torch.randn(2, 5, 2, 6)
    out = attend(q, k, v, scale=0.3, mask_TL=causal_mask(5, 5))
    kk, vv = k.repeat_interleave(2, 2), v.repeat_interleave(2, 2)
    s = torch.einsum("bthd,blhd->bhtl", q, kk) * 0.3
    s = s.masked_fill(~causal_mask(5, 5), float("-inf"))
    ref = torch.einsum("bhtl,blhd->bthd", s.softmax(-1), vv)
    assert_close(out, ref, 1e-5, "attend")


def test_unknown_store_kind_names_the_field():
    with pytest.raises(ValueError, match="kind"):
        build_store({"kind": "no-such-store"})


def test_stores_json_is_one_document():
    r = CliRunner().invoke(app, ["stores", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert isinstance(data, list)
    for row in data:
        assert set(row) == {"kind", "name", "written_by", "holds", "reading_costs", "forgets", "source"}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", ["causal", "window", "sinks", "empty_rows", "per_head", "none", "mqa"])
def test_fused_attend_equals_reference(case, dtype):
    from storelab.ops.attention import attend_reference, window_mask

    g = torch.Generator().manual_seed(0)
    B, T, L, H, G, K, V = 2, 5, 9, 4, 1 if case == "mqa" else 2, 8, 6
    q = torch.randn(B, T, H, K, generator=g, dtype=dtype)
    k = torch.randn(B, L, G, K, generator=g, dtype=dtype)
    v = torch.randn(B, L, G, V, generator=g, dtype=dtype)
    mask, sinks = causal_mask(T, L), None
    if case == "window":
        mask = window_mask(T, L, 3)
    if case == "sinks":
        sinks = torch.randn(H, generator=g, dtype=dtype)
    if case == "empty_rows":
        mask = mask.clone()
        mask[1] = False
    if case == "per_head":
        mask = torch.rand(B, H, T, L, generator=g) > 0.4
    if case == "none":
        mask = None
    out = attend(q, k, v, scale=0.37, mask_TL=mask, sinks_H=sinks)
    ref = attend_reference(q, k, v, scale=0.37, mask_TL=mask, sinks_H=sinks)
    assert_close(out, ref, 1e-5 if dtype == torch.float32 else 1e-10, f"attend {case}")
