"""The per-token C kernel of the delta rules (``storelab.ops.delta_step``) and its builder
(``storelab.ops.compiled``): it builds here, equals the per-token tensor rule in value and gradient for
every rule across lane groups, padding and spans, splits between threads without changing a bit, is
what training takes for small states (and only for them), and gives way to the chunked form when off."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import storelab.ops.compiled as compiled
import storelab.ops.delta_step as ds
from storelab.ops import delta_rule, gated_delta_rule, kda, linear_attention
from storelab.ops.delta_reference import _recurrent

OPS = {"linear_attention": linear_attention, "delta_rule": delta_rule, "gated_delta_rule": gated_delta_rule,
       "kda": kda}


def test_the_kernel_builds_on_this_machine():
    assert ds._library() is not None, compiled.compiled_unavailable("delta_step")
    assert ds.step_train_fits(torch.zeros(4, 1, 4, 16), torch.zeros(4, 1, 4, 16))


def _inputs(rule, B, T, H, K, V, *, dtype=torch.float64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = {"q": torch.randn(B, T, H, K, generator=gen, dtype=torch.float64),
         "k": F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), dim=-1),
         "v": torch.randn(B, T, H, V, generator=gen, dtype=torch.float64),
         "h0": torch.randn(B, H, K, V, generator=gen, dtype=torch.float64)}
    if rule != "linear_attention":
        x["beta"] = torch.rand(B, T, H, generator=gen, dtype=torch.float64)
    if rule != "delta_rule":
        shape = (B, T, H, K) if rule == "kda" else (B, T, H)
        x["g"] = F.logsigmoid(torch.randn(*shape, generator=gen, dtype=torch.float64) + 2.0)
    return {n: t.to(dtype).requires_grad_() for n, t in x.items()}


def _grads(fn, x, seed=1):
    o, S = fn(x)
    gen = torch.Generator().manual_seed(seed)
    do, dS = torch.randn(o.shape, generator=gen).to(o.dtype), torch.randn(S.shape, generator=gen).to(S.dtype)
    names = list(x)
    return o, S, dict(zip(names, torch.autograd.grad((o * do).sum() + (S * dS).sum(), [x[n] for n in names])))


def _kernel(x, scale):
    return ds.step_train(x["q"], x["k"], x["v"], x.get("g"), x.get("beta"), x["h0"], scale=scale)


def _reference(x, scale):
    return _recurrent(x["q"], x["k"], x["v"], x.get("g"), x.get("beta"), scale, x["h0"])


@pytest.mark.parametrize("rule", list(OPS))
@pytest.mark.parametrize("B, T, H", [(1, 5, 1), (3, 70, 6), (2, 64, 8)])
def test_the_kernel_equals_the_per_token_rule_in_value_and_gradient(rule, B, T, H):
    # 6 heads of 3 batches: 18 lanes, two groups of 16 (the second padded); T = 70: spans of 32, 32 and 6;
    # 2 x 8 = 16 heads: one group exactly; T = 5: one span shorter than SPAN
    x = _inputs(rule, B, T, H, 5, 3)
    o, S, got = _grads(lambda x: _kernel(x, 0.7), x)
    o_ref, S_ref, want = _grads(lambda x: _reference(x, 0.7), x)
    torch.testing.assert_close(o, o_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(S, S_ref, rtol=0, atol=1e-12)
    for n in want:
        torch.testing.assert_close(got[n], want[n], rtol=0, atol=1e-11, msg=lambda m: f"d{n}: {m}")


def test_gradcheck():
    x = _inputs("kda", 1, 6, 2, 3, 2)
    fn = lambda q, k, v, g, b, h0: ds.step_train(q, k, v, g, b, h0, scale=0.5)  # noqa: E731
    assert torch.autograd.gradcheck(fn, tuple(x[n] for n in ("q", "k", "v", "g", "beta", "h0")))


def test_fp32_follows_the_float64_rule_and_grads_arrive_without_a_state_gradient():
    x64 = _inputs("gated_delta_rule", 2, 300, 4, 16, 16)
    x32 = {n: t.detach().float().requires_grad_() for n, t in x64.items()}
    o, _ = _kernel(x32, 0.25)
    o.sum().backward()  # no gradient on the final state: its slot arrives as None
    o_ref, _ = _reference(x64, 0.25)
    o_ref.sum().backward()
    for n, t in x32.items():
        ref = x64[n].grad
        ratio = ((t.grad.double() - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt()).item()
        assert ratio < 1e-5, f"d{n}: RMS error ratio {ratio:.1e}"
    assert ((o.double() - o_ref).abs().max() / o_ref.abs().max()).item() < 1e-5


def test_two_threads_give_the_same_bits(monkeypatch):
    x = _inputs("kda", 3, 40, 12, 4, 4, dtype=torch.float32)  # 36 heads: three lane groups to split
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = _grads(lambda x: _kernel(x, 1.0), x)
        torch.set_num_threads(2)
        two = _grads(lambda x: _kernel(x, 1.0), x)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])
    assert all(torch.equal(one[2][n], two[2][n]) for n in x)


def _op_grad_fn(K, V, requires_grad=True, B=4, H=4):
    x = _inputs("gated_delta_rule", B, 20, H, K, V, dtype=torch.float32)
    with torch.set_grad_enabled(requires_grad):
        o, _ = gated_delta_rule(x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"], output_final_state=True)
    return o.grad_fn.name() if o.grad_fn is not None else None


def test_training_takes_the_kernel_for_small_states_only(monkeypatch):
    assert "DeltaSteps" in _op_grad_fn(16, 16)
    assert "DeltaSteps" in _op_grad_fn(32, 64)  # MAX_STATE exactly
    assert "DeltaChunks" in _op_grad_fn(64, 64)
    assert "DeltaSteps" in _op_grad_fn(16, 16, B=3, H=3)  # 9 heads in 16 lanes: more than half
    assert "DeltaChunks" in _op_grad_fn(16, 16, B=1, H=4)  # 4 heads in 16 lanes: mostly padding
    assert _op_grad_fn(16, 16, requires_grad=False) is None  # inference keeps its no-grad chunked path
    monkeypatch.setenv("STORELAB_COMPILED", "0")
    assert "DeltaChunks" in _op_grad_fn(16, 16)
    assert compiled.compiled_library("delta_step", ds._SIGNATURES) is None
    assert "STORELAB_COMPILED=0" in compiled.compiled_unavailable("delta_step")


def test_bf16_inputs_train_through_the_kernel(monkeypatch):
    import storelab.ops.delta_train as delta_train

    calls = []
    monkeypatch.setattr(delta_train, "step_train", lambda *a, **kw: calls.append(a[0].dtype) or ds.step_train(*a, **kw))
    x = _inputs("gated_delta_rule", 4, 40, 4, 8, 8, dtype=torch.bfloat16)
    o, S = gated_delta_rule(x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"], initial_state=x["h0"],
                            output_final_state=True)
    assert o.dtype == torch.bfloat16 and calls == [torch.float32]  # the kernel ran, on fp32 copies
    (o.float().sum() + S.float().sum()).backward()
    assert all(t.grad is not None and t.grad.dtype == torch.bfloat16 and torch.isfinite(t.grad.float()).all()
               for t in x.values())


def test_the_builder_writes_into_its_cache_and_reports_a_failed_build(tmp_path, monkeypatch):
    monkeypatch.setenv("STORELAB_CACHE_DIR", str(tmp_path))
    lib = compiled._build("delta_step")
    assert lib.delta_step_lanes() > 0
    built = list((tmp_path / "kernels").iterdir())
    assert len(built) == 1 and built[0].suffix == ".so"  # moved into place: no temporary file left
    compiled._build("delta_step")
    assert list((tmp_path / "kernels").iterdir()) == built  # the second call finds it
    monkeypatch.setenv("STORELAB_CACHE_DIR", str(tmp_path / "other"))
    monkeypatch.setenv("CC", "false")  # a "compiler" that fails
    monkeypatch.setattr(compiled, "_loaded", {})
    assert compiled.compiled_library("delta_step", ds._SIGNATURES) is None
    assert "could not build delta_step.c" in compiled.compiled_unavailable("delta_step")
    assert not any((tmp_path / "other" / "kernels").iterdir())


def test_an_unwritable_cache_falls_back_to_the_temporary_folder(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")  # the cache folder would have to live under a file
    monkeypatch.setenv("STORELAB_CACHE_DIR", str(blocker))
    monkeypatch.setattr(compiled.tempfile, "gettempdir", lambda: str(tmp_path))
    assert compiled._build("delta_step").delta_step_lanes() > 0
    assert blocker.read_text() == "not a folder"
    assert any(p.name.startswith("storelab-kernels-") for p in tmp_path.iterdir())


@pytest.mark.parametrize("name, bad", [("k", lambda t: t[:, :-1]), ("v", lambda t: t[..., None]),
                                       ("g", lambda t: t[..., :1, None]), ("beta", lambda t: t.double()),
                                       ("h0", lambda t: t[:, :1])])
def test_inputs_out_of_line_are_refused_by_name(name, bad):
    x = _inputs("gated_delta_rule", 2, 9, 8, 4, 4, dtype=torch.float32)
    x[name] = bad(x[name].detach())
    with pytest.raises(ValueError, match="S0" if name == "h0" else f"^{name}:"):
        _kernel(x, 1.0)


def test_a_kernel_is_built_again_when_a_header_it_includes_changes():
    """The build's key covers the kernel's own files and the shared headers it includes (simd_exp.h), so an edited
    header is never served from an old build."""
    from storelab.ops.compiled import _sources

    names = {k: [p.name for p in _sources(k)] for k in ("decode_step", "delta_chunk", "matvec")}
    assert names["decode_step"] == ["decode_step.c", "matvec_body.h", "simd_exp.h"]
    assert names["delta_chunk"] == ["delta_chunk.c", "delta_chunk_body.h", "simd_exp.h"]
    assert names["matvec"] == ["matvec.c", "matvec_body.h"]
