"""MiniMax sparse attention (MSA): selection vs the oracle and a per-query reference, caching,
the read budget, accounting and errors."""

import pytest
import torch

from storelab.stores import build_store, observe
from storelab.stores.msa import MsaConfig
from tests.helpers import assert_close, capture, tiny_hf_model

D = 32


def _cfg(**kw):
    base = dict(kind="msa", d_model=D, n_heads=4, n_kv_heads=2, head_dim=8, partial_rotary=0.5, rope_theta=100.0,
                block_size=4, top_blocks=3, local_blocks=1, index_head_dim=8)
    base.update(kw)
    return build_store(base)


def _randomise(mod, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in mod.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.4)
    return mod


def reference_blocks(mod, x):
    """Per query and group, in plain Python: block maxima of the index scores, forced blocks, top-k."""
    c = mod.cfg
    T = x.shape[1]
    q, k = mod.index(x, torch.arange(T))
    out = {}
    for b in range(x.shape[0]):
        for g in range(c.n_kv_heads):
            for t in range(T):
                s = (k[b, : t + 1] @ q[b, t, g]).tolist()
                best = {}
                for pos, v in enumerate(s):
                    best[pos // c.block_size] = max(best.get(pos // c.block_size, -1e30), v)
                forced = {max(t // c.block_size - j, 0) for j in range(c.local_blocks)}
                if c.include_first_block:
                    forced.add(0)
                rest = sorted((blk for blk in best if blk not in forced), key=lambda blk: -best[blk])
                out[b, g, t] = sorted(forced | set(rest[: c.top_blocks - len(forced)]))
    return out


def _chosen(blocks_BGTk):
    B, G, T, _ = blocks_BGTk.shape
    return {(b, g, t): sorted(i for i in blocks_BGTk[b, g, t].tolist() if i >= 0)
            for b in range(B) for g in range(G) for t in range(T)}


@pytest.mark.parametrize("opts", [{}, dict(local_blocks=2), dict(include_first_block=True), dict(top_blocks=1)])
def test_selection_matches_per_query_reference(opts):
    mod = _randomise(_cfg(**opts).build())
    x = torch.randn(2, 23, D)
    with torch.no_grad(), observe(mod) as seen:
        mod(x)
    assert _chosen(seen.last(mod, "blocks")) == reference_blocks(mod, x)
    if opts.get("include_first_block"):
        assert all(0 in v for v in _chosen(seen.last(mod, "blocks")).values())


@pytest.mark.parametrize("chunks", [[19], [1] * 19, [3, 5, 11], [4, 4, 4, 7], [9, 10], [2, 1, 16]])
def test_prefill_then_step_equals_full(chunks):
    mod = _randomise(_cfg(sink=True, gate=True, include_first_block=True).build())
    x = torch.randn(2, 19, D)
    with torch.no_grad(), observe(mod) as seen:
        full, _ = mod(x)
        full_blocks, full_counts = _chosen(seen.last(mod, "blocks")), seen.last(mod, "read_counts").clone()
        st, ys, counts, t = None, [], [], 0
        chosen = {}
        for c in chunks:
            y, st = mod(x[:, t:t + c], st)
            ys.append(y)
            counts.append(seen.last(mod, "read_counts"))
            chosen.update({(b, g, t + i): v for (b, g, i), v in _chosen(seen.last(mod, "blocks")).items()})
            t += c
    assert_close(torch.cat(ys, 1), full, 1e-5, f"chunks {chunks}")
    assert chosen == full_blocks
    assert torch.equal(torch.cat(counts, -1), full_counts)
    assert st.seen == 19 and st.entries == 19


@pytest.mark.parametrize("query_block", [1, 4, 7])
def test_query_slices_do_not_change_anything(query_block):
    mod = _randomise(_cfg(include_first_block=True).build())
    x = torch.randn(2, 19, D)
    with torch.no_grad(), observe(mod) as seen:
        full, _ = mod(x)
        blocks, counts = _chosen(seen.last(mod, "blocks")), seen.last(mod, "read_counts")
        mod.query_block = query_block
        y, _ = mod(x)
    assert_close(y, full, 1e-5, f"query_block {query_block}")
    assert _chosen(seen.last(mod, "blocks")) == blocks and torch.equal(seen.last(mod, "read_counts"), counts)


def test_reads_never_exceed_the_budget_and_fill_it_when_possible():
    cfg = _cfg(block_size=4, top_blocks=3, include_first_block=True)
    mod = _randomise(cfg.build())
    x = torch.randn(1, 40, D)
    with torch.no_grad(), observe(mod) as seen:
        mod(x)
    counts = seen.last(mod, "read_counts")  # [B, G, T]
    assert counts.max().item() <= cfg.budget == cfg.footprint(40).read
    # a query reads every earlier position while they fit, then 2 whole blocks + its partial own block
    pos = torch.arange(40)
    expected = torch.where(pos < 12, pos + 1, 2 * 4 + pos % 4 + 1)
    assert torch.equal(counts[0, 0], expected) and torch.equal(counts[0, 1], expected)


def test_dense_limit_equals_full_attention():
    cfg = _cfg(top_blocks=10, block_size=4, gate=True)
    mod = _randomise(cfg.build())
    full_cfg = build_store({k: v for k, v in cfg.to_dict().items()
                            if k not in ("block_size", "top_blocks", "local_blocks", "include_first_block",
                                         "index_head_dim")} | {"kind": "attention"})
    full = full_cfg.build()
    full.load_state_dict({k: v for k, v in mod.state_dict().items() if not k.startswith("index_")})
    x = torch.randn(2, 17, D)
    with torch.no_grad():
        assert_close(mod(x)[0], full(x)[0], 1e-5, "msa with budget >= L vs attention")


@pytest.mark.parametrize("L", [1, 5, 8, 13])
def test_nbytes_equal_footprint(L):
    cfg = _cfg()
    with torch.no_grad():
        _, st = cfg.build()(torch.randn(1, L, D))
    fp = cfg.footprint(L, dtype="fp32")
    assert st.nbytes() == fp.state_bytes and st.entries == fp.kept == fp.scored == L
    assert st.idx_k.shape == (1, L, 8)


def test_footprint_worked_example_2():
    # Essay section 3: MiniMax-M3 keeps all 1,000,000 entries but reads 16 blocks of 128 = 2,048 per group.
    m3 = MsaConfig(d_model=6144, n_heads=64, n_kv_heads=4, head_dim=128, partial_rotary=0.5, rope_theta=5e6)
    fp = m3.footprint(1_000_000)
    assert (fp.kept, fp.read, fp.scored) == (1_000_000, 2048, 1_000_000)
    assert fp.state_bytes == 1_000_000 * (4 * 256 + 128) * 2
    assert m3.footprint(1000).read == 1000


@pytest.mark.parametrize("opts", [{}, dict(qk_norm=False), dict(gate=True, sink=True, qkv_bias=True, v_head_dim=6)])
def test_num_params_exact(opts):
    cfg = _cfg(**opts)
    n = sum(p.numel() for p in cfg.build().parameters())
    assert cfg.num_params() == type(cfg.num_params())(n, n)


@pytest.mark.parametrize("bad,field", [
    ({"block_size": 0}, "block_size"),
    ({"top_blocks": 0}, "top_blocks"),
    ({"top_blocks": 1, "include_first_block": True}, "top_blocks"),
    ({"local_blocks": -1}, "local_blocks"),
    ({"index_head_dim": 2}, "index_head_dim"),
    ({"n_kv_heads": 3}, "n_kv_heads"),
    ({"partial_rotary": 2.0}, "partial_rotary"),
    ({"topk": 4}, "topk"),
])
def test_bad_configs_name_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        _cfg(**bad)


def test_wrong_input_shape_names_the_shape():
    with pytest.raises(ValueError, match=rf"\[B, T, {D}\]"):
        _cfg().build()(torch.randn(2, 3, 5))


# -- oracle: transformers' MiniMax-M3 (text) sparse layer ------------------------------------------

def _minimax():
    return tiny_hf_model(
        "minimax_m3_vl_text", hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
        vocab_size=128, intermediate_size=96, head_dim=16, rotary_dim=8, num_local_experts=4, num_experts_per_tok=2,
        dense_intermediate_size=96, shared_intermediate_size=32, index_n_heads=2, index_head_dim=16,
        index_block_size=8, index_topk_blocks=2, index_local_blocks=1,
        layer_types=["full_attention", "minimax_m3_sparse", "full_attention", "minimax_m3_sparse"],
        # transformers reads the rotary width from rope_parameters, not from rotary_dim: say 8 of 16 there
        rope_parameters={"rope_type": "default", "rope_theta": 5e6, "partial_rotary_factor": 0.5},
        attn_implementation="eager")


def test_msa_matches_minimax_m3_indexer_and_sparse_layer():
    model = _minimax()
    layer = 3
    hf = model.model.layers[layer].self_attn
    assert hf.indexer is not None
    norms = [hf.q_norm, hf.k_norm, hf.indexer.q_norm, hf.indexer.k_norm]
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for n in norms:  # they start at zero (Gemma-style scale 1 + w): make them matter
            n.weight.copy_(torch.randn(n.weight.shape, generator=g) * 0.5)
    ids = torch.randint(0, 128, (2, 43), generator=torch.Generator().manual_seed(0))
    _, _, hf_blocks = capture(model, hf.indexer, ids)
    _, kw, out = capture(model, hf, ids)

    cfg = build_store({"kind": "msa", "d_model": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16,
                       "partial_rotary": 0.5, "rope_theta": 5e6, "qk_norm": True, "block_size": 8,
                       "top_blocks": 2, "local_blocks": 1, "index_head_dim": 16,
                       "norm_eps": model.config.rms_norm_eps})
    ours = cfg.build()
    with torch.no_grad(), observe(ours) as seen:
        for dst, src in [(ours.q_proj, hf.q_proj), (ours.k_proj, hf.k_proj), (ours.v_proj, hf.v_proj),
                         (ours.o_proj, hf.o_proj), (ours.index_q, hf.indexer.q_proj),
                         (ours.index_k, hf.indexer.k_proj)]:
            dst.weight.copy_(src.weight)
        for dst, src in [(ours.q_norm, hf.q_norm), (ours.k_norm, hf.k_norm),
                         (ours.index_q_norm, hf.indexer.q_norm), (ours.index_k_norm, hf.indexer.k_norm)]:
            dst.weight.copy_(1.0 + src.weight)
        y, _ = ours(kw["hidden_states"])
    assert hf_blocks.shape == seen.last(ours, "blocks").shape
    assert _chosen(seen.last(ours, "blocks")) == _chosen(hf_blocks)
    assert ((seen.last(ours, "blocks") < 0) == (hf_blocks < 0)).all()
    assert_close(y, out[0], 1e-5, "MiniMaxM3VLAttention (sparse layer)")
    # the selection is not trivial: some query leaves out a block it could have read
    assert (seen.last(ours, "read_counts") < torch.arange(1, 44)).any()
