"""Full and sliding-window softmax attention: cached == full pass, accounting, errors, LogN.

The per-token reference below is written independently of ``storelab.ops.attention``: one
query at a time, in float64, reading only the positions its rule allows.
"""

import math

import pytest
import torch

from storelab.stores import build_store
from storelab.stores.attention import AttentionConfig, WindowConfig, logn_factor
from tests.helpers import assert_close

D = 32


def _cfg(kind="attention", **kw):
    base = dict(d_model=D, n_heads=4, n_kv_heads=2, head_dim=8, v_head_dim=6, partial_rotary=0.5, rope_theta=100.0)
    base.update(kw)
    return build_store({"kind": kind, **base})


def _randomise(mod):
    torch.manual_seed(1)
    with torch.no_grad():
        for p in mod.parameters():
            p.normal_(0, 0.3)
    return mod


def _run_chunks(mod, x, chunks):
    state, ys = None, []
    t = 0
    for c in chunks:
        y, state = mod(x[:, t:t + c], state)
        ys.append(y)
        t += c
    return torch.cat(ys, dim=1), state


def reference(mod, x, window=None):
    """Per-token float64 attention from the module's own weights (no shared op used)."""
    c = mod.cfg
    m = _double(mod)
    x = x.double()
    B, T, _ = x.shape
    H, G, K, V = c.n_heads, c.n_kv_heads, c.head_dim, c.v_head_dim
    pos = torch.arange(T)
    q, k, v, gate = m.project(x, pos)  # projection is checked against the oracles separately
    if c.logn:  # undo the module's LogN so the reference applies it to the logits itself
        q = q / logn_factor(pos, c.logn_base).double()[None, :, None, None]
    out = torch.zeros(B, T, H, V, dtype=torch.float64)
    for t in range(T):
        lo = 0 if window is None else max(0, t - window)
        for h in range(H):
            g = h // (H // G)
            s = torch.einsum("bk,blk->bl", q[:, t, h], k[:, lo:t + 1, g]) * c.scale
            if c.logn:
                s = s * max(1.0, math.log(t + 1) / math.log(c.logn_base))
            if c.sink:
                s = torch.cat([s, m.sinks[h].expand(B, 1)], dim=1)
            p = torch.softmax(s, dim=1)[:, : t + 1 - lo]
            out[:, t, h] = torch.einsum("bl,blv->bv", p, v[:, lo:t + 1, g])
    return m.finish(out, gate).float()


def _double(mod):
    import copy
    return copy.deepcopy(mod).double()


ALL_ON = dict(gate=True, qk_norm=True, sink=True, logn=True, logn_base=3, qkv_bias=True, out_bias=True,
              value_scale=0.7)


@pytest.mark.parametrize("opts", [{}, ALL_ON, dict(partial_rotary=0.0, n_kv_heads=4, v_head_dim=8)])
def test_attention_matches_per_token_reference(opts):
    mod = _randomise(_cfg(**opts).build())
    x = torch.randn(2, 11, D)
    y, _ = mod(x)
    assert_close(y, reference(mod, x), 1e-5, "attention vs per-token reference")


@pytest.mark.parametrize("W", [1, 4])
def test_window_matches_per_token_reference(W):
    mod = _randomise(_cfg("window", window=W, **ALL_ON).build())
    x = torch.randn(2, 11, D)
    y, _ = mod(x)
    assert_close(y, reference(mod, x, window=W), 1e-5, "window vs per-token reference")


@pytest.mark.parametrize("chunks", [[12], [1] * 12, [5, 7], [3, 1, 8], [7, 5], [11, 1]])
def test_attention_prefill_then_step_equals_full(chunks):
    mod = _randomise(_cfg(**ALL_ON).build())
    x = torch.randn(2, 12, D)
    full, st_full = mod(x)
    got, st = _run_chunks(mod, x, chunks)
    assert_close(got, full, 1e-5, f"chunks {chunks}")
    assert st.seen == st_full.seen == 12 and st.entries == 12


@pytest.mark.parametrize("chunks", [[13], [1] * 13, [6, 7], [3, 2, 8], [4, 4, 5], [9, 1, 3], [2, 11]])
def test_window_prefill_then_step_equals_full(chunks):
    W = 4  # chunks of 6, 8, 9, 11 are longer than the window; 3+2 and 4+4 straddle it
    mod = _randomise(_cfg("window", window=W, **ALL_ON).build())
    x = torch.randn(2, 13, D)
    full, _ = mod(x)
    got, st = _run_chunks(mod, x, chunks)
    assert_close(got, full, 1e-5, f"chunks {chunks}")
    assert st.seen == 13 and st.entries == W


@pytest.mark.parametrize("query_block", [1, 3, 5])
def test_window_query_blocks_do_not_change_the_result(query_block):
    mod = _randomise(_cfg("window", window=4, **ALL_ON).build())
    x = torch.randn(2, 13, D)
    full, _ = mod(x)  # default query_block (256) covers the whole chunk
    mod.query_block = query_block
    assert_close(mod(x)[0], full, 1e-5, f"query_block {query_block}")


def test_window_rejects_a_state_of_another_window():
    mod = _cfg("window", window=4).build()
    _, st = _cfg("window", window=3).build()(torch.randn(1, 2, D))
    with pytest.raises(ValueError, match="state"):
        mod(torch.randn(1, 1, D), st)


@pytest.mark.parametrize("kind,L", [("attention", 1), ("attention", 9), ("window", 3), ("window", 4), ("window", 10)])
def test_nbytes_equal_footprint(kind, L):
    extra = {"window": 4} if kind == "window" else {}
    cfg = _cfg(kind, **extra)
    _, st = cfg.build()(torch.randn(1, L, D))
    fp = cfg.footprint(L, dtype="fp32")
    assert st.nbytes() == fp.state_bytes
    assert st.entries == fp.kept
    # decoding more tokens keeps the identity
    _, st = cfg.build()(torch.randn(1, 2, D), st)
    fp = cfg.footprint(L + 2, dtype="fp32")
    assert st.nbytes() == fp.state_bytes and st.entries == fp.kept


def test_footprint_worked_example_2():
    # Essay section 3: a full layer keeps and reads 1,000,000; a MiMo window layer keeps and reads 128.
    L = 1_000_000
    full = AttentionConfig(d_model=6144, n_heads=128, n_kv_heads=8, head_dim=192, v_head_dim=128)
    win = WindowConfig(d_model=6144, n_heads=128, n_kv_heads=8, head_dim=192, v_head_dim=128, window=128)
    f, w = full.footprint(L), win.footprint(L)
    assert (f.kept, f.read) == (L, L) and (w.kept, w.read) == (128, 128)
    assert f.state_bytes == L * 8 * (192 + 128) * 2
    assert w.state_bytes == 128 * 8 * (192 + 128) * 2
    assert w.read_flops == 2 * 128 * 128 * (192 + 128)
    assert win.footprint(100).kept == 100


@pytest.mark.parametrize("opts", [{}, ALL_ON, dict(gate=True, v_head_dim=8, n_kv_heads=4)])
@pytest.mark.parametrize("kind", ["attention", "window"])
def test_num_params_exact(kind, opts):
    cfg = _cfg(kind, **opts, **({"window": 3} if kind == "window" else {}))
    n = sum(p.numel() for p in cfg.build().parameters())
    assert cfg.num_params().stored == n == cfg.num_params().active


@pytest.mark.parametrize("bad,field", [
    ({"window": 0}, "window"),
    ({"window": -3}, "window"),
    ({"n_kv_heads": 3}, "n_kv_heads"),
    ({"partial_rotary": 1.5}, "partial_rotary"),
    ({"partial_rotary": -0.1}, "partial_rotary"),
    ({"partial_rotary": 0.375}, "partial_rotary"),  # int(8 * 0.375) = 3 channels: odd, cannot pair
    ({"head_dim": 0}, "head_dim"),
    ({"logn_base": 1}, "logn_base"),
    ({"attn_scale": -1.0}, "attn_scale"),
    ({"no_such_option": 1}, "no_such_option"),
])
def test_bad_configs_name_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        _cfg("window", **{"window": 4, **bad})


def test_wrong_input_shape_names_the_shape():
    for kind, extra in [("attention", {}), ("window", {"window": 2})]:
        mod = _cfg(kind, **extra).build()
        with pytest.raises(ValueError, match=rf"\[B, T, {D}\]"):
            mod(torch.randn(1, 3, D + 1))
        with pytest.raises(ValueError, match="expected shape"):
            mod(torch.randn(3, D))


def test_logn_factor_is_one_below_base_and_grows_as_log():
    base = 16
    p = torch.arange(0, 200)
    f = logn_factor(p, base)
    assert torch.all(f[: base] == 1.0)  # positions 0..15: p + 1 <= base
    beyond = p[base:]
    assert_close(f[base:], (torch.log(beyond.double() + 1) / math.log(base)).float(), 1e-6, "logn beyond base")
    assert torch.all(f[base + 1:] > 1.0) and torch.all(f[1:] >= f[:-1])
    assert abs(logn_factor(torch.tensor([base * base - 1]), base).item() - 2.0) < 1e-6  # log_b(b^2) = 2


def test_logn_changes_nothing_within_base_and_sharpens_beyond():
    x = torch.randn(1, 10, D)
    plain = _randomise(_cfg().build())
    within = _cfg(logn=True, logn_base=10)
    within_mod = within.build()
    within_mod.load_state_dict(plain.state_dict())
    assert_close(within_mod(x)[0], plain(x)[0], 0, "logn inside its base")
    beyond_mod = _cfg(logn=True, logn_base=4).build()
    beyond_mod.load_state_dict(plain.state_dict())
    yb, yp = beyond_mod(x)[0], plain(x)[0]
    assert_close(yb[:, :4], yp[:, :4], 0, "first base positions untouched")
    assert (yb[:, 4:] - yp[:, 4:]).abs().max() > 1e-4
