"""Feed-forward store: each activation against its plain formula, counts, protocol."""

import pytest
import torch

from storelab.state import EmptyState
from storelab.stores import build_store
from storelab.stores.ffn import FFNConfig
from tests.helpers import assert_close

D, F = 12, 20


def _plain(act: str, h: torch.Tensor, g: torch.Tensor | None, p: float = 2.0) -> torch.Tensor:
    if act == "relu":
        return torch.where(h > 0, h, torch.zeros_like(h))
    if act == "relu2":
        return torch.where(h > 0, h * h, torch.zeros_like(h))
    if act == "power":
        return torch.where(h > 0, h.abs() ** p, torch.zeros_like(h))
    if act == "gelu":
        return 0.5 * h * (1 + torch.erf(h / 2 ** 0.5))
    if act == "gelu_tanh":
        return 0.5 * h * (1 + torch.tanh((2 / torch.pi) ** 0.5 * (h + 0.044715 * h ** 3)))
    if act == "swiglu":
        return g / (1 + torch.exp(-g)) * h
    raise AssertionError(act)


@pytest.mark.parametrize("act,p", [("relu", 2.0), ("relu2", 2.0), ("power", 3.0), ("power", 1.5), ("gelu", 2.0),
                                   ("gelu_tanh", 2.0), ("swiglu", 2.0)])
@pytest.mark.parametrize("bias", [False, True])
def test_activation_matches_plain_formula(act, p, bias):
    torch.manual_seed(0)
    m = FFNConfig(d_model=D, d_ff=F, activation=act, power=p, bias=bias).build().double()
    x = torch.randn(2, 5, D, dtype=torch.float64)
    y, st = m(x)
    h = x @ m.up_proj.weight.T + (m.up_proj.bias if bias else 0)
    g = x @ m.gate_proj.weight.T + (m.gate_proj.bias if bias else 0) if act == "swiglu" else None
    want = _plain(act, h, g, p) @ m.down_proj.weight.T + (m.down_proj.bias if bias else 0)
    assert_close(y, want, 1e-12, act)
    assert isinstance(st, EmptyState) and st.seen == 5 and st.nbytes() == 0


def test_power_one_and_two_are_relu_and_relu2():
    torch.manual_seed(1)
    x = torch.randn(1, 4, D)
    for p, other in [(1.0, "relu"), (2.0, "relu2")]:
        a = FFNConfig(d_model=D, d_ff=F, activation="power", power=p).build()
        b = FFNConfig(d_model=D, d_ff=F, activation=other).build()
        b.load_state_dict(a.state_dict())
        assert_close(a(x)[0], b(x)[0], 1e-6, f"power {p} vs {other}")


@pytest.mark.parametrize("act", ["relu", "relu2", "power", "gelu", "gelu_tanh", "swiglu"])
@pytest.mark.parametrize("bias", [False, True])
def test_num_params_counts_the_module(act, bias):
    cfg = FFNConfig(d_model=D, d_ff=F, activation=act, bias=bias)
    n = sum(p.numel() for p in cfg.build().parameters())
    assert cfg.num_params().stored == n and cfg.num_params().active == n
    fp = cfg.footprint(1000, dtype="fp32")
    assert (fp.kept, fp.read, fp.state_bytes) == (0, 0, 0)
    assert fp.read_flops == 2 * n


def test_state_carries_seen_and_chunks_agree():
    torch.manual_seed(2)
    m = FFNConfig(d_model=D, d_ff=F, activation="relu2").build()
    x = torch.randn(1, 7, D)
    full, _ = m(x)
    st, outs = None, []
    for a, b in [(0, 3), (3, 4), (4, 7)]:
        y, st = m(x[:, a:b], st)
        outs.append(y)
    assert st.seen == 7
    assert_close(torch.cat(outs, 1), full, 1e-6, "chunked")


@pytest.mark.parametrize("bad,field", [
    (dict(activation="tanh"), "activation"),
    (dict(activation="power", power=0.0), "power"),
    (dict(d_ff=0), "d_ff"),
    (dict(d_model=-1), "d_model"),
])
def test_bad_config_names_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        FFNConfig(**{"d_model": D, "d_ff": F, **bad})


def test_registry_and_wrong_input():
    cfg = build_store({"kind": "ffn", "d_model": D, "d_ff": F})
    assert isinstance(cfg, FFNConfig) and cfg.activation == "swiglu"
    with pytest.raises(ValueError, match="dropout"):
        build_store({"kind": "ffn", "d_model": D, "d_ff": F, "dropout": 0.1})
    with pytest.raises(ValueError, match=r"\[B, T, 12\]"):
        cfg.build()(torch.randn(2, 3, 5))
