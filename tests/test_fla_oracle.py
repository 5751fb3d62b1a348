"""fla's own reference code behind our dispatch to fla (storelab.ops.fla), on the CPU.

fla-core, a test dependency here (its Triton kernels need triton and a GPU, neither of which a
test machine has), ships pure-PyTorch references of its kernels: ``naive_recurrent_gated_delta_rule``
and ``naive_recurrent_kda`` in ``fla/ops/*/naive.py``. Loaded from their files (importing
``fla.ops`` would import triton), they stand in for ``chunk_gated_delta_rule`` and ``chunk_kda``,
the kernels ``run_fla`` calls. So the mapping of our contract onto fla's (layout [B, T, H, K],
g in log space, the scale, the state's layout, grouped heads repeated) is checked against fla's
semantics as fla's authors wrote them, where tests/test_fla_dispatch.py checks it against our
reading of fla's documentation.
"""

from __future__ import annotations

import importlib.util
import pathlib

import pytest
import torch
import torch.nn.functional as F

import storelab.ops.fla as fla_dispatch
from storelab.ops import gated_delta_rule, kda
from storelab.stores import build_store
from tests.helpers import assert_close, install_fake_fla

pytest.importorskip("einops")  # fla's references use it (fla-core depends on it)


def _naive(rule: str):
    """fla's reference module of ``rule`` ("gated_delta_rule" or "kda"), loaded from its file."""
    spec = importlib.util.find_spec("fla")
    if spec is None or spec.origin is None:
        pytest.skip("fla-core is not installed")
    path = pathlib.Path(spec.origin).parent / "ops" / rule / "naive.py"
    mod_spec = importlib.util.spec_from_file_location(f"_fla_naive_{rule}", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def kernels():
    """fla's kernels' signatures (q, k, v, g, beta, *, scale, initial_state, output_final_state) on its
    references: the gated delta rule's takes beta before g, KDA's the kernel's own order."""
    gdr = _naive("gated_delta_rule").naive_recurrent_gated_delta_rule
    naive_kda = _naive("kda").naive_recurrent_kda

    def chunk_gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False):
        return gdr(q, k, v, beta, g, scale=scale, initial_state=initial_state, output_final_state=output_final_state)

    def chunk_kda(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False):
        return naive_kda(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                         output_final_state=output_final_state)

    return {"gated_delta_rule": chunk_gated_delta_rule, "kda": chunk_kda}


def _inputs(rule, B=2, T=37, H=2, HV=4, K=16, V=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen)  # noqa: E731
    g_shape = (B, T, HV, K) if rule == "kda" else (B, T, HV)
    return dict(q=F.normalize(r(B, T, H, K), dim=-1), k=F.normalize(r(B, T, H, K), dim=-1), v=r(B, T, HV, V),
                g=F.logsigmoid(r(*g_shape) + 2.0), beta=torch.rand(B, T, HV, generator=gen),
                S0=r(B, HV, K, V))


@pytest.mark.parametrize("rule", ["gated_delta_rule", "kda"])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_run_fla_on_fla_references_equals_our_ops(kernels, rule, scale):
    """Grouped heads (4 value heads read 2 query/key heads), an initial state, 37 tokens."""
    x = _inputs(rule)
    ours = (kda if rule == "kda" else gated_delta_rule)(x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"], scale=scale,
                                                        initial_state=x["S0"], output_final_state=True)
    theirs = fla_dispatch.run_fla(kernels[rule], x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"], scale=scale,
                                  initial_state=x["S0"], output_final_state=True)
    assert ours[0].abs().max() > 0.1
    assert_close(theirs[0], ours[0], 2e-5, f"{rule} output")
    assert theirs[1].dtype == torch.float32
    assert_close(theirs[1], ours[1], 2e-5, f"{rule} final state")


@pytest.mark.parametrize("rule", ["gated_delta_rule", "kda"])
def test_the_reference_is_not_blind_to_a_wrong_mapping(kernels, rule):
    """The comparison above can fail: the decay passed as a factor instead of its log, the scale left
    at 1, or the initial state dropped, each changes fla's answer well beyond the tolerance."""
    x = _inputs(rule, HV=2)
    S0 = x["S0"][:, :2]

    def run(g=x["g"], scale=None, S=S0):
        return kernels[rule](x["q"], x["k"], x["v"], g, x["beta"], scale=scale, initial_state=S,
                             output_final_state=True)[0]

    good = run()
    for what, other in (("decay as a factor", run(g=x["g"].exp())), ("scale 1", run(scale=1.0)),
                        ("no initial state", run(S=torch.zeros_like(S0)))):
        assert (good - other).abs().max() > 1e-2, what


@pytest.mark.parametrize("kind", ["gated_deltanet", "kda"])
def test_store_dispatched_to_fla_references_equals_its_torch_path(kernels, monkeypatch, kind):
    """A store built while 'fla' imports and CUDA is said to be available picks fla at construction; on
    CPU tensors sent to fla (FLA_DEVICES patched) it must match its own torch path over two calls."""
    install_fake_fla(monkeypatch, kernels["gated_delta_rule"], kernels["kda"])
    torch.manual_seed(0)
    cfg = dict(kind=kind, d_model=32, n_heads=2, head_k_dim=16)
    if kind == "gated_deltanet":
        cfg.update(n_v_heads=4, head_v_dim=8)
    m = build_store(cfg).build().eval()
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, p.shape[-1] ** -0.5)
    assert m.backend == "fla"
    x = torch.randn(2, 45, 32, generator=torch.Generator().manual_seed(1))

    def two_calls():
        with torch.no_grad():
            y1, st = m(x[:, :29])
            y2, st = m(x[:, 29:], st)
        return torch.cat([y1, y2], dim=1), st

    y, st = two_calls()
    monkeypatch.setattr(fla_dispatch, "FLA_DEVICES", ("cuda",))  # CPU tensors now take the torch path
    want, want_st = two_calls()
    assert want.abs().max() > 0.1
    assert_close(y, want, 2e-5, f"{kind} through fla's reference")
    assert_close(st.S, want_st.S, 2e-5, f"{kind} state through fla's reference")
