"""The capacity lab: quick versions against their own theory lines, plus the exact constructions.

The quick sweep runs once (module fixture); each test then checks the rows of one experiment
against the theory column with a tolerance that the measurement could miss.
"""

from __future__ import annotations

import json
import math
import time

import pytest
import torch

from storelab.capacity import EXPERIMENTS, resolve, run, worked_example_1
from storelab.capacity.common import solve_n_log_n
from storelab.capacity.recurrence import (monotone_parity_bound, parity_accuracy, parity_read,
                                          scan_vs_sequential, transition_eigenvalues)

KEYS = {"experiment", "d", "criterion", "theory", "essay", "measured", "ratio", "note"}


@pytest.fixture(scope="module")
def quick():
    t0 = time.process_time()
    rows = run(quick=True, progress=False)
    return rows, time.process_time() - t0


def pick(rows, experiment, criterion=""):
    found = [r for r in rows if r["experiment"] == experiment and criterion in r["criterion"]]
    assert len(found) == 1, (experiment, criterion, [r["criterion"] for r in rows if r["experiment"] == experiment])
    return found[0]


def rel(r):
    return r["measured"] / r["theory"]


# ----------------------------------------------------------------------------- formulas


def test_worked_example_1_from_formulas():
    w = worked_example_1(128)
    assert w["outer_clean"] == 128 and w["lstsq_clean"] == 256
    assert round(w["outer_discrimination"], -1) == 350           # n ln n = 16384 / 8
    assert round(w["best_discrimination"], -1) == 1160           # n ln n = 16384 / 2
    for c in (10.0, 2048.0, 16384 / 2):
        n = solve_n_log_n(c)
        assert n * math.log(n) == pytest.approx(c, rel=1e-9)


def test_resolve_names_and_numbers():
    assert resolve(None) == list(EXPERIMENTS)
    assert resolve(["6", "outer", "outer"]) == ["outer", "attention"]
    with pytest.raises(ValueError, match="experiment"):
        resolve(["nope"])


# ----------------------------------------------------------------------------- the quick sweep


def test_quick_sweep_shape_and_runtime(quick):
    rows, cpu = quick
    assert cpu < 30, f"quick sweep took {cpu:.1f} s of CPU"
    assert {r["experiment"].split()[0] for r in rows} == {str(i) for i in range(1, 12)}
    for r in rows:
        assert set(r) == KEYS
        if r["essay"] not in (None, 0) and r["measured"] is not None:
            assert r["ratio"] == pytest.approx(r["measured"] / r["essay"])


def test_linear_stores(quick):
    rows, _ = quick
    assert rel(pick(rows, "1 outer-product store")) == pytest.approx(1, abs=0.15)
    exact = pick(rows, "2 least-squares store", "exact")
    assert exact["measured"] == exact["theory"] == exact["d"]
    assert rel(pick(rows, "2 least-squares store", "clean")) == pytest.approx(1, abs=0.1)
    assert rel(pick(rows, "3 delta rule (Widrow-Hoff)", "clean")) == pytest.approx(1, abs=0.15)
    assert pick(rows, "3 delta rule (Widrow-Hoff)", "|S - S_ls|")["measured"] < 0.15


def test_discrimination(quick):
    rows, _ = quick
    outer = pick(rows, "4 discrimination, outer product")
    best = pick(rows, "4 discrimination, best linear map")
    assert rel(outer) == pytest.approx(1, abs=0.25)
    # asymptotic theory n ln n = d^2/2 is a lower bound at finite d (the essay: 1,800 against 1,160 at d = 128)
    assert 1.0 < rel(best) < 2.2 and best["measured"] > 3 * outer["measured"]


def test_feedforward(quick):
    rows, _ = quick
    for name in ("linear", "ReLU", "ReLU^2"):
        assert rel(pick(rows, f"5 feed-forward, {name}", "clean")) == pytest.approx(1, abs=0.15), name
    assert pick(rows, "5 feed-forward, ReLU/linear")["measured"] == pytest.approx(2, abs=0.35)
    for p in (1, 2, 3):
        r = pick(rows, f"5 feed-forward, ReLU^{p} exponent")
        assert r["measured"] == pytest.approx(r["theory"], abs=0.3)


def test_attention_and_logn(quick):
    rows, _ = quick
    assert rel(pick(rows, "6 softmax attention")) == pytest.approx(1, abs=0.1)
    assert pick(rows, "7 LogN scaling")["measured"] >= 0.95
    fixed = pick(rows, "7 fixed beta")
    assert fixed["theory"] < 0.1 and fixed["measured"] < 0.1


def test_hopfield(quick):
    rows, _ = quick
    assert 0.9 < rel(pick(rows, "8 Hopfield (Hebb)", "retrieval")) < 1.5      # finite N: retrieval persists
    assert rel(pick(rows, "8 Hopfield (Hebb)", "wrong bits")) == pytest.approx(1, abs=0.5)
    assert rel(pick(rows, "8 Hopfield exact recall", "most")) == pytest.approx(1, abs=0.15)
    assert rel(pick(rows, "8 Hopfield exact recall", "all")) == pytest.approx(1, abs=0.25)
    assert 0.7 < rel(pick(rows, "8 perceptron rule")) < 1.1
    for n in (2, 3, 4):
        r = pick(rows, f"8 dense associative memory, n={n}")
        assert r["measured"] == pytest.approx(r["theory"], abs=0.35)
    r = pick(rows, "8 exponential energy")
    assert r["measured"] == pytest.approx(r["theory"], abs=0.15)


def test_sdm(quick):
    rows, _ = quick
    assert rel(pick(rows, "9 sparse distributed memory")) == pytest.approx(1, abs=0.2)
    assert rel(pick(rows, "9 SDM read as attention")) == pytest.approx(1, abs=0.15)


def test_compression(quick):
    rows, _ = quick
    assert pick(rows, "10 compression, two facts in one pool")["measured"] <= 0.1
    assert pick(rows, "10 compression, facts in separate pools")["measured"] >= 0.95
    assert pick(rows, "10 compression, one fact over two tokens")["measured"] >= 0.95


# ----------------------------------------------------------------------------- section 6, exactly


def test_scan_equals_sequential_in_log_rounds():
    for L in (1, 2, 7, 64, 65):
        err, rounds = scan_vs_sequential(L, 4, seed=L)
        assert err < 1e-12
        assert rounds == math.ceil(math.log2(L))


def test_gated_deltanet_eigenvalue_ranges():
    for alpha in (1.0, 0.6):
        lo, hi = transition_eigenvalues(1.0, 6, 256, seed=1, alpha=alpha)
        assert lo >= -1e-12 and hi <= alpha + 1e-12
        lo, hi = transition_eigenvalues(2.0, 6, 256, seed=2, alpha=alpha)
        assert lo == pytest.approx(-alpha, abs=1e-12) and hi <= alpha + 1e-12


def test_parity_by_construction():
    bits = torch.randint(0, 2, (200, 97), generator=torch.Generator().manual_seed(0))
    read = parity_read(bits, 2.0)
    expect = 1 - 2 * (bits.cumsum(1) % 2).double()                  # (-1)^(number of ones so far)
    assert torch.equal(read, expect)
    assert parity_accuracy(2.0, 97, 200, seed=1) == 1.0
    bound = monotone_parity_bound(97)
    assert bound < 0.6
    for beta in (0.0, 0.3, 0.5, 0.9, 1.0):
        assert parity_accuracy(beta, 97, 200, seed=1) <= bound + 0.03, beta
        assert parity_accuracy(beta, 97, 200, seed=1) < 0.6, beta
        assert bool((parity_read(bits, beta) >= 0).all())           # eigenvalues in [0, 1]: no sign flip


# ----------------------------------------------------------------------------- CLI and plots


def test_cli_json_parses(tmp_path):
    from typer.testing import CliRunner

    from storelab.cli import app

    res = CliRunner().invoke(app, ["capacity", "10", "recurrence", "--quick", "--json", "--plot", str(tmp_path)])
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)
    assert rows and all(set(r) == KEYS for r in rows)
    assert list(tmp_path.glob("*.png")) and json.loads((tmp_path / "capacity.json").read_text())["quick"] is True
    bad = CliRunner().invoke(app, ["capacity", "nope", "--quick"])
    assert bad.exit_code == 2
