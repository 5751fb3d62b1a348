"""``storelab bench train``: the FLOP count of the chunked WY form (against torch's own counter on the
plain reference), and ``--quick`` end to end through the CLI (the JSON's structure, finite positive
ratios; no target is asserted: --quick sizes are not figures)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode
from typer.testing import CliRunner

from storelab.bench.kernels import delta_inputs, wy_delta_flops
from storelab.bench.train import comparable_matmul_n, wy_train_flops
from storelab.cli import app
from storelab.ops.delta_reference import chunk_reference

runner = CliRunner()


def test_wy_train_flops_by_hand():
    C = K = V = 64
    f = wy_train_flops(1, 64, 1, K, V, C)  # one chunk, one head
    assert f["forward"] == 2 * C * C * (3 * K + 2 * V) + C**3 // 3 + 6 * C * K * V == wy_delta_flops(1, 64, 1, K, V, C)
    assert f["backward"] == 2 * C * C * (5 * K + 4 * V) + 2 * C**3 + 12 * C * K * V
    assert f["total"] == f["forward"] + f["backward"]
    assert f["backward"] / f["forward"] == pytest.approx(1.96, abs=0.005)  # counted, not assumed
    # B, heads and chunks multiply; a partial chunk is padded to a whole one
    assert wy_train_flops(2, 4096, 8, K, V, C)["total"] == 2 * 8 * 64 * f["total"]
    assert wy_train_flops(1, 65, 1, K, V, C)["total"] == 2 * f["total"]


@pytest.mark.parametrize("T, C", [(64, 16), (50, 16), (40, 8)])
def test_wy_train_flops_against_torch_counter(T, C):
    """torch's FlopCounterMode counts the matrix products of ``chunk_reference`` (the WY form) under
    autograd. Forward: exactly the table without the inverse (a triangular solve, which the counter
    does not count). Backward: the table plus 2 C^2 K per chunk, since autograd differentiates
    K K^T as two products where the symmetric form needs one; the inverse's backward is one
    C x C x C product there (2 C^3, counted; the table's minimum) and a triangular solve (not counted)."""
    B, H, K = 1, 2, 8
    V, N = K, -(-T // C)
    x = {n: t.double().requires_grad_() for n, t in delta_inputs(B, T, H, K, per_channel=False).items()}
    S0 = torch.randn(B, H, K, V, dtype=torch.float64, requires_grad=True)  # every chunk's dS is needed
    with FlopCounterMode(display=False) as fwd:
        o, S = chunk_reference(x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"], scale=None, initial_state=S0,
                               chunk_size=C)
    with FlopCounterMode(display=False) as bwd:
        torch.autograd.grad((o, S), [*x.values(), S0], (torch.randn_like(o), torch.randn_like(S)))
    ours = wy_train_flops(B, T, H, K, V, C)
    assert fwd.get_total_flops() == ours["forward"] - B * H * N * (C**3 // 3)
    assert bwd.get_total_flops() == ours["backward"] + B * H * N * 2 * C * C * K


def test_comparable_matmul_n():
    assert comparable_matmul_n(2 * 1024**3) == 1024
    assert comparable_matmul_n(1.0) == 128 and comparable_matmul_n(1e15) == 4096
    assert comparable_matmul_n(2 * 1000**3) % 64 == 0


def _positive(x) -> bool:
    return x is not None and math.isfinite(x) and x > 0


@pytest.fixture
def keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)  # the CLI's --threads sets the process's count; later tests get theirs back


def test_bench_train_quick_json(keep_threads):
    models = ["qwen3.8", "mimo-v2.6-pro"]  # a recurrent hybrid and an attention model (all seven: minutes)
    # one thread: on a busy 2-core machine two threads' small calls wait for each other (docs/bench.md)
    res = runner.invoke(app, ["bench", "train", "--quick", "--json", "--threads", "1",
                              *[a for m in models for a in ("--model", m)]])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert {"date", "machine", "quick", "train"} <= set(out) and out["quick"]
    r = out["train"]
    assert r["threads"] == 1
    assert set(r["ops"]) == {"gdn", "kda"}
    for name, o in r["ops"].items():
        for key in ("ours_ms", "peer_ms", "speedup", "matmul_gflops", "ours_gflops", "fraction_of_matmul"):
            assert _positive(o[key]), (name, key, o[key])
        s = o["shape"]
        assert o["flops"] == wy_train_flops(s["B"], s["T"], s["H"], s["K"], s["V"], o["chunk"]["ours"])
        assert o["fraction_of_matmul"] == pytest.approx(
            o["flops"]["total"] / (o["ours_ms"] / 1e3) / (o["matmul_gflops"] * 1e9))
        assert o["grad_max_abs_diff"] < 1e-3  # ours and the peer differentiate the same function
        assert len(o["targets"]) == 2 and all(isinstance(v, bool) for v in o["targets"].values())
        assert {"ours", "peer", "matmul"} == set(o["timings"])
    assert [m["model"] for m in r["models"]] == models
    for m in r["models"]:
        assert "error" not in m, m
        for key in ("ours_ms", "peer_ms", "speedup", "ours_tok_s", "peer_tok_s"):
            assert _positive(m[key]), (m["model"], key)
        assert m["target"] == (2.0 if m["model"] == "qwen3.8" else 1.5) and isinstance(m["meets_target"], bool)
    mem = r["memory"]
    assert mem["lengths"] == [128, 512] and "profiler" in mem["method"]
    for m in mem["models"]:
        assert "error" not in m, m
        assert set(m["peak_mb"]) == {"128", "512"} and all(_positive(v) for v in m["peak_mb"].values())
        assert _positive(m["ratio"]) and isinstance(m["meets_target"], bool)
        assert m["peak_mb"]["512"] > m["peak_mb"]["128"]  # a longer step holds more
    from storelab.commands.bench import print_tables

    print_tables(out)  # the tables for people render from the same document
