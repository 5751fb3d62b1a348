"""Recurrent rules as data: each config declares its Rule, one module runs them all, and the section-6
parity experiment takes its stores from the registry, so a new rule needs no edit there."""

import torch

from storelab.capacity.recurrence import exp_parity_trained, parity_by_training, parity_stores, store_label
from storelab.stores import REGISTRY, build_store
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
    assert sorted(set(kinds)) == RECURRENT
    for kind in RECURRENT:
        assert kinds.count(kind) == (2 if REGISTRY[kind].DELTA else 1), kind
    assert all(s["mode"] == "recurrent" for s in stores)  # autograd runs the per-token loop
    assert store_label({"kind": "gated_deltanet", **stores[0], "n_v_heads": 2}).endswith("n_v_heads=2")


def test_parity_by_training_runs_any_table():
    short, long = parity_by_training({"kind": "deltanet", "n_heads": 1, "head_k_dim": 8, "mode": "recurrent",
                                      "beta_max": 2.0}, steps=2)
    assert 0.0 <= short <= 1.0 and 0.0 <= long <= 1.0
    res = exp_parity_trained([{"kind": "linear_attention", "n_heads": 1, "head_k_dim": 8, "mode": "recurrent"}],
                             steps=1)
    assert len(res.rows) == 1 and res.rows[0]["experiment"] == "11 parity, trained"
    assert res.rows[0]["essay"] is None  # trained accuracies are measurements, not the essay's claims
