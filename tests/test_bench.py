"""``storelab bench``: smoke tests at tiny sizes (no timing is ever asserted), the decode bench's
state shortcut against a real prefill, and bf16 end to end with recurrent states kept in fp32."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from storelab.bench.decode import store_specs, written_state
from storelab.bench.kernels import chunk_delta_flops, wy_delta_flops
from storelab.cli import app
from storelab.stores import REGISTRY, build_store
from tests.helpers import assert_close

runner = CliRunner()


def run_json(*args: str) -> dict:
    res = runner.invoke(app, ["bench", *args, "--quick", "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_bench_gdn_json():
    out = run_json("gdn")
    r = out["gdn"]
    for key in ("ours_ms", "peer_ms", "speedup", "matmul_gflops", "flops", "ours_gflops", "fraction_of_matmul",
                "max_abs_diff", "targets", "timings"):
        assert key in r, key
    assert r["ours_ms"] > 0 and r["matmul_gflops"] > 0
    # each side counted at the chunk size it runs: ours at the one chunk_size=None picks on this CPU (the plan
    # the bench's calibration left for this shape), the peer at its 64
    from storelab.ops.tuning import chunk_plan

    before = torch.get_num_threads()
    torch.set_num_threads(r["threads"])
    try:
        C = chunk_plan("kernel", 16, 16, torch.float32, False).chunk
    finally:
        torch.set_num_threads(before)
    assert r["chunk"] == {"ours": C, "peer": 64} and C in (16, 32, 64)
    assert r["flops"] == chunk_delta_flops(1, 256, 2, 16, 16, C)
    assert r["peer_flops"] == wy_delta_flops(1, 256, 2, 16, 16, 64) > r["flops"]
    assert r["fraction_of_matmul"] == pytest.approx(r["flops"] / (r["ours_ms"] / 1e3) / (r["matmul_gflops"] * 1e9))
    assert r["max_abs_diff"] < 1e-4  # ours and the peer compute the same thing
    assert {"date", "machine"} <= set(out)


def test_bench_kda_json():
    r = run_json("kda")["kda"]
    for key in ("ours_ms", "peer_ms", "speedup", "ours_gdn_ms", "kda_over_gdn", "matmul_gflops", "targets"):
        assert key in r, key
    assert r["max_abs_diff"] < 1e-4


def test_bench_decode_json():
    r = run_json("decode")["decode"]
    assert r["contexts"] == [64, 256]
    avail = [s for s in r["stores"] if s["available"]]
    assert {s["kind"] for s in avail} >= {"attention", "window", "dsa"}
    for s in avail:
        assert set(s["step_ms"]) == {"64", "256"} and s["step_ratio"] > 0
        for L, c in s["contexts"].items():  # the states the bench built are the accounted ones
            assert c["matches_footprint"], (s["store"], L, c)
    dsa = next(s for s in avail if s["kind"] == "dsa")
    assert {"indexer_ms", "read_ms", "indexer_ratio", "read_ratio"} <= set(dsa)


def test_bench_rejects_unknown_bench():
    res = runner.invoke(app, ["bench", "nope", "--json"])
    assert res.exit_code != 0 and "which" in res.output


@pytest.mark.parametrize("kind", ["attention", "window", "dsa"])
def test_written_state_equals_a_real_prefill(kind):
    """The decode bench writes caches without the reads; that must be what a prefill leaves."""
    spec = next(s for s in store_specs(D=32, H=2, K=16, window=8, topk=4) if s["config"]["kind"] == kind)
    torch.manual_seed(0)
    module = build_store(spec["config"]).build().eval()
    x = torch.randn(1, 37, 32)
    with torch.inference_mode():
        _, real = module(x[:, :20])
        _, real = module(x[:, 20:], real)
        fake = written_state(module, kind, x, chunk=16)
    assert fake.seen == real.seen == 37 and fake.entries == real.entries
    assert fake.nbytes() == real.nbytes()
    if kind == "window":
        pairs = list(zip(fake.ordered(), real.ordered()))
    elif kind == "attention":
        pairs = [(fake.k, real.k), (fake.v, real.v)]
    else:
        pairs = [(fake.latent, real.latent), (fake.k_rope, real.k_rope), (fake.index_k, real.index_k)]
    for a, b in pairs:
        assert_close(a, b, 1e-6, kind)
    # and the next token's output is the same from either state
    with torch.inference_mode():
        y_real, _ = module(x[:, -1:], real)
        y_fake, _ = module(x[:, -1:], fake)
    assert_close(y_fake, y_real, 1e-5, f"{kind} step")


def test_bench_prefill_json():
    from storelab.zoo import zoo_names

    name = "mimo-v2.6-pro"
    if name not in zoo_names():
        pytest.skip(f"{name} has no tiny model yet")
    res = runner.invoke(app, ["bench", "prefill", "--quick", "--json", "--model", name, "--length", "256",
                              "--speed-length", "256", "--chunk", "64"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)["prefill"]
    (row,) = r["models"]
    mem, spd = row["memory"], row["speed"]
    assert "error" not in mem, mem
    for key in ("peak_above_weights_bytes", "analytic_bytes", "ratio", "within_10pct", "cache_nbytes",
                "tensor_peak_bytes", "tensor_ratio", "process_within_10pct"):
        assert key in mem, key
    assert mem["cache_matches_analytic"], mem  # what the cache holds is what the accounting says
    # the tensor peak holds at least the cache (and what the cache's buffers hold beyond their rows)
    assert mem["tensor_peak_bytes"] >= mem["cache_held_bytes"] >= mem["cache_nbytes"], mem
    assert "error" not in spd, spd
    assert spd["ours_tok_s"] > 0 and "peer_tok_s" in spd and "speedup" in spd


def test_allocation_peak_is_the_running_maximum():
    from torch.profiler import ProfilerActivity, profile

    from storelab.bench.prefill import _allocation_peak

    MB = 1 << 20
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        a = torch.empty(MB, dtype=torch.uint8)
        b = torch.empty(2 * MB, dtype=torch.uint8)
        del a
        c = torch.empty(MB // 2, dtype=torch.uint8)
        del b, c
    assert _allocation_peak(prof) == 3 * MB


def test_tensor_peak_run_profiles_sampled_chunks():
    from storelab.bench.prefill import tensor_peak_run
    from storelab.models.model import Model
    from storelab.zoo import load_zoo

    cfg = load_zoo("kimi-k3", tiny=True)
    torch.manual_seed(0)
    model = Model(cfg).eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, 200))
    r = tensor_peak_run(model, prompt, 16, every=4)
    assert r["chunks"] == 13 and r["profiled_chunks"] == 4   # chunks 0, 4, 8 and the last, 12
    assert r["tensor_peak_bytes"] > r["cache_held_bytes"] > 0


def test_bench_prefill_memory_chunk_is_its_own_run():
    """--memory-chunk reads the memory prompt in its own chunks, in a run apart from the timed one."""
    res = runner.invoke(app, ["bench", "prefill", "--quick", "--json", "--no-peer", "--model", "kimi-k3",
                              "--length", "256", "--speed-length", "256", "--chunk", "64", "--memory-chunk", "32"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)["prefill"]
    (row,) = r["models"]
    assert (r["chunk"], r["memory_chunk"]) == (64, 32)
    assert row["memory"]["chunk"] == 32 and row["speed"]["chunk"] == 64
    assert row["memory"]["cache_matches_analytic"]


# -- bf16 end to end, recurrent states in fp32 --------------------------------------------------------

@pytest.mark.parametrize("op", ["gated_delta_rule", "kda"])
def test_bf16_ops_keep_fp32_state(op):
    from storelab import ops
    from storelab.bench.kernels import delta_inputs

    x = delta_inputs(1, 70, 2, 16, per_channel=(op == "kda"))
    fn = getattr(ops, op)
    o32, S32 = fn(x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"], output_final_state=True)
    xb = {k: v.to(torch.bfloat16) for k, v in x.items()}
    ob, Sb = fn(xb["q"], xb["k"], xb["v"], g=xb["g"], beta=xb["beta"], output_final_state=True)
    assert ob.dtype == torch.bfloat16 and Sb.dtype == torch.float32
    assert_close(ob.float(), o32, 0.05, f"{op} bf16 vs fp32")


@pytest.mark.parametrize("kind", ["gated_deltanet", "kda"])
def test_bf16_recurrent_store_keeps_fp32_state(kind):
    if kind not in REGISTRY:
        pytest.skip(f"store kind {kind!r} is not registered yet")
    torch.manual_seed(0)
    module = build_store({"kind": kind, "d_model": 32, "n_heads": 2, "head_k_dim": 16}).build().eval()
    x = torch.randn(1, 21, 32)
    with torch.inference_mode():
        y32, _ = module(x)
        mb = module.to(torch.bfloat16)
        y, st = mb(x[:, :13].to(torch.bfloat16))
        y2, st = mb(x[:, 13:].to(torch.bfloat16), st)
    assert y.dtype == torch.bfloat16 and st.S.dtype == torch.float32
    assert_close(torch.cat([y, y2], 1).float(), y32, 0.1 * float(y32.abs().max()), f"{kind} bf16 vs fp32")


def _zoo_tiny():
    from storelab.zoo import zoo_names

    return zoo_names()


@pytest.mark.parametrize("name", _zoo_tiny())
def test_bf16_model_end_to_end(name):
    from storelab.models.model import Model, prefill
    from storelab.state import RecurrentState
    from storelab.zoo import load_zoo

    torch.manual_seed(0)
    cfg = load_zoo(name, tiny=True)
    model = Model(cfg).eval().to(torch.bfloat16)
    ids = torch.randint(0, cfg.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        logits, cache = prefill(model, ids, chunk=10)
        step, cache = model(ids[:, :1], cache)
    assert logits.dtype == torch.bfloat16 and torch.isfinite(logits.float()).all()
    assert torch.isfinite(step.float()).all()
    for lay in cache:
        st = lay.token
        if isinstance(st, RecurrentState) or getattr(st, "S", None) is not None:
            assert st.S.dtype == torch.float32, f"{name}: recurrent state kept in {st.S.dtype}"


def test_flop_counts_follow_the_algorithms():
    """Per chunk and head: ours keeps T and applies it to V - K S in the loop (2 C^2 V + 2 C K V), the
    textbook form makes W = T K first (2 C^2 K) and reads the state with W (2 C K V); counted by hand
    at C = 4, K = 3, V = 2 (and C^3 / 3 = 21 for the inverse)."""
    scores, inverse, kv = 2 * (2 * 4 * 4 * 3), 21, 2 * 4 * 3 * 2       # Q K^T and K K^T; C^3 / 3; one C K V product
    ours = scores + inverse + kv + 2 * 4 * 4 * 2 + kv + 2 * 4 * 4 * 2 + kv  # K S, T (V - K S), Q S, A V_new, K^T V_new
    wy = scores + inverse + 2 * 4 * 4 * 2 + 2 * 4 * 4 * 3 + kv + kv + 2 * 4 * 4 * 2 + kv  # U, W, W S, Q S, A V_new, ...
    assert chunk_delta_flops(1, 4, 1, 3, 2, 4) == ours
    assert wy_delta_flops(1, 4, 1, 3, 2, 4) == wy
    assert chunk_delta_flops(2, 9, 3, 3, 2, 4) == 2 * 3 * 3 * ours  # 9 tokens: three chunks, the last padded
