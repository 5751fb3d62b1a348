"""Stores over depth: Sinkhorn, the essay's worked examples 4 and 5, the protocol of the
residual, mHC (incl. Single-Pass) and AttnRes mixers, their accounting and their errors."""

import math

import pytest
import torch

from storelab.ops.norm import rms_norm
from storelab.ops.sinkhorn import sinkhorn
from storelab.stores import ParamCount, build_store
from storelab.stores.depth import (
    AttnResConfig, MHCConfig, ResidualConfig, attnres_scores, depth_attend, mhc_collapse, mhc_combine,
)
from tests.helpers import assert_close

D = 8


def run_pass(cfg, h, ys, n_sublayers):
    """Drive the protocol with fixed sublayer outputs; return (mixers, reads, states, head output)."""
    torch.manual_seed(1)
    mixers = [cfg.build(sublayer=s, n_sublayers=n_sublayers) for s in range(n_sublayers)]
    for m in mixers:  # nonzero parameters so every coefficient matters
        for p in m.parameters():
            p.data = torch.randn_like(p) * 0.5
    head = cfg.build_head(n_sublayers=n_sublayers)
    ds = mixers[0].init(h)
    reads, states = [], [ds]
    for m, y in zip(mixers, ys):
        reads.append(m.read(ds))
        ds = m.write(ds, y)
        states.append(ds)
    return mixers, reads, states, head(ds)


# ----------------------------------------------------------------------------- Sinkhorn
def test_sinkhorn_rows_and_columns_sum_to_one():
    torch.manual_seed(0)
    m = sinkhorn(torch.randn(3, 5, 4, 4) * 0.5, 20, 1e-6)  # logits of the spread mHC starts from
    assert (m >= 0).all()
    assert_close(m.sum(-1), torch.ones(3, 5, 4), 1e-5, "row sums")
    assert_close(m.sum(-2), torch.ones(3, 5, 4), 1e-5, "column sums")


def test_sinkhorn_wide_logits_need_more_rounds():
    torch.manual_seed(0)
    x = torch.randn(50, 4, 4) * 2
    row_err = [(sinkhorn(x, it, 1e-6).sum(-1) - 1).abs().max().item() for it in (5, 20, 200)]
    assert row_err[0] > row_err[1] > row_err[2] and row_err[1] > 1e-5  # converging, not yet there
    assert_close(sinkhorn(x, 5, 1e-6).sum(-2), torch.ones(50, 4), 1e-5, "columns exact at any round")


def test_sinkhorn_one_round_is_softmax_then_columns():
    x = torch.randn(4, 4)
    p = x.softmax(-1) + 1e-6
    assert_close(sinkhorn(x, 1, 1e-6), p / (p.sum(0, keepdim=True) + 1e-6), 1e-7, "one round")
    # a few rounds are not yet converged: rows are still off
    assert (sinkhorn(x * 4, 2, 1e-6).sum(-1) - 1).abs().max() > 1e-4


def test_sinkhorn_rejects_bad_arguments():
    with pytest.raises(ValueError, match="iters"):
        sinkhorn(torch.zeros(2, 2), 0)
    with pytest.raises(ValueError, match="logits"):
        sinkhorn(torch.zeros(2, 3), 5)


# ----------------------------------------------------------------------- worked examples
def test_worked_example_4_mixing_two_streams():
    x = torch.tensor([2.0, 4.0]).view(1, 1, 2, 1)               # two scalar streams
    mix = torch.tensor([[0.75, 0.25], [0.25, 0.75]]).view(1, 1, 2, 2)
    mixed = mhc_combine(x, torch.zeros(1, 1, 1), torch.zeros(1, 1, 2), mix)
    assert mixed.flatten().tolist() == [2.5, 3.5]
    assert mixed.sum().item() == 6.0                             # the total is conserved
    read = mhc_collapse(x, torch.tensor([0.5, 0.5]).view(1, 1, 2))  # the block reads the average
    assert read.item() == 3.0
    y = 2 * read                                                 # ... and computes 6
    out = mhc_combine(x, y, torch.tensor([0.5, 0.5]).view(1, 1, 2), mix)  # half to each stream
    assert out.flatten().tolist() == [5.5, 6.5]


def test_worked_example_5_retrieval_over_depth():
    values = torch.tensor([[1.0, 0.0], [0.0, 2.0]]).view(1, 1, 2, 2)
    scores = torch.tensor([0.0, math.log(3.0)]).view(1, 1, 2)
    assert_close(scores.softmax(-1).flatten(), torch.tensor([0.25, 0.75]), 1e-7, "weights")
    assert_close(depth_attend(scores, values).flatten(), torch.tensor([0.25, 1.5]), 1e-6, "input")


def test_attnres_scores_are_scaled_dot_products():
    q, k = torch.randn(D), torch.randn(2, 3, 4, D)
    assert_close(attnres_scores(q, k, scale=0.5), (k @ q) * 0.5, 1e-5, "scores")


# ------------------------------------------------------------------------------ residual
def test_residual_mixer_is_h_plus_y():
    cfg = build_store({"kind": "residual", "d_model": D})
    h, ys = torch.randn(2, 3, D), [torch.randn(2, 3, D) for _ in range(4)]
    _, reads, _, out = run_pass(cfg, h, ys, 4)
    want = h.clone()
    for r, y in zip(reads, ys):
        assert_close(r, want, 0, "residual read")
        want = want + y
    assert_close(out, want, 0, "residual head")
    assert cfg.num_params(n_sublayers=4) == ParamCount(0, 0) and cfg.depth_state_bytes(D, "fp32") == 4 * D


# ----------------------------------------------------------------------------------- mHC
def hand_pre(mixer, streams):
    """A = sigmoid(RMSNorm(flat X) W_pre^T * scale_pre + b_pre) + eps, written out."""
    N = mixer.cfg.n_streams
    flat = streams.flatten(-2)
    flat = flat / torch.sqrt(flat.pow(2).mean(-1, keepdim=True) + 1e-6)
    return torch.sigmoid(flat @ mixer.weight[:N].t() * mixer.scale[0] + mixer.bias[:N]) + 1e-6


def test_mhc_pass_follows_the_update_rule():
    cfg = MHCConfig(d_model=D, n_streams=3, sinkhorn_iters=20)
    h, ys = torch.randn(2, 3, D), [torch.randn(2, 3, D) for _ in range(4)]
    mixers, reads, states, _ = run_pass(cfg, h, ys, 4)
    assert_close(states[0].streams, h.unsqueeze(2).expand(-1, -1, 3, -1), 0, "init copies the embedding")
    for m, r, y, before, after in zip(mixers, reads, ys, states, states[1:]):
        A, C, B = m.coefficients(before.streams)
        assert_close(A, hand_pre(m, before.streams), 1e-5, "pre-mix A")
        assert_close(B.sum(-1), torch.ones_like(A), 1e-5, "rows of B")
        assert_close(B.sum(-2), torch.ones_like(A), 1e-3, "columns of B")
        assert_close(r, torch.einsum("btn,btnd->btd", A, before.streams), 1e-5, "read = A X")
        want = torch.einsum("btkj,btjd->btkd", B, before.streams) + C.unsqueeze(-1) * y.unsqueeze(-2)
        assert_close(after.streams, want, 1e-5, "X' = B X + C y")
        # the mix conserves the total over the streams, up to Sinkhorn's column error
        assert_close((after.streams - C.unsqueeze(-1) * y.unsqueeze(-2)).sum(2), before.streams.sum(2), 1e-3, "total")


def test_single_pass_reads_with_the_previous_mixing_vector():
    h, ys = torch.randn(1, 4, D), [torch.randn(1, 4, D) for _ in range(3)]
    std_m, std_reads, _, _ = run_pass(MHCConfig(d_model=D, n_streams=2), h, ys, 3)
    sp_m, sp_reads, sp_states, _ = run_pass(MHCConfig(d_model=D, n_streams=2, single_pass=True), h, ys, 3)
    assert_close(sp_reads[0], std_reads[0], 0, "the first sublayer uses its own A")
    for s in (1, 2):
        A_prev = hand_pre(sp_m[s - 1], sp_states[s - 1].streams)
        by_hand = (A_prev.unsqueeze(-1) * sp_states[s].streams).sum(2)
        assert_close(sp_reads[s], by_hand, 1e-5, f"single-pass read of sublayer {s}")
        own = (hand_pre(sp_m[s], sp_states[s].streams).unsqueeze(-1) * sp_states[s].streams).sum(2)
        assert (sp_reads[s] - own).abs().max() > 1e-3, "single-pass must differ from reading with A_l"
    # streams after the first sublayer agree (same weights, same write); reads then differ
    assert (sp_reads[1] - std_reads[1]).abs().max() > 1e-3


def test_mhc_read_is_idempotent_and_write_works_without_read():
    cfg = MHCConfig(d_model=D, n_streams=2)
    m = cfg.build(sublayer=0, n_sublayers=1)
    ds = m.init(torch.randn(1, 2, D))
    y = torch.randn(1, 2, D)
    assert_close(m.read(ds), m.read(ds), 0, "read twice")
    assert_close(m.write(ds, y).streams, m.write(m.init(ds.streams[:, :, 0]), y).streams, 0, "write without read")


# ------------------------------------------------------------------------------- AttnRes
def test_attnres_counts_nine_sources_for_k3():
    assert AttnResConfig(d_model=D, group_size=12, count="layers").max_sources(93) == 9
    # counting sublayers instead: 186 sublayers in groups of 12 -> 16 groups + the embedding
    assert AttnResConfig(d_model=D, group_size=12, count="sublayers").max_sources(93) == 17
    assert AttnResConfig(d_model=D, group_size=1, count="layers").max_sources(3) == 4


@pytest.mark.parametrize("count,group_size", [("layers", 2), ("sublayers", 3), ("layers", 5)])
def test_attnres_pass_follows_the_update_rule(count, group_size):
    n_sub = 8
    cfg = AttnResConfig(d_model=D, group_size=group_size, count=count)
    h, ys = torch.randn(2, 3, D), [torch.randn(2, 3, D) for _ in range(n_sub)]
    mixers, reads, states, out = run_pass(cfg, h, ys, n_sub)
    assert_close(reads[0], h, 0, "sublayer 0 reads the embedding")
    unit = (lambda s: s // 2) if count == "layers" else (lambda s: s)
    for s in range(1, n_sub + 1):
        # candidates by hand: embedding, then one sum per group of sublayers seen so far
        groups: dict[int, torch.Tensor] = {}
        for j in range(s):
            g = unit(j) // group_size
            groups[g] = groups.get(g, 0) + ys[j]
        cands = torch.stack([h, *groups.values()], dim=2)
        assert len(states[s].sources()) == cands.shape[2] == cfg.sources_at(s)
        reader = mixers[s].reader if s < n_sub else None
        got = reads[s] if s < n_sub else out
        if reader is None:
            continue
        k = rms_norm(cands, reader.norm_weight)
        w = torch.softmax(k @ reader.query, dim=-1)
        assert_close(got, torch.einsum("bts,btsd->btd", w, cands), 1e-5, f"read of sublayer {s}")
    assert len(states[-1].sources()) == cfg.max_sources(n_sub // 2)
    assert states[-1].nbytes() == 2 * 3 * cfg.depth_state_bytes(D, "fp32", n_layers=n_sub // 2)


def test_attnres_head_and_normalised_values():
    cfg = AttnResConfig(d_model=D, group_size=1, normalize_values=True, key_norm_weight=False, scale_scores=True)
    h, ys = torch.randn(1, 2, D), [torch.randn(1, 2, D) for _ in range(2)]
    mixers, _, states, out = run_pass(cfg, h, ys, 2)
    head = cfg.build_head(n_sublayers=2)
    head.reader.query.data = torch.randn(D)
    cands = torch.stack(states[-1].sources(), dim=2)
    k = rms_norm(cands)
    w = torch.softmax(k @ head.reader.query * D ** -0.5, dim=-1)
    assert_close(head(states[-1]), torch.einsum("bts,btsd->btd", w, k), 1e-5, "head")
    assert head.reader.norm_weight is None


# ---------------------------------------------------------------------------- accounting
def test_depth_stores_keep_nothing_across_tokens():
    for cfg in (ResidualConfig(d_model=D), MHCConfig(d_model=D), AttnResConfig(d_model=D)):
        fp = cfg.footprint(1000, dtype="fp32")
        assert (fp.kept, fp.read, fp.state_bytes) == (0, 0, 0)


@pytest.mark.parametrize("single_pass", [False, True])
def test_mhc_state_bytes_match_the_pass(single_pass):
    cfg = MHCConfig(d_model=D, n_streams=3, single_pass=single_pass)
    _, _, states, _ = run_pass(cfg, torch.randn(2, 5, D), [torch.randn(2, 5, D)] * 2, 2)
    assert states[-1].nbytes() == 2 * 5 * cfg.depth_state_bytes(D, "fp32")
    assert cfg.depth_state_bytes(7168, "bf16") == 3 * 7168 * 2 + (12 if single_pass else 0)
    assert MHCConfig(d_model=7168).depth_state_bytes(dtype="fp8") == 4 * 7168


@pytest.mark.parametrize("cfg", [MHCConfig(d_model=D, n_streams=3), AttnResConfig(d_model=D),
                                 AttnResConfig(d_model=D, key_norm_weight=False)])
def test_num_params_counts_the_modules(cfg):
    n = 5
    mixers = [cfg.build(sublayer=s, n_sublayers=n) for s in range(n)]
    head = cfg.build_head(n_sublayers=n)
    total = sum(p.numel() for m in [*mixers, head] for p in m.parameters())
    assert cfg.num_params(n_sublayers=n) == ParamCount(total, total)
    one = sum(p.numel() for p in mixers[1].parameters())
    assert cfg.num_params() == ParamCount(one, one)


# -------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("d,field", [
    ({"kind": "mhc", "d_model": D, "n_streams": 0}, "n_streams"),
    ({"kind": "mhc", "d_model": D, "sinkhorn_iters": 0}, "sinkhorn_iters"),
    ({"kind": "mhc", "d_model": 0}, "d_model"),
    ({"kind": "attnres", "d_model": D, "group_size": 0}, "group_size"),
    ({"kind": "attnres", "d_model": D, "group_size": -3}, "group_size"),
    ({"kind": "attnres", "d_model": D, "count": "blocks"}, "count"),
    ({"kind": "residual", "d_model": -1}, "d_model"),
    ({"kind": "residual", "d_model": D, "n_streams": 4}, "n_streams"),
])
def test_bad_configs_name_the_field(d, field):
    with pytest.raises(ValueError, match=field):
        build_store(d)


def test_bad_build_and_inputs_name_the_problem():
    cfg = MHCConfig(d_model=D)
    with pytest.raises(ValueError, match="sublayer"):
        cfg.build(sublayer=3, n_sublayers=3)
    with pytest.raises(ValueError, match="n_sublayers"):
        cfg.build_head(n_sublayers=0)
    with pytest.raises(ValueError, match="sublayer"):
        cfg.build(sublayer=1, n_sublayers=3).init(torch.randn(1, 2, D))
    m = cfg.build(sublayer=0, n_sublayers=3)
    with pytest.raises(ValueError, match=r"\[B, T, 8\]"):
        m.init(torch.randn(1, 2, D + 1))
    with pytest.raises(ValueError, match="y"):
        m.write(m.init(torch.randn(1, 2, D)), torch.randn(1, 2, 3))
    with pytest.raises(ValueError, match="n_layers"):
        AttnResConfig(d_model=D).depth_state_bytes(D, "bf16")
