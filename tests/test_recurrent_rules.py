"""Recurrent rules as data: each config declares its Rule, one module runs them all, and the section-6
parity experiment takes its stores from the registry (each recurrent config declares its tables and its
transition), so a new rule needs no edit there."""

import json

import pytest
import torch

from storelab.capacity.recurrence import (PARITY_MODEL, PARITY_QUICK, PARITY_WIDTH, ParityRun, exp_parity_trained,
                                          exp_recurrence, parity_by_training, parity_result, parity_runs,
                                          parity_stores, parity_theory, store_label)
from storelab.stores import REGISTRY, build_store
from storelab.stores.base import Transition
from storelab.stores.recurrent import RecurrentStore, Rule, _RecurrentConfig

# the kinds of the shared pipeline (recurrent kinds with a module of their own, such as mamba2, are not)
RECURRENT = sorted(k for k, c in REGISTRY.items() if c.RECURRENT and issubclass(c, _RecurrentConfig))


def test_every_recurrent_kind_declares_a_rule_built_once():
    for kind in RECURRENT:
        cfg = build_store(dict(kind=kind, d_model=16, n_heads=2, head_k_dim=4))
        rule = cfg.rule()
        assert isinstance(rule, Rule) and callable(rule.op), kind
        m = cfg.build()
        assert isinstance(m, RecurrentStore) and m.rule is rule
        # the parameters the rule's gates own are the module's, under the declared names
        own = set(rule.params(cfg))
        shared = {"q_proj", "k_proj", "v_proj", "conv_weight", "o_norm", "o_proj"}
        names = {n.split(".")[0] for n, _ in m.named_parameters()} | {n for n, _ in m.named_buffers()}
        assert names == shared | own, kind
        assert (m._beta(torch.randn(1, 3, 16)) is None) == (rule.beta is None)


def test_gate_parameter_names_are_the_checkpoints():
    want = {
        "deltanet": ["b_proj"],
        "gated_deltanet": ["b_proj", "z_proj", "a_proj", "A_log", "dt_bias"],
        "kda": ["b_proj", "f_a_proj", "f_b_proj", "g_a_proj", "g_b_proj", "A_log", "dt_bias"],
    }
    for kind, names in want.items():
        cfg = build_store(dict(kind=kind, d_model=16, n_heads=2, head_k_dim=4))
        assert list(cfg.rule().params(cfg)) == names, kind
    fixed = build_store(dict(kind="linear_attention", d_model=16, n_heads=2, head_k_dim=4, decay="fixed")).build()
    g = fixed.rule.log_decay(fixed, torch.zeros(1, 3, 16))                    # RetNet's a_h = 1 - 2^(-5-h)
    assert g.shape == (1, 3, 2) and torch.allclose(g[0, 0].exp(), torch.tensor([1 - 2**-5, 1 - 2**-6]))
    assert not list(fixed.buffers())    # nothing a checkpoint would lack


def test_a_fixed_decay_model_loads_with_its_decay(tmp_path):
    """A model built on meta and filled from a checkpoint had the fixed decay as uninitialised memory
    (a non-persistent buffer) until the decay was computed in the gate."""
    from storelab.checkpoint import load, save
    from storelab.models.config import ModelConfig
    from storelab.models.model import Model

    cfg = ModelConfig.from_dict({"name": "retnet-ish", "d_model": 32, "vocab_size": 64, "n_layers": 2, "stores": {
        "la": {"kind": "linear_attention", "n_heads": 2, "head_k_dim": 16, "decay": "fixed"},
        "ffn": {"kind": "ffn", "d_ff": 64}, "depth": {"kind": "residual"}},
        "layers": [{"at": "all", "token": "la", "channel": "ffn", "depth": "depth"}]})
    torch.manual_seed(0)
    m = Model(cfg).eval()
    save(m, tmp_path / "m")
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(load(tmp_path / "m")(ids)[0], m(ids)[0], rtol=0, atol=0)


def test_parity_stores_come_from_the_registry():
    stores = parity_stores()
    kinds = [s["kind"] for s in stores]
    # every recurrent kind that declares tables, and only those; the shared pipeline's by its default
    declared = sorted(k for k, c in REGISTRY.items() if c.RECURRENT and c.parity_stores(32, 1, 16))
    assert sorted(set(kinds)) == declared
    assert set(RECURRENT) | {"mamba", "mamba2", "rglru"} <= set(kinds)   # the diagonal recurrences beside the delta rules
    for kind in RECURRENT:
        assert kinds.count(kind) == (2 if REGISTRY[kind].DELTA else 1), kind
        assert all(s["mode"] == "recurrent" for s in stores if s["kind"] == kind)  # short strings: the reference loop
    assert not any(c.parity_stores(32, 1, 16) for c in REGISTRY.values() if not c.RECURRENT)
    first_gdn = next(s for s in stores if s["kind"] == "gated_deltanet")
    assert store_label({**first_gdn, "n_v_heads": 2}) == "gated_deltanet n_v_heads=2"
    assert store_label({"kind": "mamba2", "n_heads": 1, "head_dim": 16, "d_state": 8}) == "mamba2 d_state=8"


def test_each_parity_table_builds_at_the_width_asked_with_its_transition():
    """Every table builds and runs at the experiment's width; its state holds n_heads head_dim x head_dim
    numbers (the delta rules' size), RG-LRU's, a vector, n_heads * head_dim."""
    H, K = PARITY_WIDTH["n_heads"], PARITY_WIDTH["head_dim"]
    for st in parity_stores():
        cfg = build_store({"d_model": PARITY_MODEL["d_model"], **st})
        tr = cfg.transition()
        assert isinstance(tr, Transition) and tr.form, st
        with torch.no_grad():
            _, state = cfg.build()(torch.randn(1, 3, PARITY_MODEL["d_model"]))
        assert state.S.numel() == (H * K if st["kind"] == "rglru" else H * K * K), st


@pytest.mark.parametrize("table, can, diagonal", [
    ({"kind": "mamba2", "n_heads": 2, "head_dim": 8}, False, True),
    ({"kind": "mamba"}, False, True),
    ({"kind": "rglru"}, False, True),
    ({"kind": "lightning", "n_heads": 2, "head_dim": 8}, False, True),
    ({"kind": "linear_attention", "n_heads": 1, "head_k_dim": 8, "decay": "fixed"}, False, True),
    ({"kind": "deltanet", "n_heads": 1, "head_k_dim": 8, "beta_max": 1.0}, False, False),
    ({"kind": "deltanet", "n_heads": 1, "head_k_dim": 8, "beta_max": 1.5}, None, False),   # negative, not -1
    ({"kind": "gated_deltanet", "n_heads": 1, "head_k_dim": 8, "beta_max": 2.0}, True, False),
    ({"kind": "gated_deltaproduct", "n_heads": 1, "head_k_dim": 8, "beta_max": 1.0}, False, False),
    ({"kind": "gated_deltaproduct", "n_heads": 1, "head_k_dim": 8, "beta_max": 1.0, "num_householder": 3}, None, False),
    ({"kind": "gated_deltaproduct", "n_heads": 1, "head_k_dim": 8, "beta_max": 2.0, "gated": False}, True, False),
    ({"kind": "kda", "n_heads": 1, "head_k_dim": 8, "beta_max": 2.0}, True, False),
])
def test_theory_follows_from_the_declared_transition(table, can, diagonal):
    """Diagonal decays in (0, 1]: TC0, no parity at every length (Merrill et al.); eigenvalues >= 0: none either
    (Grazzi et al.); a write step up to 2 gives I - beta k k^T the eigenvalue -1, and parity; a negative
    eigenvalue short of -1 (beta_max 1.5; three Householder factors with beta <= 1) is not settled."""
    tr = build_store({"d_model": 16, **table}).transition()
    assert tr.diagonal == diagonal and tr.reflection == (can is True) and tr.negative == (can is not False)
    said_can, why = parity_theory(tr)
    assert said_can is can and ("TC0" in why) == diagonal and "arXiv" in why


@pytest.mark.parametrize("n", [2, 3])
def test_householder_products_with_beta_at_most_1_as_declared(n):
    """The declaration checked on the matrices: two factors I - beta k k^T, beta <= 1, keep every eigenvalue
    real and >= 0; three can give a negative one."""
    g = torch.Generator().manual_seed(n)
    least = 1.0
    for _ in range(4000):
        k = torch.nn.functional.normalize(torch.randn(n, 2, generator=g, dtype=torch.float64), dim=-1)
        beta = torch.rand(n, generator=g, dtype=torch.float64)
        A = torch.eye(2, dtype=torch.float64)
        for i in range(n):
            A = (torch.eye(2, dtype=torch.float64) - beta[i] * torch.outer(k[i], k[i])) @ A
        least = min(least, float(torch.linalg.eigvals(A).real.min()))
    cfg = build_store(dict(kind="gated_deltaproduct", d_model=16, n_heads=1, head_k_dim=8, num_householder=n))
    assert cfg.transition().negative == (least < -1e-9)


def test_the_transition_is_what_the_op_does():
    """A Mamba-2 layer's state after one token is exp(dt A) times the state before, plus a write: the
    declared diagonal, positive decay, checked on the module (two initial states, the same token)."""
    from storelab.state import RecurrentState

    torch.manual_seed(0)
    m = build_store(dict(kind="mamba2", d_model=16, n_heads=2, head_dim=4, d_state=4, conv_kernel=1)).build()
    x = torch.randn(1, 1, 16)
    S0 = torch.randn(1, 2, 4, 4)
    with torch.no_grad():
        _, a = m(x, RecurrentState(S=S0.clone()))
        _, b = m(x, RecurrentState(S=torch.zeros_like(S0)))
    ratio = (a.S - b.S) / S0                                          # one number per head, in (0, 1)
    assert torch.allclose(ratio, ratio[:, :, :1, :1].expand_as(ratio), atol=1e-5)
    assert bool(((ratio > 0) & (ratio < 1)).all())


def test_parity_by_training_runs_any_table():
    short, long = parity_by_training({"kind": "deltanet", "n_heads": 1, "head_k_dim": 8, "mode": "recurrent",
                                      "beta_max": 2.0}, steps=2)
    assert 0.0 <= short <= 1.0 and 0.0 <= long <= 1.0
    res = exp_parity_trained([{"kind": "linear_attention", "n_heads": 1, "head_k_dim": 8, "mode": "recurrent"}],
                             steps=1)
    assert len(res.rows) == 1 and res.rows[0]["experiment"] == "11 parity, trained"
    assert res.rows[0]["essay"] is None  # trained accuracies are measurements, not the essay's claims
    assert res.rows[0]["theory"] == 0.5 and "cannot" in res.rows[0]["note"]


def test_quick_experiment_trains_every_recurrent_kind():
    """experiment 11 at --quick trains every declared table (a few steps each), the diagonal recurrences too."""
    res = exp_recurrence(True)
    trained = [r for r in res.rows if r["experiment"] == "11 parity, trained"]
    assert len(trained) == len(parity_stores())
    for kind in ("mamba", "mamba2", "rglru", "gated_deltanet", "gated_deltaproduct"):
        assert any(r["criterion"].startswith(kind) for r in trained), kind
    assert all(0.0 <= r["measured"] <= 1.0 and f"{PARITY_QUICK['steps']} steps" in r["note"] for r in trained)
    delta2 = [r for r in trained if "beta <= 2" in r["criterion"]]
    assert delta2 and all(r["theory"] == 1.0 for r in delta2)             # a construction exists
    assert all(r["theory"] == 0.5 for r in trained if r["criterion"].startswith(("mamba", "rglru")))
    assert [c.title for c in res.curves][-1].startswith("11 parity, trained")
    assert not [r for r in exp_recurrence(True, trained=False).rows if r["experiment"] == "11 parity, trained"]


def _run(table, trained, long, can):
    tr = Transition("x", diagonal=can is False, negative=can is not False, reflection=can is True)
    return ParityRun(table, table["kind"], tr, can, parity_theory(tr)[1], trained, long, [(trained, long)], 3)


@pytest.mark.parametrize("trained, long, can, verdict", [
    (0.55, 0.50, False, "did not learn: 0.550 at trained lengths vs chance 0.5 (needs >= 0.7)"),
    (0.62, 0.95, True, "did not learn"),                   # a long figure from a model that did not learn: no claim
    (0.98, 0.51, False, "at chance past the trained lengths, as predicted"),
    (0.98, 0.90, False, "above chance past the trained lengths: not as predicted"),
    (0.99, 0.97, True, "tracks parity past the trained lengths"),
    (0.99, 0.52, True, "learned the trained lengths only"),
    (0.99, 0.93, None, "tracks parity past the trained lengths; theory does not settle"),
])
def test_report_marks_a_run_that_did_not_learn(trained, long, can, verdict):
    from storelab.report.depth_section import parity_verdict

    said, check = parity_verdict(_run({"kind": "mamba2"}, trained, long, can))
    assert said.startswith(verdict)
    assert check["valid"] == (trained >= 0.7) and check["figures"] == {"accuracy": trained, "chance": 0.5}


def test_report_section_prints_each_run_beside_its_prediction(tmp_path, monkeypatch):
    import storelab.capacity.recurrence as rec
    from storelab.report.core import Context
    from storelab.report.depth_section import depth_section

    runs = [_run({"kind": "mamba2", "n_heads": 1, "head_dim": 16, "d_state": 16}, 0.55, 0.5, False),
            _run({"kind": "gated_deltanet", "n_heads": 1, "head_k_dim": 16, "mode": "recurrent", "beta_max": 2.0},
                 0.99, 0.97, True)]
    monkeypatch.setattr(rec, "parity_runs", lambda quick=False: runs)  # the arithmetic, not the training (above)
    out = depth_section(Context(out=tmp_path, quick=True))
    table = out.tables[-1]
    assert "quick sizes" in table.title and len(table.rows) == 2
    mamba2, gdn = table.rows
    assert mamba2[0] == "mamba2" and "cannot" in mamba2[2] and mamba2[3:5] == [0.55, 0.5]
    assert mamba2[5].startswith("did not learn")
    assert gdn[0] == "gated_deltanet, beta <= 2" and gdn[2].startswith("can") and gdn[5].startswith("tracks parity")
    assert "TC0" in out.text and "2404.08819" in out.text and "quick sizes" in out.text
    data = json.loads(json.dumps(out.data))
    assert [d["verdict"][:13] for d in data["parity_trained"]] == ["did not learn", "tracks parity"]
    assert data["parity_trained"][0]["transition"]["diagonal"] is True
    assert not any(c.claim.startswith("11 parity, trained") for c in out.claims)   # measurements, not claims
