"""Selection stores (dsa, hierarchical): chunked == full over stacks that share a
selection, the read budget, the sparse read vs a masked dense read, the pool,
accounting, and config errors. The oracle comparisons live in test_mla_oracle.py."""

from __future__ import annotations

import pytest
import torch

from storelab.ops.attention import causal_mask
from storelab.ops.indexer import block_pool, index_scores, index_scores_at, selection_mask, top_positions
from storelab.stores import build_store
from storelab.stores.base import observe
from storelab.stores.dsa import DSAConfig, HierarchicalConfig, SelectionCache, Selector, link_selection_states
from storelab.stores.mla import MLAConfig
from tests.helpers import assert_close

MLA = dict(d_model=32, n_heads=2, q_lora_rank=12, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4,
           v_head_dim=6)
IDX = dict(index_n_heads=2, index_head_dim=8)


def dsa(i: int, **over) -> DSAConfig:
    return DSAConfig(**{**MLA, **IDX, "index_topk": 5, "index_share_freq": 2, "index_share_offset": 1,
                        "layer_index": i, **over})


def hier(i: int, **over) -> HierarchicalConfig:
    return HierarchicalConfig(**{**MLA, **IDX, "topk": 3, "pool_size": 8, "pool_block": 4, "refresh_every": 2,
                                 "layer_index": i, **over})


def build_stack(cfgs, seed=0):
    torch.manual_seed(seed)
    return [c.build().double() for c in cfgs]


def run_stack(mods, cfgs, x, chunks):
    """Run layers in order over each chunk (no residual: each layer reads the same x); outputs per layer."""
    states = link_selection_states(cfgs)
    outs, t = [[] for _ in mods], 0
    for c in chunks:
        for j, m in enumerate(mods):
            y, states[j] = m(x[:, t:t + c], states[j])
            outs[j].append(y)
        t += c
    return [torch.cat(o, dim=1) for o in outs], states


STACKS = {
    "dsa": [dsa(i) for i in range(3)],                               # runs, reuses, runs
    "dsa-gated-norope": [dsa(i, use_rope=False, output_gate=True) for i in range(3)],
    "hierarchical": [hier(i) for i in range(5)],                     # root, reuse, refresh, reuse, refresh
}


@pytest.mark.parametrize("name", list(STACKS))
@pytest.mark.parametrize("chunks", [[1] * 10, [4, 4, 7], [3, 6, 1, 5], [8, 1, 6]])  # blocks of 4
def test_prefill_then_step_equals_full_pass(name, chunks):
    cfgs = STACKS[name]
    mods = build_stack(cfgs)
    T = sum(chunks)
    x = torch.randn(2, T, 32, dtype=torch.float64)
    full, _ = run_stack(mods, cfgs, x, [T])
    got, states = run_stack(mods, cfgs, x, chunks)
    for j in range(len(cfgs)):
        assert_close(got[j], full[j], 1e-5, f"{name} layer {j}, chunks {chunks}")
        assert states[j].seen == T and states[j].entries == T


@pytest.mark.parametrize("name", list(STACKS))
def test_nbytes_and_entries_equal_footprint(name):
    cfgs = STACKS[name]
    mods = [m.float() for m in build_stack(cfgs)]
    L = 13
    _, states = run_stack(mods, cfgs, torch.randn(1, L, 32), [L])
    for cfg, st in zip(cfgs, states):
        fp = cfg.footprint(L, dtype="fp32")
        assert st.nbytes() == fp.state_bytes, cfg.layer_index
        assert st.entries == fp.kept == L
        assert (st.index_k is None) == (not cfg.runs_indexer) == (fp.scored == 0)


def test_reads_never_exceed_the_budget():
    for cfgs, k, pool in [(STACKS["dsa"], 5, None), (STACKS["hierarchical"], 3, 8)]:
        mods = build_stack(cfgs)
        for chunks in ([14], [6, 1, 1, 1]):
            x = torch.randn(1, sum(chunks), 32, dtype=torch.float64)
            states = link_selection_states(cfgs)
            t = 0
            for c in chunks:
                for j, (cfg, m) in enumerate(zip(cfgs, mods)):
                    with observe(m) as seen:
                        _, states[j] = m(x[:, t:t + c], states[j])
                    log = seen.last(m, "reads")
                    visible = torch.arange(t, t + c) + 1
                    assert torch.equal(log.read[0], visible.clamp(max=k))  # min(visible, k), never more
                    scored = log.scored[0]
                    if not cfg.runs_indexer:
                        assert (scored == 0).all()
                    elif pool is not None and cfg.role == "refresh":
                        assert (scored <= pool).all() and (scored <= visible).all()
                    else:
                        assert torch.equal(scored, visible)
                t += c


def test_sparse_read_equals_masked_dense_read_and_mla_when_everything_fits():
    cfg = dsa(0)
    m = build_stack([cfg])[0]
    x = torch.randn(2, 17, 32, dtype=torch.float64)
    with observe(m) as seen:
        y, state = m(x)
    mask_BTL = selection_mask(seen.last(m, "selection"), seen.last(m, "reads").read[..., None] > torch.arange(5), 17)
    assert (mask_BTL.sum(-1) == torch.arange(1, 18).clamp(max=5)).all()
    assert not (mask_BTL & ~causal_mask(17, 17)).any()        # never a future position
    p = m.mla.project(x, torch.arange(17))
    naive = MLAConfig(**MLA).build().double()
    naive.load_state_dict(m.mla.state_dict())
    ref = naive.finish(naive.read_dense(p, state.latent, state.k_rope, mask_BTL[:, None]), x)
    assert_close(y, ref, 1e-6, "gathered read vs masked dense read")
    # with a budget at least the context, selection reads everything: plain MLA
    wide = DSAConfig(**MLA, **IDX, index_topk=64).build().double()
    wide.load_state_dict(m.state_dict())
    assert_close(wide(x)[0], naive(x)[0], 1e-6, "dsa with k >= L vs mla")


def test_hierarchical_pool_and_refresh_selection():
    cfgs = [hier(0), hier(1), hier(2)]
    mods = build_stack(cfgs)
    T = 23
    x = torch.randn(1, T, 32, dtype=torch.float64)
    with observe(*mods) as seen:
        _, states = run_stack(mods, cfgs, x, [T])
    selection = [seen.last(m, "selection") for m in mods]
    share = states[0].share
    assert states[1].share is share is states[2].share
    pool, pool_valid = share.pool_BTP, share.pool_valid_BTP
    assert pool.shape[-1] == 8                                   # 2 blocks of 4
    blocks = pool.view(1, T, 2, 4)
    assert (blocks[..., 0] % 4 == 0).all() and (blocks // 4 == blocks[..., :1] // 4).all()  # whole, aligned blocks
    root_sel = selection[0]
    for t in range(T):
        valid_pool = set(pool[0, t][pool_valid[0, t]].tolist())
        assert valid_pool == {s for s in pool[0, t].tolist() if s <= t} and len(valid_pool) <= 8
        # the root's own top 3 lie in its pool (2 blocks >= 3 needed? no: 2 < 3, so check only the best 2)
        assert set(root_sel[0, t, : min(2, t + 1)].tolist()) <= valid_pool
        # the refresh layer reads its own top 3 inside the pool: brute force over the masked full scores
        ref_sel = set(selection[2][0, t, : min(3, len(valid_pool))].tolist())
        assert ref_sel <= valid_pool
    # brute force for the refresh layer: its scores over all positions, restricted to the pool
    m2 = mods[2]
    pos = torch.arange(T)
    p = m2.mla.project(x, pos)
    q, w = m2.indexer.queries(x, p.q_src_BTQ, pos)
    in_pool = selection_mask(pool, pool_valid, T)
    with torch.no_grad():
        scores = index_scores(q, states[2].index_k, w, scale=m2.indexer.scale, mask_TL=in_pool[0])
    want, ok = top_positions(scores, 3)
    for t in range(T):
        assert set(want[0, t][ok[0, t]].tolist()) == set(selection[2][0, t][ok[0, t]].tolist())
    # the reuser between them read the root's selection
    assert torch.equal(selection[1], root_sel)


def test_block_pool_holds_the_top_positions():
    scores = torch.randn(3, 5, 40)
    scores[:, :, 33:] = float("-inf")
    pos, valid = block_pool(scores, block=8, n_blocks=4)
    top, _ = top_positions(scores, 4)
    for b in range(3):
        for t in range(5):
            assert set(top[b, t].tolist()) <= set(pos[b, t][valid[b, t]].tolist())
            assert not (pos[b, t][valid[b, t]] >= 33).any()


def test_published_footprints():
    glm = dict(d_model=6144, n_heads=64, q_lora_rank=2048, kv_lora_rank=512, qk_nope_head_dim=192,
               qk_rope_head_dim=64, v_head_dim=256, rope_theta=8e6, index_n_heads=32, index_head_dim=128,
               index_topk=2048, index_share_freq=4, index_share_offset=3, index_rope_interleaved=True)
    L = 1_000_000
    runs, reuses = DSAConfig(**glm, layer_index=6).footprint(L), DSAConfig(**glm, layer_index=7).footprint(L)
    assert (runs.read, runs.scored, reuses.scored) == (2048, L, 0)
    assert runs.state_bytes == L * (576 + 128) * 2 and reuses.state_bytes == L * 576 * 2
    assert DSAConfig(**glm, layer_index=7).num_params().stored < DSAConfig(**glm, layer_index=6).num_params().stored
    flash = {k: v for k, v in glm.items() if not k.startswith(("index_topk", "index_share"))}
    fps = [HierarchicalConfig(**flash, layer_index=i).footprint(L) for i in range(20)]
    assert [f.scored for f in fps[:6]] == [L, 0, 0, 0, 16384, 0]
    assert all(f.read == 512 for f in fps) and sum(f.scored == 16384 for f in fps) == 4


@pytest.mark.parametrize("cfg", [dsa(0), dsa(1), hier(0), hier(1), hier(2)], ids=lambda c: f"{c.KIND}{c.layer_index}")
def test_num_params_is_exact(cfg):
    m = cfg.build()
    assert cfg.num_params().stored == sum(p.numel() for p in m.parameters())


@pytest.mark.parametrize("make,bad,field", [
    (dsa, {"index_topk": 0}, "index_topk"), (dsa, {"index_share_freq": 0}, "index_share_freq"),
    (dsa, {"index_share_offset": -1}, "index_share_offset"), (dsa, {"index_n_heads": 0}, "index_n_heads"),
    (dsa, {"index_head_dim": 2}, "index_head_dim"), (hier, {"topk": 0}, "topk"),
    (hier, {"pool_size": 2, "pool_block": 2}, "pool_size"), (hier, {"pool_size": 10}, "pool_size"),
    (hier, {"refresh_every": 0}, "refresh_every"), (hier, {"n_heads": 0}, "n_heads")])
def test_bad_config_names_the_field(make, bad, field):
    with pytest.raises(ValueError, match=field):
        make(0, **bad)


def test_unknown_option_and_missing_share():
    with pytest.raises(ValueError, match="index_top_k"):
        build_store({"kind": "dsa", **MLA, **IDX, "index_topk": 4, "index_top_k": 4})
    with pytest.raises(ValueError, match="pool"):
        build_store({"kind": "hierarchical", **MLA, **IDX, "pool": 4})
    reuser = dsa(1).build()
    with pytest.raises(ValueError, match="state"):
        reuser(torch.randn(1, 3, 32))
    states = link_selection_states([dsa(0), dsa(1)])
    with pytest.raises(ValueError, match="state"):          # its group's indexer has not run on these tokens
        reuser(torch.randn(1, 3, 32), states[1])
    with pytest.raises(ValueError, match=r"layers\[0\]"):
        link_selection_states([dsa(1)])
    assert isinstance(states[0], SelectionCache) and states[0].share is states[1].share
    with pytest.raises(ValueError, match="role"):
        Selector(role="root", k=4, indexer=None)


def test_gathers_in_chunks_equal_one_gather(monkeypatch):
    import storelab.stores.mla as mla_mod

    cfgs = STACKS["hierarchical"][:3]
    mods = build_stack(cfgs)
    x = torch.randn(2, 12, 32, dtype=torch.float64)
    whole, _ = run_stack(mods, cfgs, x, [12])
    monkeypatch.setattr(mla_mod, "GATHER_BUDGET", 1)           # one query at a time
    pieces, _ = run_stack(mods, cfgs, x, [12])
    for a, b in zip(pieces, whole):
        assert_close(a, b, 1e-12, "chunked gather")
    q, k, w = torch.randn(2, 6, 3, 4), torch.randn(2, 9, 4), torch.randn(2, 6, 3)
    pos = torch.randint(0, 9, (2, 6, 5))
    ok = torch.rand(2, 6, 5) > 0.3
    full = index_scores(q, k, w, scale=0.5)
    want = full.gather(-1, pos).masked_fill(~ok, float("-inf"))
    for mg in (1, 1 << 24):
        got = index_scores_at(q, k, w, pos, ok, scale=0.5, max_gather=mg)
        assert torch.equal(torch.isfinite(got), ok)
        assert_close(got[ok], want[ok], 1e-6, "scores at")


@pytest.mark.parametrize("sparse", [False, True])
def test_indexer_learns_to_imitate_the_main_attention(sparse):
    torch.manual_seed(0)
    m = dsa(0, index_topk=4).build()
    x = torch.randn(2, 12, 32)
    opt = torch.optim.Adam(m.indexer.parameters(), lr=0.05)
    first = m.indexer_loss(x, sparse=sparse)
    first.backward()
    assert first.item() >= 0
    assert all(p.grad is None for p in m.mla.parameters())          # the loss trains the indexer alone
    assert all(p.grad is not None for p in m.indexer.parameters())
    for _ in range(30):
        opt.zero_grad()
        m.indexer_loss(x, sparse=sparse).backward()
        opt.step()
    assert m.indexer_loss(x, sparse=sparse).item() < 0.7 * first.item()
    with pytest.raises(ValueError, match="layer_index"):
        dsa(1).build().indexer_loss(x)
