"""Plain (non-gated) experts, Nemotron-H's ReLU^2 units: the grouped dispatch equals the dense reference in value
and gradient, the store counts what it builds, and a latent projection may go without its norm."""

import torch

from storelab.ops.routing import dense_moe_reference, grouped_swiglu
from storelab.stores.ffn import ACTIVATIONS
from storelab.stores.moe import MoEConfig


def test_grouped_equals_dense_plain_units():
    g = torch.Generator().manual_seed(0)
    N, D, E, I, K = 13, 8, 5, 6, 2
    x = torch.randn(N, D, generator=g, dtype=torch.float64, requires_grad=True)
    up = torch.randn(E, I, D, generator=g, dtype=torch.float64, requires_grad=True)
    down = torch.randn(E, D, I, generator=g, dtype=torch.float64, requires_grad=True)
    experts = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(N)])
    w = torch.rand(N, K, generator=g, dtype=torch.float64)
    act = ACTIVATIONS["relu2"].unit(MoEConfig(d_model=D, n_experts=E, top_k=K, d_expert=I, activation="relu2"))
    a = grouped_swiglu(x, experts, w, up, down, act=act, gated=False)
    b = dense_moe_reference(x, experts, w, up, down, act=act, gated=False)
    assert torch.allclose(a, b, atol=1e-12)
    ga = torch.autograd.grad(a.square().sum(), (x, up, down))
    gb = torch.autograd.grad(b.square().sum(), (x, up, down))
    for p, q in zip(ga, gb):
        assert torch.allclose(p, q, atol=1e-10)
    # by hand for one token: sum_k w_k down_e relu(up_e x)^2
    n = 3
    want = sum(w[n, k] * down[e] @ torch.relu(up[e] @ x[n]).square() for k, e in enumerate(experts[n].tolist()))
    assert torch.allclose(a[n], want, atol=1e-12)


def test_plain_store_counts_and_runs():
    for latent in (None, 4):
        cfg = MoEConfig(d_model=8, n_experts=4, top_k=2, d_expert=6, activation="relu2", router="sigmoid",
                        router_bias=True, n_shared=1, d_shared=5, latent_dim=latent, latent_norm=False)
        m = cfg.build()
        assert sum(p.numel() for p in m.parameters()) + m.choice_bias.numel() == cfg.num_params().stored
        assert not hasattr(m, "shared_gate_proj")
        y, _ = m(torch.randn(2, 3, 8))
        assert y.shape == (2, 3, 8) and torch.isfinite(y).all()
