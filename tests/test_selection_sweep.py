"""Selection on real text (probes/selection_sweep.py) and the stores' ``selection_scores`` protocol.

Closed forms: an indexer that scores exactly as the main attention has recall 1 and misses only the
mass outside the exact top-k; an indexer that sees everything misses nothing; a random indexer's
recall is near k / L. The protocol's selection equals what each store's forward read (dsa with
IndexShare, msa, csa), on zoo models and on tiny transformers checkpoints (glm_moe_dsa, deepseek_v4).
"""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from storelab.models.model import Model
from storelab.probes.selection_sweep import layer_metrics, layer_scores, selecting_layers, selection_sweep
from storelab.stores.base import observe
from storelab.stores.msa import MsaConfig
from storelab.stores.selection_scores import SelectionScores, selected
from storelab.train.models import resolve_model


def _scores(exact, index, k, forced=None):
    B, G, Q, N = exact.shape
    forced = torch.zeros(B, G, Q, N, dtype=torch.bool) if forced is None else forced
    return SelectionScores(exact, index, ~forced, forced, k)


def test_metrics_in_closed_form():
    torch.manual_seed(0)
    exact = torch.softmax(torch.randn(1, 1, 5, 40), -1)
    s = _scores(exact, exact.log(), 4)  # the indexer ranks as the attention does
    r = layer_metrics(s, 4)
    top = exact.topk(4, -1).values.sum(-1)
    assert r["queries"] == 5 and r["recall"] == 1.0
    assert r["mass_missed"] == pytest.approx(r["oracle_mass_missed"]) == pytest.approx((1 - top).mean().item())
    assert layer_metrics(_scores(exact, -exact, 4), 4)["recall"] == 0.0   # it picks the 4 lightest
    assert layer_metrics(s, 40)["queries"] == 0                           # every entry read: nothing to miss
    forced = torch.zeros(1, 1, 5, 40, dtype=torch.bool)
    forced[..., exact[0, 0, 0].argmax()] = True                            # forced entries are read, not candidates
    assert layer_metrics(_scores(exact, exact.log(), 4, forced), 4)["mass_missed"] <= r["mass_missed"] + 1e-7


def _one_msa(**kw) -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = MsaConfig(d_model=32, n_heads=1, n_kv_heads=1, head_dim=16, index_head_dim=16, block_size=1,
                    top_blocks=9, local_blocks=1, qk_norm=True, **kw)
    return cfg.build().eval()


def test_planted_indexer_equal_to_the_attention_has_recall_one():
    # blocks of 1 position, one head: block-max index score = the logit, block mass = the softmax weight
    st = _one_msa()
    with torch.no_grad():
        st.index_q.weight.copy_(st.q_proj.weight)
        st.index_k.weight.copy_(st.k_proj.weight)
        st.index_q_norm.weight.copy_(st.q_norm.weight)
        st.index_k_norm.weight.copy_(st.k_norm.weight)
    x = torch.randn(1, 600, 32)
    with torch.no_grad():
        _, state = st(x)
    s = st.selection_scores(x[:, -32:], state)
    r = layer_metrics(s, s.k)
    assert s.k == 8 and r["queries"] == 32 and r["recall"] == 1.0
    assert r["mass_missed"] == pytest.approx(r["oracle_mass_missed"], abs=1e-6) and r["mass_missed"] > 0
    big = layer_metrics(s, 600)  # more picks than entries: everything read
    assert big["queries"] == 0
    assert (s.exact_BGQN * ~selected(s, 600)).sum().item() == pytest.approx(0.0, abs=1e-7)
    with torch.no_grad():  # an unrelated indexer: recall near k / L (8 of ~590)
        st.index_q.weight.normal_()
        st.index_k.weight.normal_()
    assert layer_metrics(st.selection_scores(x[:, -32:], state), 8)["recall"] < 0.06


def _forward_selection(model, ids, Q):
    """What each selecting layer's forward read at the last Q queries, as a mask over its entries."""
    layers = selecting_layers(model)
    with torch.no_grad(), observe(*(model.blocks[i].token for i in layers)) as seen:
        model(ids)
    return seen


@pytest.mark.parametrize("name", ["tiny-glm-5.3", "tiny-minimax-m3"])
def test_protocol_selects_what_the_forward_read(name):
    torch.manual_seed(0)
    m = Model(resolve_model(name, 256)).eval()
    ids = torch.randint(0, 256, (2, 200))
    Q = 12
    sc = layer_scores(m, ids, queries=Q, chunk=64)   # chunked prefill: the same cache
    seen = _forward_selection(m, ids, Q)
    for i, s in sc.items():
        st, sel = m.blocks[i].token, selected(sc[i], s.k)
        N = sel.shape[-1]
        if m.cfg.layers[i].token.KIND == "dsa":
            want = torch.zeros(2, N, dtype=torch.bool).unsqueeze(1).repeat(1, Q, 1)
            want.scatter_(-1, seen.last(st, "selection")[:, -Q:], True)
            assert torch.equal(want, sel[:, 0]), f"layer {i}"
        else:
            blocks = seen.last(st, "blocks")[:, :, -Q:]
            want = torch.zeros(*blocks.shape[:3], N + 1, dtype=torch.bool)
            want.scatter_(-1, torch.where(blocks < 0, N, blocks), True)
            assert torch.equal(want[..., :N], sel), f"layer {i}"
    if name == "tiny-glm-5.3":  # IndexShare (offset 3, groups of 4): layers 3-5 reuse layer 2's, 7 layer 6's
        assert [i for i, s in sc.items() if not s.own_indexer] == [3, 4, 5, 7]


def test_protocol_on_csa_matches_the_read_mask():
    torch.manual_seed(0)
    m = Model(resolve_model("tiny-deepseek-v4-pro", 256)).eval()
    i = selecting_layers(m)[0]
    st = m.blocks[i].token
    xs = {}
    h = st.register_forward_pre_hook(lambda mod, a: xs.setdefault("x", a[0].detach()))
    with torch.no_grad():
        m(torch.randint(0, 256, (1, 160)))
        h.remove()
        _, cache, mask_BTL = st.step(xs["x"], None, want_mask=True)
    s = st.selection_scores(xs["x"][:, -10:], cache)
    N, W = cache.entries, st.cfg.window
    assert torch.equal(selected(s, s.k)[:, 0, :, W:], mask_BTL[:, -10:, -N:])
    assert s.exact_BGQN.sum(-1).max() <= 1 + 1e-5   # the sinks take the rest


def test_sweep_structure_and_topk_monotone():
    torch.manual_seed(0)
    m = Model(resolve_model("tiny-glm-5.3", 256)).eval()
    docs = [torch.randint(0, 256, (n,)).tolist() for n in (37, 50, 81)]
    r = selection_sweep(m, docs, contexts=(4, 96, 192), topk=(1, 2, 4), queries=8)
    assert [x["layer"] for x in r["layers"]] == list(range(8))
    for x in r["layers"]:
        by = {(p["context"], p["topk_multiplier"]): p for p in x["points"]}
        assert by[(4, 1)]["queries"] == 0                     # 4 tokens, top 6: every entry read
        for C in (96, 192):
            masses = [by[(C, mm)]["mass_missed"] for mm in (1, 2, 4)]
            assert masses == sorted(masses, reverse=True)     # a larger top-k reads a superset
            assert all(by[(C, mm)]["oracle_mass_missed"] <= by[(C, mm)]["mass_missed"] + 1e-6 for mm in (1, 2, 4))
        if not x["own_indexer"]:
            assert x["owner"] in (2, 6) and "sharing_cost" in by[(96, 1)]
    with pytest.raises(ValueError, match="contexts"):
        selection_sweep(m, docs, contexts=(), queries=8)
    with pytest.raises(ValueError, match="selects"):
        selection_sweep(Model(resolve_model("tiny-qwen3.8", 256)), docs, contexts=(16,))


def test_probe_command_writes_json_and_figure(tmp_path):
    from storelab.cli import app

    out = tmp_path / "sel"
    res = CliRunner().invoke(app, ["probe", "selection", "--model", "tiny-minimax-m3", "--contexts", "40,80",
                                   "--topk", "1,2", "--queries", "4", "--n", "2", "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads((out / "probe.json").read_text())
    assert doc["results"]["selection"]["contexts"] == [40, 80]
    assert (out / "selection.png").stat().st_size > 0
    bad = CliRunner().invoke(app, ["probe", "selection", "--model", "tiny-minimax-m3", "--contexts", "0"])
    assert bad.exit_code == 2 and "--contexts" in bad.output
    (tmp_path / "f").write_text("x")
    refused = CliRunner().invoke(app, ["probe", "selection", "--model", "tiny-minimax-m3", "--contexts", "40",
                                       "--out", str(tmp_path / "f")])
    assert refused.exit_code == 2 and "--out" in refused.output
