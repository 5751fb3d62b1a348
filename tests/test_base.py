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
        assert set(row) == {"name", "written_by", "holds", "reading_costs", "forgets", "source"}
