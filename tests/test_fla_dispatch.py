"""The optional dispatch to fla's kernels (storelab.ops.fla), on the CPU with a fake fla.

The fake implements fla's documented contract independently (a per-token loop: layout [B, T, H, K],
g in log space, state [B, H, K, V], the same heads for q, k and v, scale default K ** -0.5) and
records every call, so a store that dispatches must reproduce its own torch path through it.
"""

from __future__ import annotations

import copy
import json
import sys

import pytest
import torch

import storelab.ops.fla as fla_dispatch
from storelab.stores import build_store
from tests.helpers import assert_close, install_fake_fla

STORES = {
    "gated_deltanet": dict(kind="gated_deltanet", d_model=32, n_heads=2, head_k_dim=16, chunk_size=4),
    "gated_deltanet_grouped": dict(kind="gated_deltanet", d_model=32, n_heads=2, n_v_heads=4, head_k_dim=16,
                                   head_v_dim=8, chunk_size=4),
    "kda": dict(kind="kda", d_model=32, n_heads=2, head_k_dim=16, chunk_size=4),
}


def _fake_kernel(name: str, calls: list[dict]):
    """fla's kernel contract as a per-token loop; q, k, v, g, beta positional, three keywords only."""

    def kernel(q, k, v, g, beta, *, scale, initial_state, output_final_state):
        calls.append(dict(name=name, q=tuple(q.shape), k=tuple(k.shape), v=tuple(v.shape), g=tuple(g.shape),
                          beta=tuple(beta.shape), g_max=float(g.max()), scale=scale,
                          contiguous=all(x.is_contiguous() for x in (q, k, v, g, beta)),
                          initial_state=None if initial_state is None
                          else (tuple(initial_state.shape), initial_state.dtype)))
        B, T, H, K = q.shape
        assert k.shape == q.shape and v.shape[:3] == (B, T, H) and beta.shape == (B, T, H)
        assert g.shape == ((B, T, H, K) if name == "kda" else (B, T, H))
        out_dtype = q.dtype
        q, k, v, g, beta = (x.float() for x in (q, k, v, g, beta))  # fla's kernels accumulate in fp32
        S = q.new_zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state.clone()
        o = []
        for t in range(T):
            a = g[:, t].exp()
            S = S * (a[..., None] if name == "kda" else a[..., None, None])           # decay per channel / head
            err = v[:, t] - torch.einsum("bhkv,bhk->bhv", S, k[:, t])
            S = S + k[:, t, :, :, None] * (beta[:, t, :, None] * err)[:, :, None, :]  # delta write
            o.append(torch.einsum("bhkv,bhk->bhv", S, scale * q[:, t]))
        return torch.stack(o, dim=1).to(out_dtype), (S if output_final_state else None)

    kernel.__name__ = "chunk_kda" if name == "kda" else "chunk_gated_delta_rule"
    return kernel


@pytest.fixture
def fake_fla(monkeypatch):
    """A fake fla in sys.modules, CUDA said to be available and CPU tensors sent to fla; yields the calls."""
    calls: list[dict] = []
    install_fake_fla(monkeypatch, _fake_kernel("gated_delta_rule", calls), _fake_kernel("kda", calls))
    return calls


def _build(case: str, **over):
    torch.manual_seed(0)
    m = build_store({**STORES[case], **over}).build().eval()
    with torch.no_grad():  # O(1) outputs, so a wrong scale or a lost carry cannot hide under the tolerance
        for p in m.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, p.shape[-1] ** -0.5)
    return m


def _two_calls(m, x):
    with torch.no_grad():
        y1, st = m(x[:, :13])
        y2, st = m(x[:, 13:], st)
    return torch.cat([y1, y2], dim=1), st


@pytest.mark.parametrize("case", list(STORES))
def test_dispatched_store_equals_its_torch_path(fake_fla, monkeypatch, case):
    m = _build(case)
    assert m.backend == "fla"
    x = torch.randn(2, 21, 32, generator=torch.Generator().manual_seed(1))
    y, st = _two_calls(m, x)
    calls = list(fake_fla)
    assert len(calls) == 2

    monkeypatch.setattr(fla_dispatch, "FLA_DEVICES", ("cuda",))  # same module, CPU tensors: the torch path
    want, want_st = _two_calls(m, x)
    assert len(fake_fla) == 2
    twin = copy.deepcopy(m)  # the dispatch survives a copy; on a store built without fla, the same weights
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    plain = _build(case)
    plain.load_state_dict(twin.state_dict())
    assert plain.backend == "torch" and twin.backend == "fla"
    want_plain, _ = _two_calls(plain, x)

    assert want.abs().max() > 0.1
    assert_close(y, want, 1e-5, f"{case} fla vs torch")
    assert_close(want_plain, want, 0.0, f"{case} torch path of a store built without fla")
    assert st.S.dtype == torch.float32 and st.seen == 21
    assert_close(st.S, want_st.S, 1e-5, f"{case} state")

    cfg = m.cfg
    B, H, HV, K, V = 2, cfg.n_heads, cfg.n_value_heads, cfg.head_k_dim, cfg.head_v_dim
    name = "kda" if case == "kda" else "gated_delta_rule"
    for call, T in zip(calls, (13, 8)):
        assert call["name"] == name
        assert call["q"] == call["k"] == (B, T, HV, K)  # q and k repeated to the value heads before the call
        assert call["v"] == (B, T, HV, V) and call["beta"] == (B, T, HV)
        assert call["g"] == ((B, T, HV, K) if case == "kda" else (B, T, HV)) and call["g_max"] <= 0
        assert call["scale"] == K ** -0.5 and call["contiguous"]
    assert calls[0]["initial_state"] is None
    assert calls[1]["initial_state"] == ((B, HV, K, V), torch.float32)


@pytest.mark.parametrize("case", ["gated_deltanet", "kda"])
@pytest.mark.parametrize("off", ["no_cuda", "env", "import_error", "recurrent_mode"])
def test_no_dispatch(fake_fla, monkeypatch, case, off):
    over = {}
    if off == "no_cuda":
        monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    elif off == "env":
        monkeypatch.setenv("STORELAB_FLA", "0")
    elif off == "import_error":  # a None entry makes the import fail, as for a missing package
        monkeypatch.setitem(sys.modules, "fla.ops.gated_delta_rule", None)
        monkeypatch.setitem(sys.modules, "fla.ops.kda", None)
    else:
        over = dict(mode="recurrent")
    m = _build(case, **over)
    assert m.backend == "torch"
    with torch.no_grad():
        m(torch.randn(1, 5, 32))
    assert fake_fla == []


def test_other_kinds_never_dispatch(fake_fla):
    for kind in ("linear_attention", "deltanet"):
        m = build_store(dict(kind=kind, d_model=32, n_heads=2, head_k_dim=16)).build()
        assert m.backend == "torch"
    assert fla_dispatch.fla_kernels(["kda", "gated_delta_rule"]).keys() == {"kda", "gated_delta_rule"}
    with pytest.raises(ValueError, match="names"):
        fla_dispatch.fla_kernels(["deltanet"])


@pytest.mark.parametrize("bad, arg", [
    (dict(k=torch.zeros(1, 5, 3, 8)), "q, k, v"),
    (dict(v=torch.zeros(1, 5, 3, 4)), "v"),
    (dict(beta=torch.zeros(1, 5, 2)), "beta"),
    (dict(g=torch.zeros(1, 5, 4, 4)), "g"),
    (dict(initial_state=torch.zeros(1, 4, 8, 5)), "initial_state"),
])
def test_run_fla_shape_errors_name_the_argument(bad, arg):
    args = dict(q=torch.zeros(1, 5, 2, 8), k=torch.zeros(1, 5, 2, 8), v=torch.zeros(1, 5, 4, 4),
                g=torch.zeros(1, 5, 4), beta=torch.zeros(1, 5, 4), initial_state=None)
    args.update(bad)
    never = lambda *a, **kw: pytest.fail("the kernel must not be called")  # noqa: E731
    with pytest.raises(ValueError, match=f"^{arg}:"):
        fla_dispatch.run_fla(never, args.pop("q"), args.pop("k"), args.pop("v"), **args)


@pytest.mark.parametrize("fla", ["missing", "fake"])
def test_gpu_script_runs_on_the_cpu(request, tmp_path, fla):
    """The prepared GPU script end to end at its quick sizes: as a CPU sees it (fla skipped), and with
    the fake fla taking CPU tensors (every fla step of the script runs; transformers' peer skipped)."""
    from storelab.bench.gpu import main

    calls = request.getfixturevalue("fake_fla") if fla == "fake" else None
    out = tmp_path / "g.json"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # on a busy machine two spinning threads make this run ten times slower
    try:
        main(["--device", "cpu", "--quick", "--out", str(out)] + (["--no-peer"] if fla == "fake" else []))
    finally:
        torch.set_num_threads(threads)
    r = json.loads(out.read_text())
    assert {"environment", "correctness", "op_timing", "prefill"} <= set(r)
    assert r["environment"]["device"] == "cpu"
    assert len(r["correctness"]) == len(r["op_timing"]) == 4 and len(r["prefill"]) == 2
    for row in r["correctness"] + r["op_timing"] + r["prefill"]:
        assert "error" not in row, row
    for row in r["correctness"]:
        assert row["ours_o_finite"]
        if fla == "missing":
            assert row["fla"] == "unavailable"
        else:
            assert row["fla"] == "ok"
            tol = 1e-4 if row["dtype"] == "fp32" else 2e-2  # both return bf16 outputs from bf16 inputs
            assert max(row["o_max_abs_diff"], row["split_o_max_abs_diff"], row["S_max_abs_diff"]) < tol, row
    for row in r["prefill"]:
        assert row["fla_off"]["tok_s"] > 0 and row["fla_off"]["backends"] == ["torch"]
        if fla == "missing":
            assert "skipped" in row["fla_on"] and "tok_s" in row["peer"]
        else:
            assert row["fla_on"]["backends"] == ["fla"] and row["logits_max_abs_diff"] < 1e-4, row
    if fla == "fake":
        assert {c["name"] for c in calls} == {"gated_delta_rule", "kda"}
