"""The clamped SwiGLU (gpt-oss, MiniMax-M3) as an activation option of the ffn and moe configs,
and the experts' load handed to an ``observe`` block, never kept on the store."""

import pytest
import torch

import storelab.stores.moe as moe_module
from storelab.ops.routing import clamped_swiglu, dense_moe_reference, grouped_swiglu, swiglu
from storelab.stores import observe
from storelab.stores.ffn import FFNConfig
from storelab.stores.moe import MoEConfig
from tests.helpers import assert_close

D = 12
UNIT = dict(activation="clamped_swiglu", swiglu_alpha=1.702, swiglu_limit=0.4, swiglu_up_shift=1.0)


def _plain(gate, up, alpha=1.702, limit=0.4, shift=1.0):
    g = torch.minimum(gate, torch.full_like(gate, limit))
    u = torch.maximum(torch.minimum(up, torch.full_like(up, limit)), torch.full_like(up, -limit))
    return g / (1 + torch.exp(-alpha * g)) * (u + shift)


def test_clamped_swiglu_op_by_hand_and_swiglu_as_its_special_case():
    torch.manual_seed(0)
    gate, up = torch.randn(5, 7, dtype=torch.float64) * 2, torch.randn(5, 7, dtype=torch.float64) * 2
    assert_close(clamped_swiglu(gate, up, alpha=1.702, limit=0.4, up_shift=1.0), _plain(gate, up), 1e-12, "op")
    assert_close(clamped_swiglu(gate, up, alpha=1.0, limit=0.3), swiglu(gate, up, limit=0.3), 1e-12, "alpha 1")
    assert_close(clamped_swiglu(gate, up, alpha=1.0), swiglu(gate, up), 1e-12, "no limit")


@pytest.mark.parametrize("bias", [False, True])
def test_ffn_clamped_swiglu_matches_the_formula(bias):
    torch.manual_seed(1)
    m = FFNConfig(d_model=D, d_ff=20, bias=bias, **UNIT).build().double()
    x = torch.randn(2, 5, D, dtype=torch.float64)
    g, u = m.gate_proj(x), m.up_proj(x)
    assert_close(m(x)[0], m.down_proj(_plain(g, u)), 1e-12, "ffn clamped")
    cfg = m.cfg
    assert cfg.gated and cfg.num_params().stored == sum(p.numel() for p in m.parameters())


def test_ffn_swiglu_limit_clips_the_plain_unit():
    torch.manual_seed(2)
    m = FFNConfig(d_model=D, d_ff=20, swiglu_limit=0.2).build().double()
    x = torch.randn(1, 4, D, dtype=torch.float64)
    assert_close(m(x)[0], m.down_proj(swiglu(m.gate_proj(x), m.up_proj(x), limit=0.2)), 1e-12, "ffn clip")


def test_moe_clamped_swiglu_matches_a_per_token_loop():
    torch.manual_seed(3)
    cfg = MoEConfig(d_model=D, n_experts=5, top_k=2, d_expert=6, router="sigmoid", router_bias=True, n_shared=1,
                    d_shared=4, **UNIT)
    m = cfg.build().double()
    with torch.no_grad():
        m.choice_bias.copy_(torch.randn(5))
    x = torch.randn(1, 6, D, dtype=torch.float64)
    y, _ = m(x)
    w_NK, e_NK = m.route(x[0], None)
    for t in range(6):
        xt, acc = x[0, t], torch.zeros(D, dtype=torch.float64)
        for wi, e in zip(w_NK[t], e_NK[t]):
            g, u = (m.gate_up[e] @ xt).chunk(2)
            acc += wi * (m.down[e] @ _plain(g, u))
        acc += m.shared_down_proj.weight @ _plain(m.shared_gate_proj.weight @ xt, m.shared_up_proj.weight @ xt)
        assert_close(y[0, t], acc, 1e-12, f"token {t}")
    act = m.act.unit(cfg)
    assert_close(grouped_swiglu(x[0], e_NK, w_NK, m.gate_up, m.down, act=act),
                 dense_moe_reference(x[0], e_NK, w_NK, m.gate_up, m.down, act=act), 1e-12, "dispatch")


@pytest.mark.parametrize("make,bad,field", [
    (FFNConfig, dict(activation="clamped_swiglu", swiglu_alpha=0.0), "swiglu_alpha"),
    (FFNConfig, dict(swiglu_alpha=2.0), "swiglu_alpha"),          # swiglu has no alpha
    (FFNConfig, dict(swiglu_up_shift=0.0), "swiglu_up_shift"),
    (FFNConfig, dict(activation="relu", swiglu_limit=1.0), "swiglu_limit"),
    (FFNConfig, dict(activation="clamped_swiglu", swiglu_limit=-1.0), "swiglu_limit"),
    (FFNConfig, dict(activation="geglu"), "activation"),
    (MoEConfig, dict(activation="power"), "activation"),          # plain experts have no exponent field
    (MoEConfig, dict(swiglu_alpha=2.0), "swiglu_alpha"),
    (MoEConfig, dict(activation="clamped_swiglu", swiglu_alpha=-1.0), "swiglu_alpha"),
])
def test_bad_activation_fields_are_named(make, bad, field):
    base = dict(d_model=D, d_ff=8) if make is FFNConfig else dict(d_model=D, n_experts=4, top_k=2, d_expert=8)
    with pytest.raises(ValueError, match=field):
        make(**base, **bad)


def test_load_is_emitted_only_inside_observe_and_never_kept(monkeypatch):
    torch.manual_seed(4)
    m = MoEConfig(d_model=D, n_experts=4, top_k=2, d_expert=8).build()
    x = torch.randn(2, 3, D)

    def boom(*a, **k):
        raise AssertionError("the load was computed outside an observe block")

    monkeypatch.setattr(moe_module, "expert_load", boom)
    m(x)                                                     # nobody asked: nothing computed
    monkeypatch.undo()
    assert not any(k.startswith("last") for k in vars(m))   # nothing stashed on the store
    with observe() as first:
        m(x)
        m(x[:, :1])
    with observe(m) as second:
        m(x[:1])
    assert [int(v.sum()) for v in first.all(m, "load")] == [12, 4]
    assert int(second.last(m, "load").sum()) == 6 and len(second.all(m, "load")) == 1
    other = MoEConfig(d_model=D, n_experts=4, top_k=1, d_expert=8).build()
    with observe(other) as only_other:
        m(x)
    with pytest.raises(ValueError, match="load"):
        only_other.last(m, "load")
