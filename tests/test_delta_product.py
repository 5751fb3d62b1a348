"""Gated DeltaProduct (arXiv 2502.10297): the op against fla-core's own reference, its three forms
against each other, n = 1 against the gated delta rule, and the store alone and in a model file.

fla's ``naive_recurrent_gated_delta_product`` (``fla/ops/gated_delta_product/naive.py``) is loaded from
its file, as tests/test_fla_oracle.py loads the others (importing ``fla.ops`` would import triton).
Its layout puts the n writes of token t at rows t n .. t n + n - 1: ours, [B, T, n, ...], flattened.
"""

from __future__ import annotations

import importlib.util
import pathlib

import pytest
import torch
import torch.nn.functional as F

from storelab.models.config import ModelConfig
from storelab.models.model import Model, prefill
from storelab.ops import gated_delta_product, gated_delta_rule
from storelab.stores import REGISTRY, build_store
from tests.helpers import assert_close, one_pass_and_chunks

LENGTHS = [1, 7, 33, 65]


@pytest.fixture(scope="module")
def fla_naive():
    spec = importlib.util.find_spec("fla")
    if spec is None or spec.origin is None:
        pytest.skip("fla-core is not installed")
    path = pathlib.Path(spec.origin).parent / "ops" / "gated_delta_product" / "naive.py"
    if not path.exists():
        pytest.skip("this fla-core has no gated_delta_product reference")
    mod_spec = importlib.util.spec_from_file_location("_fla_naive_gated_delta_product", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod.naive_recurrent_gated_delta_product


def _inputs(T, n, *, B=2, H=2, HV=2, K=8, V=6, dtype=torch.float64, beta_max=2.0, seed=0):
    gen = torch.Generator().manual_seed(seed + 100 * T + n)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=dtype)  # noqa: E731
    return dict(q=F.normalize(r(B, T, H, K), dim=-1), k=F.normalize(r(B, T, n, H, K), dim=-1),
                v=r(B, T, n, HV, V), g=F.logsigmoid(r(B, T, HV) + 2.0),
                beta=beta_max * torch.rand(B, T, n, HV, generator=gen, dtype=dtype), S0=r(B, HV, K, V))


def _ours(x, *, gated=True, **kw):
    return gated_delta_product(x["q"], x["k"], x["v"], g=x["g"] if gated else None, beta=x["beta"],
                               initial_state=x["S0"], output_final_state=True, **kw)


# ---------------------------------------------------------------------------- the op against fla's reference
@pytest.mark.parametrize("T", LENGTHS)
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("gated", [True, False])
@pytest.mark.parametrize("mode", ["recurrent", "chunk"])
def test_equals_fla_reference(fla_naive, T, n, gated, mode):
    x = _inputs(T, n, dtype=torch.float32)
    B, _, H, K = x["q"].shape
    want_o, want_S = fla_naive(x["q"], x["k"].flatten(1, 2), x["v"].flatten(1, 2), x["g"] if gated else None,
                               x["beta"].flatten(1, 2), K ** -0.5, initial_state=x["S0"].clone(),
                               output_final_state=True, num_householder=n)
    o, S = _ours(x, gated=gated, mode=mode, chunk_size=4)
    assert want_o.abs().max() > 0.1
    assert_close(o, want_o, 2e-5, f"T={T} n={n} gated={gated} {mode} output")
    assert_close(S, want_S, 2e-5, f"T={T} n={n} gated={gated} {mode} final state")


@pytest.mark.parametrize("scale", [None, 0.3])
def test_grouped_heads_and_scale_equal_fla_reference_on_repeated_heads(fla_naive, scale):
    """4 value heads read 2 query/key heads: fla's reference, which has one head count, sees them repeated."""
    n, T = 2, 33
    x = _inputs(T, n, HV=4, dtype=torch.float32)
    K = x["q"].shape[-1]
    q, k = x["q"].repeat_interleave(2, dim=2), x["k"].repeat_interleave(2, dim=3)
    want_o, want_S = fla_naive(q, k.flatten(1, 2), x["v"].flatten(1, 2), x["g"], x["beta"].flatten(1, 2),
                               K ** -0.5 if scale is None else scale, initial_state=x["S0"].clone(),
                               output_final_state=True, num_householder=n)
    o, S = _ours(x, scale=scale)
    assert_close(o, want_o, 2e-5, "grouped output")
    assert_close(S, want_S, 2e-5, "grouped final state")


# ---------------------------------------------------------------------------- our forms against each other
@pytest.mark.parametrize("T", LENGTHS)
@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("gated", [True, False])
def test_chunk_and_scan_equal_the_per_token_loop(T, n, gated):
    x = _inputs(T, n, HV=4)
    want = _ours(x, gated=gated, mode="recurrent")
    for mode, C in (("chunk", 4), ("chunk", 32), ("scan", 32)):
        got = _ours(x, gated=gated, mode=mode, chunk_size=C)
        assert_close(got[0], want[0], 1e-10, f"T={T} n={n} {mode} C={C} output")
        assert_close(got[1], want[1], 1e-10, f"T={T} n={n} {mode} C={C} final state")


@pytest.mark.parametrize("n", [1, 2, 3])
def test_gradients_of_scan_equal_the_per_token_loop(n):
    """float64; the chunked form, like the delta rules', refuses autograd (it writes into buffers)."""
    grads = {}
    for mode in ("recurrent", "scan"):
        x = {k: t.clone().requires_grad_() for k, t in _inputs(33, n, HV=4).items()}
        o, S = _ours(x, mode=mode)
        w = torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)
        ((o * w).sum() + S.square().sum()).backward()
        grads[mode] = {k: t.grad for k, t in x.items()}
    for k in grads["recurrent"]:
        assert grads["recurrent"][k].abs().max() > 0, k
        assert_close(grads["scan"][k], grads["recurrent"][k], 1e-9, f"n={n} d/d{k}")


@pytest.mark.parametrize("mode", ["chunk", "recurrent", "scan"])
def test_one_write_per_token_is_the_gated_delta_rule(mode):
    x = _inputs(33, 1, HV=4)
    o, S = _ours(x, mode=mode)
    want_o, want_S = gated_delta_rule(x["q"], x["k"][:, :, 0], x["v"][:, :, 0], g=x["g"], beta=x["beta"][:, :, 0],
                                      initial_state=x["S0"], output_final_state=True, mode=mode)
    assert_close(o, want_o, 1e-12, f"{mode} output")
    assert_close(S, want_S, 1e-12, f"{mode} state")


def test_two_reflections_rotate():
    """beta = 2 on two unit keys at angle pi/6 turns the state by pi/3 (a rotation, det +1), which one
    factor I - beta k k^T per token, with real eigenvalues, cannot do in one step."""
    a = torch.tensor(torch.pi / 6, dtype=torch.float64)
    k = torch.stack([torch.tensor([1.0, 0.0], dtype=torch.float64), torch.stack([a.cos(), a.sin()])])
    S0 = torch.eye(2, dtype=torch.float64)[None, None]                                     # B HV K V
    _, S = gated_delta_product(torch.zeros(1, 1, 1, 2, dtype=torch.float64), k[None, None, :, None],
                               torch.zeros(1, 1, 2, 1, 2, dtype=torch.float64), beta=torch.full((1, 1, 2, 1), 2.0,
                                                                                                 dtype=torch.float64),
                               initial_state=S0, output_final_state=True, mode="recurrent")
    R = S[0, 0]                                        # (I - 2 k2 k2^T)(I - 2 k1 k1^T), a rotation by 2 (pi/6)
    assert_close(R, torch.tensor([[0.5, 3 ** 0.5 / 2], [-(3 ** 0.5) / 2, 0.5]], dtype=torch.float64).T, 1e-12,
                 "rotation")
    assert torch.linalg.det(R).item() == pytest.approx(1.0)


@pytest.mark.parametrize("bad, arg", [
    (dict(k=torch.zeros(1, 5, 2, 2, 7)), "q, k"),
    (dict(v=torch.zeros(1, 5, 3, 2, 4)), "v"),
    (dict(v=torch.zeros(1, 5, 2, 3, 4)), "v"),
    (dict(beta=torch.zeros(1, 5, 2)), "beta"),
    (dict(g=torch.zeros(1, 5, 2, 8)), "g"),
    (dict(initial_state=torch.zeros(1, 2, 8, 5)), "initial_state"),
    (dict(mode="fast"), "mode"),
])
def test_shape_errors_name_the_argument(bad, arg):
    args = dict(q=torch.zeros(1, 5, 2, 8), k=torch.zeros(1, 5, 2, 2, 8), v=torch.zeros(1, 5, 2, 2, 4),
                g=torch.zeros(1, 5, 2), beta=torch.zeros(1, 5, 2, 2), initial_state=None)
    args.update(bad)
    with pytest.raises(ValueError, match=f"^{arg}:"):
        gated_delta_product(args.pop("q"), args.pop("k"), args.pop("v"), **args)


# ---------------------------------------------------------------------------- the store
SMALL = dict(kind="gated_deltaproduct", d_model=32, n_heads=2, n_v_heads=4, head_k_dim=8, head_v_dim=6, chunk_size=4)
CASES = {"n2": {}, "n3_ungated": {"num_householder": 3, "gated": False}, "n1": {"num_householder": 1},
         "n2_beta2": {"beta_max": 2.0}}


def _module(case, **over):
    torch.manual_seed(0)
    m = build_store({**SMALL, **CASES[case], **over}).build()
    with torch.no_grad():  # O(1) outputs, so a wrong carry cannot hide under the tolerance
        for p in m.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, p.shape[-1] ** -0.5)
    return m


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("chunks", [[1] * 11, [3, 4, 4], [2, 9]])
def test_store_prefill_then_step_equals_one_pass(case, chunks):
    m = _module(case)
    x = torch.randn(2, 11, 32, generator=torch.Generator().manual_seed(1))
    want, full, got, st = one_pass_and_chunks(m, x, chunks)
    assert want.abs().max() > 0.1
    assert_close(got, want, 1e-5, f"{case} chunks {chunks}")
    assert_close(st.S, full.S, 1e-5, f"{case} state")
    assert st.seen == 11


@pytest.mark.parametrize("case", list(CASES))
def test_store_modes_agree(case):
    x = torch.randn(1, 9, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want, _ = _module(case)(x)
        for mode in ("recurrent", "scan"):
            assert_close(_module(case, mode=mode)(x)[0], want, 1e-5, f"{case} mode {mode}")


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("L", [1, 10])
def test_store_bytes_params_and_footprint(case, L):
    cfg = build_store({**SMALL, **CASES[case]})
    m = _module(case)
    with torch.no_grad():
        _, st = m(torch.randn(1, L, 32))
    fp = cfg.footprint(L, dtype="fp32")
    HV, K, V, W, n = 4, 8, 6, cfg.conv_kernel, cfg.num_householder
    assert st.nbytes() == fp.state_bytes == HV * K * V * 4 + (W - 1) * ((n + 1) * 2 * K + n * HV * V) * 4
    assert fp.kept == fp.read == st.entries == HV and fp.read_flops == 2 * (n + 1) * HV * K * V  # n writes, 1 query
    assert cfg.footprint(10**6, dtype="bf16").state_bytes == cfg.footprint(L, dtype="bf16").state_bytes
    assert cfg.num_params().stored == sum(p.numel() for p in m.parameters())
    assert ("a_proj" in dict(m.named_children())) == cfg.gated


def test_one_write_store_is_a_gated_deltanet_store():
    """num_householder = 1: Gated DeltaNet's parameters, names and outputs."""
    gdn = build_store({**SMALL, "kind": "gated_deltanet"}).build()
    gdp = build_store({**SMALL, "num_householder": 1}).build()
    assert [(k, v.shape) for k, v in gdp.state_dict().items()] == [(k, v.shape) for k, v in gdn.state_dict().items()]
    gdp.load_state_dict(gdn.state_dict())
    x = torch.randn(2, 13, 32, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert_close(gdp(x)[0], gdn(x)[0], 1e-6, "n = 1 vs gated_deltanet")


def test_card_order_round_trip_and_bad_fields():
    cls = REGISTRY["gated_deltaproduct"]
    assert cls.CARD_ORDER == 145 and cls.RECURRENT and "2502.10297" in cls.CARD.source
    cfg = build_store(SMALL)
    assert build_store(cfg.to_dict()) == cfg and cfg.num_householder == 2 and cfg.gated
    for bad, field in (({"num_householder": 0}, "num_householder"), ({"gated": "yes"}, "gated"),
                       ({"beta_max": 2.5}, "beta_max"), ({"n_heads": 3}, "n_v_heads")):
        with pytest.raises(ValueError, match=field):
            build_store({**SMALL, **bad})


def test_in_a_model_file():
    """One Gated DeltaProduct layer beside an attention layer, read as a model file and run; prefill then
    decode equals one pass."""
    cfg = ModelConfig.from_dict({
        "name": "tiny-gdp", "d_model": 32, "vocab_size": 64, "n_layers": 2,
        "stores": {"gdp": {"kind": "gated_deltaproduct", "n_heads": 2, "head_k_dim": 8, "num_householder": 3,
                           "chunk_size": 4},
                   "attn": {"kind": "attention", "n_heads": 2, "head_dim": 8},
                   "ffn": {"kind": "ffn", "d_ff": 64}, "res": {"kind": "residual"}},
        "layers": [{"at": "all", "pattern": "GA", "token": {"G": "gdp", "A": "attn"}, "channel": "ffn",
                    "depth": "res"}]}, source="tiny-gdp")
    torch.manual_seed(0)
    model = Model(cfg).eval()
    ids = torch.randint(0, 64, (2, 14), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want, _ = model(ids)
        logits, cache = prefill(model, ids[:, :9], chunk=4)
        got = [logits]
        for t in range(9, 14):
            step, cache = model(ids[:, t:t + 1], cache)
            got.append(step[:, -1])
    assert_close(torch.stack(got[1:], 1), want[:, 9:], 1e-4, "decode")
    assert_close(got[0].reshape(want[:, 8].shape), want[:, 8], 1e-4, "prefill")
    assert cfg.layers[0].token.num_householder == 3
