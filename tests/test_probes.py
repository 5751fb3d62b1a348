"""Each probe on a model built so that the answer is known.

The models here are untrained: their answers are at chance, so each probe's check (``storelab.probes.
validity``) would withhold every fraction. The arithmetic under the check is what these tests read, so
``unchecked`` passes every check by setting its thresholds out of reach of failure (the check itself,
on these models and on ones that answer, is tested in ``tests/test_probe_validity.py``).
"""

import math

import pytest
import torch

from storelab.models.model import Model
from storelab.probes import forgetting, keep_one, mhc_ablation, selection, state_swap
from storelab.probes.common import cache_layers, discard_states, mix_states, prefill, recurrent_layers
from storelab.probes.forgetting import kda_weight_estimate
from storelab.probes.selection import selection_metrics
from storelab.tasks import make_task, tiny_dictionary
from storelab.train.models import resolve_model

SMALL = dict(d_model=32, n_heads=2, head_dim=16, d_ff=64)


@pytest.fixture
def unchecked(monkeypatch):
    """Every probe's check passes (the arithmetic under it): any accuracy is above chance - 1, any shift above
    -1e30 (finite thresholds: a result holding inf would be refused as non-finite by ``storelab probe``)."""
    from storelab.probes import validity

    monkeypatch.setattr(validity, "MARGIN", -1.0)
    monkeypatch.setattr(validity, "MIN_SHIFT", -1e30)


def build(name: str, task, seed: int = 0, **opts) -> Model:
    torch.manual_seed(seed)
    return Model(resolve_model(name, task.vocab_size, **{**SMALL, **opts})).eval()


def zero_recurrent(model: Model) -> Model:
    """Silence every recurrent layer: its output projection is zero, whatever its state holds."""
    for i in recurrent_layers(model):
        torch.nn.init.zeros_(model.blocks[i].token.o_proj.weight)
    return model


@pytest.fixture(scope="module")
def dic():
    return tiny_dictionary()


def test_layer_classes_and_surgery(dic):
    m = build("hybrid", dic)
    assert recurrent_layers(m) == [0, 1, 2] and cache_layers(m) == [3]
    x = dic.sample(2, 0).inputs
    ca, cb = prefill(m, x[:, :-1]), prefill(m, x.flip(0)[:, :-1])
    mixed = mix_states(m, ca, cb, [0])
    assert torch.equal(mixed[0].token.S, cb[0].token.S) and torch.equal(mixed[3].token.k, ca[3].token.k)
    assert mixed[0].token is not cb[0].token  # a copy: patching never touches the donor
    fresh = discard_states(m, ca, [3])
    assert fresh[3].token is None and ca[3].token.k is not None


def test_state_swap_zero_when_recurrent_layers_are_silent(dic, unchecked):
    m = zero_recurrent(build("hybrid", dic))
    r = state_swap(m, dic, n=12, seed=0)
    assert r["recurrent_fraction"] == pytest.approx(0.0, abs=1e-6)
    assert r["cache_fraction"] == pytest.approx(1.0, abs=1e-5)


def test_state_swap_all_in_the_state_without_attention(dic, unchecked):
    m = build("kda", dic, n_layers=2)
    r = state_swap(m, dic, n=12, seed=1)
    assert r["cache_fraction"] is None
    assert r["recurrent_fraction"] == pytest.approx(1.0, abs=1e-5)


def test_state_swap_on_mqar_groups_by_length(unchecked):
    t = make_task("mqar", "tiny")
    m = zero_recurrent(build("hybrid", t))
    r = state_swap(m, t, n=10, seed=0)
    assert r["examples"] == 10 and r["recurrent_fraction"] == pytest.approx(0.0, abs=1e-6)


def test_keep_one_cache_alone_is_everything_when_states_are_silent(dic, unchecked):
    m = zero_recurrent(build("hybrid", dic))
    r = keep_one(m, dic, n=16, seed=0)
    assert r["cache_only"] == r["full"]
    assert r["paired"]["content_from_cache"] == r["full"]["retrieval"]
    assert r["paired"]["language_from_cache"] == r["full"]["compliance"]


def test_keep_one_state_alone_is_everything_without_attention(dic, unchecked):
    m = build("kda", dic, n_layers=2)
    r = keep_one(m, dic, n=16, seed=0)
    assert r["state_only"] == r["full"]
    with pytest.raises(ValueError, match="task"):
        keep_one(m, make_task("mqar", "tiny"))


def test_forgetting_half_life_from_constant_gates(dic, unchecked):
    m = build("gated_deltanet", dic, n_layers=2)
    expect = []
    for i in recurrent_layers(m):
        st = m.blocks[i].token
        torch.nn.init.zeros_(st.a_proj.weight)  # the decay no longer depends on the input
        rate = st.A_log.detach().exp() * torch.nn.functional.softplus(st.dt_bias.detach())
        expect += (math.log(2) / rate).tolist()
    r = forgetting(m, dic, n=6)
    assert r["median_half_life"] == pytest.approx(float(torch.tensor(expect).median()), rel=1e-4)
    assert r["ranking_stability"] == pytest.approx(1.0)
    assert r["kda_mixing_fraction"] is None


def test_forgetting_kda_weight_estimate(dic, unchecked):
    m = build("kda", dic, n_layers=1)
    st = m.blocks[0].token
    H, K = st.cfg.n_heads, st.cfg.head_k_dim
    with torch.no_grad():
        st.A_log.zero_()
        bias = torch.full((H, K), -10.0)   # g = -5 sigmoid(-10): lasts far beyond 64 tokens
        bias[0, : K // 2] = 0.0            # g = -2.5: gone within a few tokens
        st.dt_bias.copy_(bias.flatten())
    est = kda_weight_estimate(st)
    assert est["mixes"].tolist() == [True] + [False] * (H - 1)
    assert forgetting(m, dic, n=2)["kda_mixing_fraction"] == pytest.approx(1 / H)


def _mhc_model(task, *, identity: bool):
    m = build("pattern:KA", task, depth="mhc")
    for blk in m.blocks:
        for mixer in (blk.depth_token, blk.depth_channel):
            N = mixer.cfg.n_streams
            with torch.no_grad():
                mixer.weight[2 * N:].zero_()          # B no longer depends on the token
                if identity:
                    mixer.bias[2 * N:] = 30 * torch.eye(N).flatten()
                else:                                 # a fixed mix far from the identity; streams that differ
                    mixer.bias[N:] = 3 * torch.randn(N + N * N)
    return m


def test_mhc_fixed_identity_mix_changes_nothing(dic, unchecked):
    r = mhc_ablation(_mhc_model(dic, identity=True), dic, n=8)
    for cond in r["conditions"].values():
        assert abs(cond["loss_change"]) < 1e-5


def test_mhc_constant_mix_average_changes_nothing_identity_does(dic, unchecked):
    r = mhc_ablation(_mhc_model(dic, identity=False), dic, n=8)
    c = r["conditions"]
    assert abs(c["average_first_half"]["loss_change"]) < 1e-5
    assert abs(c["average_second_half"]["loss_change"]) < 1e-5
    assert abs(c["identity_first_half"]["loss_change"]) > 1e-4
    with pytest.raises(ValueError, match="mHC"):
        mhc_ablation(build("hybrid", dic), dic, n=2)


def test_selection_metrics_on_known_weights():
    # one query row over 6 entries, budget 2: the two heaviest are entries 4 and 1
    w = torch.tensor([0.05, 0.30, 0.05, 0.05, 0.50, 0.05]).view(1, 1, 1, 6).expand(1, 1, 6, 6).clone()
    sel = torch.zeros(1, 1, 6, 6, dtype=torch.bool)
    sel[..., [0, 4]] = True
    r = selection_metrics(w, sel, budget=2, first=1)
    assert r["eligible_queries"] == 4  # queries seeing more than 2 entries
    assert r["miss_rate"] == pytest.approx(0.5) and r["top1_miss"] == 0.0
    assert r["mass_missed"] == pytest.approx(0.45) and r["first_block_rate"] == 1.0


def test_selection_on_msa_forced_first_block():
    t = make_task("mqar", "tiny")
    torch.manual_seed(0)
    d = resolve_model("tiny-minimax-m3", t.vocab_size).to_dict()
    d["stores"]["msa"]["include_first_block"] = True
    from storelab.models.config import ModelConfig

    m = Model(ModelConfig.from_dict(d)).eval()
    r = selection(m, t, n=4)
    assert r["layers"] and all(x["kind"] == "msa" for x in r["layers"])
    assert r["first_block_rate"] == 1.0
    assert 0.0 <= r["miss_rate"] <= 1.0 and 0.0 <= r["mass_missed"] <= 1.0
    with pytest.raises(ValueError, match="selection"):
        selection(build("hybrid", t), t, n=2)


def test_probe_command_on_a_checkpoint(tmp_path):
    import json

    from typer.testing import CliRunner

    from storelab.cli import app
    from storelab.train import TrainConfig, train

    train(TrainConfig(model="hybrid", model_options=SMALL, task="dictionary", task_preset="tiny", steps=2,
                      batch_size=4, eval_every=2, eval_examples=4, threads=1), tmp_path)
    res = CliRunner().invoke(app, ["probe", "all", "--checkpoint", str(tmp_path), "--n", "4", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert set(doc["results"]) == {"state_swap", "keep_one", "forgetting"}
    assert set(doc["skipped"]) == {"mhc", "selection"}
    assert doc["results"]["forgetting"]["essay"]["median_half_life_tokens"] == 24
    bad = CliRunner().invoke(app, ["probe", "nonsense", "--checkpoint", str(tmp_path)])
    assert bad.exit_code == 2
