"""Mixture of experts: dispatch vs the dense reference, routing by hand, loads, latent
experts, exact parameter counts, validation. (Oracles: tests/test_moe_oracle.py.)"""

import pytest
import torch

from storelab.ops.norm import rms_norm
from storelab.ops.routing import dense_moe_reference, expert_load, grouped_swiglu, route_fixed, route_topk
from storelab.state import EmptyState
from storelab.stores import build_store, observe
from storelab.stores.moe import MoEConfig
from tests.helpers import assert_close

D = 16


def _cfg(**kw):
    base = dict(d_model=D, n_experts=6, top_k=2, d_expert=8)
    return MoEConfig(**{**base, **kw})


@pytest.mark.parametrize("limit", [None, 0.3])
def test_grouped_dispatch_matches_dense_reference(limit):
    torch.manual_seed(0)
    N, E, K, I = 11, 5, 3, 7
    x = torch.randn(N, D, dtype=torch.float64)
    experts = torch.randint(0, E, (N, K))
    experts[0] = torch.tensor([2, 2, 4])                         # a repeated expert in one row
    w = torch.rand(N, K, dtype=torch.float64)
    gu, dn = torch.randn(E, 2 * I, D, dtype=torch.float64), torch.randn(E, D, I, dtype=torch.float64)
    assert_close(grouped_swiglu(x, experts, w, gu, dn, limit=limit),
                 dense_moe_reference(x, experts, w, gu, dn, limit=limit), 1e-10, "dispatch")


def test_unchosen_experts_are_never_computed():
    # NaN weights in an expert that no token is sent to must not reach the output
    torch.manual_seed(1)
    x = torch.randn(9, D)
    experts = torch.randint(0, 3, (9, 2))                        # experts 3, 4 unused
    gu, dn = torch.randn(5, 8, D), torch.randn(5, D, 4)
    gu[3:] = float("nan")
    y = grouped_swiglu(x, experts, torch.rand(9, 2), gu, dn)
    assert torch.isfinite(y).all()
    assert not torch.isfinite(dense_moe_reference(x, experts, torch.rand(9, 2), gu, dn)).all()


def test_route_topk_by_hand_and_bias_steers_choice_only():
    logits = torch.tensor([[2.0, 0.0, 1.0, -1.0]])
    w, e = route_topk(logits, top_k=2, score="softmax", normalize=False)
    p = torch.softmax(logits, -1)
    assert sorted(e[0].tolist()) == [0, 2]
    assert_close(w.sort(-1).values, p[:, [2, 0]], 1e-7, "softmax weights")
    w, e = route_topk(logits, top_k=2, score="sigmoid", normalize=True, scaling=2.5)
    s = torch.sigmoid(logits[0, [0, 2]])
    assert_close(w[0].sort().values, (s / s.sum() * 2.5).sort().values, 1e-6, "sigmoid normalised scaled")
    bias = torch.tensor([0.0, 0.0, 0.0, 10.0])                   # expert 3 forced in by the bias ...
    w, e = route_topk(logits, top_k=2, score="sigmoid", bias_E=bias, normalize=False)
    assert sorted(e[0].tolist()) == [0, 3]
    got = dict(zip(e[0].tolist(), w[0].tolist()))
    assert got[3] == pytest.approx(torch.sigmoid(torch.tensor(-1.0)).item())   # ... at its unbiased score
    w = route_fixed(logits, torch.tensor([[1, 3]]), score="sqrtsoftplus", normalize=False)
    assert_close(w, torch.nn.functional.softplus(logits[:, [1, 3]]).sqrt(), 1e-7, "fixed experts")


@pytest.mark.parametrize("kw", [dict(), dict(router="sigmoid", router_bias=True, routed_scaling=2.5),
                                dict(n_shared=2, d_shared=5, shared_gate=True), dict(latent_dim=6, n_shared=1)])
def test_load_statistics_sum_to_tokens_times_topk(kw):
    torch.manual_seed(2)
    cfg = _cfg(**kw)
    m = cfg.build()
    B, T = 3, 5
    with observe() as seen:
        y, st = m(torch.randn(B, T, D))
    assert y.shape == (B, T, D) and isinstance(st, EmptyState) and st.seen == T
    assert seen.last(m, "load").shape == (cfg.n_experts,)
    assert int(seen.last(m, "load").sum()) == B * T * cfg.top_k


def test_moe_matches_a_per_token_loop():
    torch.manual_seed(3)
    cfg = _cfg(router="sigmoid", router_bias=True, routed_scaling=1.7, n_shared=2, d_shared=3, shared_gate=True)
    m = cfg.build().double()
    m.choice_bias.copy_(torch.randn(cfg.n_experts))
    x = torch.randn(2, 4, D, dtype=torch.float64)
    y, _ = m(x)
    silu = torch.nn.functional.silu
    for b in range(2):
        for t in range(4):
            xt = x[b, t]
            s = torch.sigmoid(m.router.weight @ xt)
            chosen = torch.topk(s + m.choice_bias, cfg.top_k).indices
            w = s[chosen] / s[chosen].sum() * 1.7
            out = torch.zeros(D, dtype=torch.float64)
            for wi, e in zip(w, chosen):
                g, u = (m.gate_up[e] @ xt).chunk(2)
                out += wi * (m.down[e] @ (silu(g) * u))
            sh = m.shared_down_proj.weight @ (silu(m.shared_gate_proj.weight @ xt) * (m.shared_up_proj.weight @ xt))
            out += torch.sigmoid(m.shared_gate.weight @ xt) * sh
            assert_close(y[b, t], out, 1e-12, f"token {b},{t}")


def test_latent_experts_shapes_and_hand_check():
    torch.manual_seed(4)
    cfg = _cfg(n_experts=4, top_k=2, d_expert=5, latent_dim=6, n_shared=1, d_shared=7, router="sigmoid")
    m = cfg.build().double()
    assert m.gate_up.shape == (4, 10, 6) and m.down.shape == (4, 6, 5)
    assert m.latent_down.weight.shape == (6, D) and m.latent_up.weight.shape == (D, 6)
    assert m.shared_gate_proj.weight.shape == (7, D)             # shared experts at full width
    with torch.no_grad():
        m.latent_norm.weight.copy_(torch.rand(6) + 0.5)
    x = torch.randn(1, 3, D, dtype=torch.float64)
    y, _ = m(x)
    silu = torch.nn.functional.silu
    for t in range(3):
        xt = x[0, t]
        s = torch.sigmoid(m.router.weight @ xt)                  # router reads the full width
        chosen = torch.topk(s, 2).indices
        w = s[chosen] / s[chosen].sum()
        z = rms_norm(m.latent_down.weight @ xt, m.latent_norm.weight, cfg.norm_eps)
        acc = torch.zeros(6, dtype=torch.float64)
        for wi, e in zip(w, chosen):
            g, u = (m.gate_up[e] @ z).chunk(2)
            acc += wi * (m.down[e] @ (silu(g) * u))
        sh = m.shared_down_proj.weight @ (silu(m.shared_gate_proj.weight @ xt) * (m.shared_up_proj.weight @ xt))
        assert_close(y[0, t], m.latent_up.weight @ acc + sh, 1e-12, f"latent token {t}")


def test_hash_routing_uses_the_table_and_needs_token_ids():
    torch.manual_seed(5)
    cfg = _cfg(routing="hash", vocab_size=20, router="sqrtsoftplus")
    m = cfg.build()
    tab = m.table
    assert tab.shape == (20, 2) and all(len(set(r)) == 2 for r in tab.tolist())
    ids = torch.randint(0, 20, (2, 6))
    x = torch.randn(2, 6, D)
    with observe() as seen:
        y, _ = m(x, token_ids=ids)
    w, e = m.route(x.reshape(-1, D), ids.reshape(-1))
    assert torch.equal(e, tab[ids.reshape(-1)])
    assert torch.equal(seen.last(m, "load"), expert_load(tab[ids.reshape(-1)], 6))
    with pytest.raises(ValueError, match="token_ids"):
        m(x)
    with pytest.raises(ValueError, match="token_ids"):
        m(x, token_ids=ids[:, :3])
    with pytest.raises(ValueError, match="token_ids"):
        m(x, token_ids=ids + 20)


def test_chunked_equals_full():
    torch.manual_seed(6)
    m = _cfg(routing="hash", vocab_size=30, n_shared=1).build()
    x, ids = torch.randn(1, 7, D), torch.randint(0, 30, (1, 7))
    full, _ = m(x, token_ids=ids)
    st, outs = None, []
    for a, b in [(0, 1), (1, 4), (4, 7)]:
        y, st = m(x[:, a:b], st, token_ids=ids[:, a:b])
        outs.append(y)
    assert_close(torch.cat(outs, 1), full, 1e-6, "chunked")


@pytest.mark.parametrize("kw", [dict(), dict(router_bias=True), dict(n_shared=2, shared_gate=True),
                                dict(latent_dim=5, n_shared=1, d_shared=9), dict(routing="hash", vocab_size=40)])
def test_num_params_are_exact(kw):
    cfg = _cfg(**kw)
    m = cfg.build()
    stored = sum(p.numel() for p in m.parameters()) + (cfg.n_experts if cfg.router_bias else 0)
    assert cfg.num_params().stored == stored
    per_expert = 3 * cfg.d_expert * cfg.expert_width
    assert cfg.num_params().active == stored - (cfg.n_experts - cfg.top_k) * per_expert
    fp = cfg.footprint(10_000)
    assert (fp.kept, fp.read, fp.state_bytes) == (0, 0, 0)


def test_full_scale_counts_from_config_alone():
    # MiMo-V2.6-Pro: 384 experts, top 8, inter 2048, d 6144, sigmoid router with bias, no shared expert
    mimo = MoEConfig(d_model=6144, n_experts=384, top_k=8, d_expert=2048, router="sigmoid", router_bias=True)
    assert mimo.num_params().stored == 384 * 6144 + 384 + 384 * 3 * 2048 * 6144 == 14_497_874_304
    assert mimo.num_params().active == 384 * 6144 + 384 + 8 * 3 * 2048 * 6144 == 304_349_568
    # Kimi K3 Stable LatentMoE: 896 experts at latent 3584, top 16, 2 shared of 3072 at full width
    k3 = MoEConfig(d_model=7168, n_experts=896, top_k=16, d_expert=3072, latent_dim=3584, n_shared=2, d_shared=3072,
                   router="sigmoid")
    dense = 896 * 7168 + 2 * 7168 * 3584 + 3584 + 3 * 7168 * 2 * 3072
    assert k3.num_params().stored == dense + 896 * 3 * 3072 * 3584
    assert k3.num_params().active == dense + 16 * 3 * 3072 * 3584


@pytest.mark.parametrize("bad,field", [
    (dict(top_k=7), "top_k"), (dict(top_k=0), "top_k"), (dict(top_k=-1), "top_k"),
    (dict(router="relu"), "router"), (dict(routing="random"), "routing"),
    (dict(routing="hash"), "vocab_size"), (dict(routing="hash", vocab_size=0), "vocab_size"),
    (dict(n_experts=0), "n_experts"), (dict(d_expert=0), "d_expert"), (dict(n_shared=-1), "n_shared"),
    (dict(shared_gate=True), "shared_gate"), (dict(latent_dim=0), "latent_dim"),
    (dict(routed_scaling=0.0), "routed_scaling"), (dict(swiglu_limit=-1.0), "swiglu_limit"),
    (dict(n_shared=1, d_shared=0), "d_shared"),
])
def test_bad_config_names_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        _cfg(**bad)


def test_registry_round_trip():
    cfg = build_store({"kind": "moe", "d_model": D, "n_experts": 4, "top_k": 1, "d_expert": 8, "router": "sigmoid"})
    assert isinstance(cfg, MoEConfig) and build_store(cfg.to_dict()) == cfg
    with pytest.raises(ValueError, match="capacity_factor"):
        build_store({**cfg.to_dict(), "capacity_factor": 1.25})


def test_gradients_reach_router_experts_and_latent():
    torch.manual_seed(7)
    m = _cfg(router="sigmoid", latent_dim=6, n_shared=1, shared_gate=True).build()
    y, _ = m(torch.randn(2, 5, D))
    y.square().sum().backward()
    for name in ("router.weight", "gate_up", "down", "latent_down.weight", "latent_up.weight", "shared_gate.weight"):
        g = dict(m.named_parameters())[name].grad
        assert g is not None and g.abs().sum() > 0, name


def test_normalised_softmax_routing_is_the_softmax_of_the_chosen_logits():
    # route_topk's shortcut (no [N, E] softmax) against the plain form: softmax, choose, renormalise
    logits = torch.randn(50, 8, dtype=torch.float64, requires_grad=True)
    w, e = route_topk(logits, top_k=3, score="softmax", normalize=True, scaling=2.5)
    p = torch.softmax(logits, -1)
    e_ref = torch.topk(p, 3, dim=-1).indices
    w_ref = p.gather(1, e_ref) / p.gather(1, e_ref).sum(-1, keepdim=True) * 2.5
    assert torch.equal(e, e_ref)
    torch.testing.assert_close(w, w_ref, rtol=0, atol=1e-15)
    dw = torch.randn(50, 3, dtype=torch.float64)
    g, g_ref = (torch.autograd.grad((x * dw).sum(), logits)[0] for x in (w, w_ref))
    torch.testing.assert_close(g, g_ref, rtol=0, atol=1e-14)
