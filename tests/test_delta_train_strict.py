"""The chunked ops under autograd (what training runs) against the per-token rule, as strictly as
fla's own tests: lengths below a chunk, a multiple, one over and about a thousand; two value heads per
key head; scale 0.1 and 1; log decays from 100x stronger to 10x weaker than a typical gate, and exactly
zero for half the tokens; with and without an initial state. float64 to 1e-10 (relative to the
largest value); fp32 against the float64 rule within an RMS error ratio of 0.005 for outputs and
states, 0.008 for dq, dk, dv, dh0 and 0.02 for dg, dbeta. Each case runs both training forms: the
chunked one (``delta_train``) and, for these small states, the per-token C kernel (``delta_step``)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from storelab.ops import delta_rule, gated_delta_rule, kda, linear_attention

RULES = ("linear_attention", "delta_rule", "gated_delta_rule", "kda")


@pytest.fixture(autouse=True, params=["chunked", "per-token C"])
def training_form(request, monkeypatch):
    import storelab.ops.delta_step as ds

    if request.param == "chunked":
        monkeypatch.setattr(ds, "MAX_STATE", 0)
    else:  # (tests/test_delta_step.py fails where the kernel does not build)
        monkeypatch.setattr(ds, "MIN_FILL", 0.0)  # these few heads fill few lanes: take the kernel anyway
        assert ds.step_train_fits(torch.zeros(B, 1, HV, K), torch.zeros(B, 1, HV, V))
    return request.param
B, H, HV, K, V, C = 1, 1, 2, 8, 6, 16


def _inputs(rule, T, *, strength, zero_half, seed, dtype):
    gen = torch.Generator().manual_seed(seed)
    x = {"q": F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), dim=-1),
         "k": F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), dim=-1),
         "v": torch.randn(B, T, HV, V, generator=gen, dtype=torch.float64),
         "h0": torch.randn(B, HV, K, V, generator=gen, dtype=torch.float64)}
    if rule != "linear_attention":
        x["beta"] = torch.rand(B, T, HV, generator=gen, dtype=torch.float64)
    if rule in ("linear_attention", "gated_delta_rule", "kda"):
        shape = (B, T, HV, K) if rule == "kda" else (B, T, HV)
        g = F.logsigmoid(torch.randn(*shape, generator=gen, dtype=torch.float64) + 3.0) / strength
        if zero_half:
            g = torch.where(torch.arange(T).view(1, T, *[1] * (g.dim() - 2)) % 2 == 0, g, torch.zeros_like(g))
        x["g"] = g
    return {n: t.to(dtype).requires_grad_() for n, t in x.items()}


def _run(rule, x, *, scale, with_state, mode):
    op = {"linear_attention": linear_attention, "delta_rule": delta_rule, "gated_delta_rule": gated_delta_rule,
          "kda": kda}[rule]
    kw = {n: x[n] for n in ("g", "beta") if n in x}
    return op(x["q"], x["k"], x["v"], **kw, scale=scale, initial_state=x["h0"] if with_state else None,
              output_final_state=True, chunk_size=C, mode=mode)


def _outputs_and_grads(rule, x, *, scale, with_state, mode):
    o, S = _run(rule, x, scale=scale, with_state=with_state, mode=mode)
    gen = torch.Generator().manual_seed(7)
    do = torch.randn(o.shape, generator=gen, dtype=torch.float64).to(o.dtype)
    dS = torch.randn(S.shape, generator=gen, dtype=torch.float64).to(S.dtype)  # a gradient on the final state too
    names = [n for n in x if n != "h0" or with_state]
    grads = torch.autograd.grad((o * do).sum() + (S * dS).sum(), [x[n] for n in names])
    return {"o": o, "S": S, **{"d" + n: g for n, g in zip(names, grads)}}


def _rms_ratio(a, ref):
    a, ref = a.double(), ref.double()
    return ((a - ref).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-30)).item()


FP32_RATIO = {"o": 0.005, "S": 0.005, "dq": 0.008, "dk": 0.008, "dv": 0.008, "dh0": 0.008, "dg": 0.02, "dbeta": 0.02}

CASES = [(T, scale, strength, zero_half, with_state)
         for T in (7, 16, 17) for scale in (0.1, 1.0) for strength in (0.01, 1.0, 10.0)
         for zero_half in (False, True) for with_state in (False, True)]
CASES += [(1000, 1.0, 1.0, True, True), (1000, 0.1, 0.01, False, True), (1000, 1.0, 10.0, False, False)]
# the delta rule has no decay: only the cases at the typical strength without zeroed tokens apply
RULE_CASES = [(rule, *c) for rule in RULES for c in CASES if rule != "delta_rule" or (c[2] == 1.0 and not c[3])]


@pytest.mark.parametrize("rule, T, scale, strength, zero_half, with_state", RULE_CASES)
def test_chunk_mode_under_autograd_equals_the_per_token_rule(rule, T, scale, strength, zero_half, with_state):
    x64 = _inputs(rule, T, strength=strength, zero_half=zero_half, seed=T, dtype=torch.float64)
    want = _outputs_and_grads(rule, x64, scale=scale, with_state=with_state, mode="recurrent")
    got = _outputs_and_grads(rule, x64, scale=scale, with_state=with_state, mode="chunk")
    for n, ref in want.items():
        err = (got[n] - ref).abs().max().item()
        assert err <= 1e-10 * max(ref.abs().max().item(), 1.0), f"{rule} T={T} float64: {n} max abs err {err:.2e}"
    x32 = {n: t.detach().float().requires_grad_() for n, t in x64.items()}
    got32 = _outputs_and_grads(rule, x32, scale=scale, with_state=with_state, mode="chunk")
    for n, ref in want.items():
        ratio = _rms_ratio(got32[n], ref)
        assert ratio <= FP32_RATIO[n], f"{rule} T={T} fp32: {n} RMS error ratio {ratio:.2e} > {FP32_RATIO[n]}"


def test_the_fp32_bound_can_fail():
    """A wrong decay (one token late) breaks the bound the test above holds."""
    x = _inputs("gated_delta_rule", 33, strength=1.0, zero_half=False, seed=1, dtype=torch.float64)
    want = _outputs_and_grads("gated_delta_rule", x, scale=1.0, with_state=True, mode="recurrent")
    shifted = dict(x, g=torch.roll(x["g"].detach(), 1, dims=1).requires_grad_())
    got = _outputs_and_grads("gated_delta_rule", shifted, scale=1.0, with_state=True, mode="chunk")
    assert _rms_ratio(got["o"], want["o"]) > FP32_RATIO["o"]
