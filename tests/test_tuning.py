"""The chunk plans of the delta rules: calibrated once per CPU and head shape, kept in a file, used by the ops.

Each test has its own cache folder (``STORELAB_CACHE_DIR``) and starts from an empty process cache.
"""

import json

import pytest
import torch
import torch.nn.functional as F

import storelab.ops.tuning as tuning
from storelab.ops import gated_delta_rule, kda


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    monkeypatch.setenv("STORELAB_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("STORELAB_TUNING", raising=False)
    monkeypatch.setattr(tuning, "_plans", {})
    monkeypatch.setattr(tuning, "_loaded_from", None)
    return tmp_path


def _counting(monkeypatch, plan=tuning.ChunkPlan(16, None)):
    calls = []

    def fake(form, K, V, dtype, per_channel, **kw):
        calls.append((form, K, V, dtype, per_channel))
        return plan

    monkeypatch.setattr(tuning, "calibrate", fake)
    return calls


def test_a_plan_is_calibrated_once_then_read_from_the_cpus_file(fresh, monkeypatch):
    calls = _counting(monkeypatch)
    assert tuning.chunk_plan("kernel", 64, 64, torch.float32, False) == (16, None)
    assert tuning.chunk_plan("kernel", 64, 64, torch.float32, False) == (16, None)
    assert len(calls) == 1
    path = tuning.tuning_file()
    assert path.parent.parent == fresh and path.exists()
    data = json.loads(path.read_text())
    assert data["plans"] == {f"kernel|decay=head|K=64|V=64|float32|threads={torch.get_num_threads()}":
                             {"chunk": 16, "group_floats": None}}
    # another process (the process cache emptied): the file answers, nothing is timed
    monkeypatch.setattr(tuning, "_plans", {})
    monkeypatch.setattr(tuning, "_loaded_from", None)
    assert tuning.chunk_plan("kernel", 64, 64, torch.float32, False) == (16, None)
    assert len(calls) == 1
    # another shape is another key, and the file keeps both
    tuning.chunk_plan("tensor", 128, 64, torch.float64, True)
    assert len(calls) == 2 and len(json.loads(path.read_text())["plans"]) == 2


BAD_PLAN = '{"plans": {"kernel|decay=head|K=64|V=64|float32|threads=1": {"chunk": -3, "group_floats": null}}}'


@pytest.mark.parametrize("text", ["{not json", BAD_PLAN, '{"plans": 7}', ""])
def test_a_damaged_file_is_calibrated_again_and_rewritten(fresh, monkeypatch, text):
    calls = _counting(monkeypatch)
    path = tuning.tuning_file()
    path.parent.mkdir(parents=True)
    path.write_text(text)
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert tuning.chunk_plan("kernel", 64, 64, torch.float32, False) == (16, None)
    finally:
        torch.set_num_threads(before)
    assert len(calls) == 1
    assert json.loads(path.read_text())["plans"]["kernel|decay=head|K=64|V=64|float32|threads=1"]["chunk"] == 16


def test_an_unwritable_cache_keeps_the_plan_in_the_process(fresh, monkeypatch):
    calls = _counting(monkeypatch)
    blocker = fresh / "tuning"
    blocker.write_text("a file where the folder would go")
    assert tuning.chunk_plan("kernel", 32, 32, torch.float32, False) == (16, None)
    assert tuning.chunk_plan("kernel", 32, 32, torch.float32, False) == (16, None)
    assert len(calls) == 1 and blocker.read_text() == "a file where the folder would go"


def test_tuning_off_takes_the_fixed_default_and_writes_nothing(fresh, monkeypatch):
    calls = _counting(monkeypatch)
    monkeypatch.setenv("STORELAB_TUNING", "0")
    assert tuning.chunk_plan("tensor", 64, 64, torch.float32, True) == (tuning.DEFAULT_CHUNK, None)
    assert calls == [] and not (fresh / "tuning").exists()


def _inputs(T=150, H=3, K=64, V=48, per_channel=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, T, H, K, generator=g)
    k = F.normalize(torch.randn(2, T, H, K, generator=g), dim=-1)
    v = torch.randn(2, T, H, V, generator=g)
    gate = F.logsigmoid(torch.randn(2, T, H, *((K,) if per_channel else ()), generator=g)) * 0.2
    beta = torch.rand(2, T, H, generator=g)
    return q, k, v, gate, beta


@pytest.mark.parametrize("form", ["kernel", "tensor"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_the_ops_default_runs_the_plan(fresh, monkeypatch, per_channel, form):
    """chunk_size=None runs the planned chunk (and group): the same numbers as passing them, bit for bit."""
    import storelab.ops.delta as delta

    if form == "tensor":  # as where the kernel does not build
        monkeypatch.setattr(delta, "_kernel_takes", lambda q: False)
    plan = tuning.ChunkPlan(16, None if form == "kernel" else 2 * 6 * 16 * 64)
    calls = _counting(monkeypatch, plan)
    q, k, v, gate, beta = _inputs(per_channel=per_channel)
    op = kda if per_channel else gated_delta_rule
    o, S = op(q, k, v, g=gate, beta=beta, output_final_state=True)
    assert calls == [(form, 64, 48, torch.float32, per_channel)]
    if form == "tensor":  # the tensor form at that chunk and group size
        o2, S2 = delta._chunked(q, k, v, gate, beta, 64 ** -0.5, None, 16, plan.group_floats)
    else:
        o2, S2 = op(q, k, v, g=gate, beta=beta, output_final_state=True, chunk_size=16)
    assert torch.equal(o, o2) and torch.equal(S, S2)
    o3, _ = op(q, k, v, g=gate, beta=beta, output_final_state=True, chunk_size=64)
    assert not torch.equal(o, o3)  # another chunk sums in another order: the plan was not ignored


@pytest.mark.parametrize("form,per_channel", [("kernel", False), ("kernel", True), ("tensor", True), ("tensor", False)])
def test_calibration_times_every_candidate_and_returns_one(fresh, monkeypatch, form, per_channel):
    import storelab.ops.delta as delta

    seen = []
    real_chunked, real_kernel = delta._chunked, delta._chunked_compiled
    monkeypatch.setattr(delta, "_chunked", lambda *a: seen.append(("tensor", a[7], a[8])) or real_chunked(*a))
    monkeypatch.setattr(delta, "_chunked_compiled", lambda *a: seen.append(("kernel", a[7], None)) or real_kernel(*a))
    plan = tuning.calibrate(form, 32, 16, torch.float32, per_channel, tokens=128, rounds=1)
    candidates = tuning._candidates(form)
    assert plan in candidates
    tried = {(c, g) for f, c, g in seen if f == form}
    assert tried == {(p.chunk, p.group_floats) for p in candidates}
