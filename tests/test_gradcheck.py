"""float64 ``torch.autograd.gradcheck`` of every store kind at tiny sizes.

Each kind of the registry (``storelab.stores.REGISTRY``) has a case here, and a test checks that
the cases are exactly the registered kinds, so a new kind cannot be skipped silently. A case
checks the store's output against its input and every parameter (``torch.func.functional_call``;
gradcheck's fast mode, a random projection of the Jacobian, so the sizes stay tiny but every
tensor takes part), and then each auxiliary loss it hands to training (``training_signals``)
against the parameters that loss trains. Depth stores are a stack of four sublayers and the head.

What gradcheck cannot judge, and what is checked instead:

* a hard top-k (the DSA / hierarchical / MSA / CSA indexers, the experts' router) is piecewise
  constant in its scores: the cases read every visible entry (k >= the context), so the output is
  the differentiable dense read, and the indexer, which the output then does not depend on, is
  checked through its imitation loss (the KL is smooth in the indexer's parameters; the target
  is detached by design, so x and the main attention's parameters are held fixed there); the
  parameters the imitation trains are exactly those the output leaves without a gradient. The
  router's choice is held (no near-ties at these inputs); its weights and the balancing loss are checked;
* quantised entries (fp8 / fp4 cache formats) round: their gradient is the straight-through
  estimator's, checked to be the identity through the entries (and the output equal to inference).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import pytest
import torch
from torch import nn
from torch.func import functional_call

import storelab.stores as stores
from storelab.ops.quant import fake_quantize_entries
from storelab.stores.base import training_signals

D, B, T, VOCAB = 16, 2, 6, 32
MLA_DIMS = dict(n_heads=2, q_lora_rank=8, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=4)
CSA_DIMS = dict(n_heads=2, head_dim=8, rope_dim=4, q_lora=8, o_groups=1, o_lora=8, window=3)
RECURRENT = dict(n_heads=2, head_k_dim=4, chunk_size=4)  # T = 6: across a chunk boundary


class DepthStack(nn.Module):
    """Four sublayers of a depth store around fixed maps, then its head: h -> head(ds)."""

    def __init__(self, cfg, n_sub: int = 4):
        super().__init__()
        self.mixers = nn.ModuleList(cfg.build(sublayer=s, n_sublayers=n_sub) for s in range(n_sub))
        self.head = cfg.build_head(n_sublayers=n_sub)
        self.register_buffer("maps", torch.randn(n_sub, D, D) / D ** 0.5)

    def forward(self, h_BTD: torch.Tensor) -> torch.Tensor:
        ds = self.mixers[0].init(h_BTD)
        for m, w in zip(self.mixers, self.maps):
            ds = m.write(ds, torch.tanh(m.read(ds) @ w))
        return self.head(ds)


@dataclass
class Case:
    cfg: object
    call: Callable = lambda m, x: m(x)[0]
    build: Callable = lambda cfg: cfg.build()


def _ids() -> torch.Tensor:
    return torch.randint(1, VOCAB, (B, T), generator=torch.Generator().manual_seed(3))


def cases() -> dict[str, Case]:
    R = stores.REGISTRY
    depth = dict(build=DepthStack, call=lambda m, x: m(x))
    return {
        "attention": Case(R["attention"](d_model=D, n_heads=2, n_kv_heads=1, head_dim=8, sink=True)),
        "window": Case(R["window"](d_model=D, n_heads=2, n_kv_heads=1, head_dim=8, window=3)),
        "chunked": Case(R["chunked"](d_model=D, n_heads=2, n_kv_heads=1, head_dim=8, chunk=4, rope_interleaved=True,
                                     qk_l2_norm=True, attn_temperature_tuning=True, floor_scale=2)),  # T = 6: two chunks
        "short_conv": Case(R["short_conv"](d_model=D, conv_kernel=3, bias=True)),
        "msa": Case(R["msa"](d_model=D, n_heads=2, n_kv_heads=1, head_dim=8, block_size=2, top_blocks=3,
                             index_head_dim=8)),                        # 3 blocks of 2: all read
        "mla": Case(R["mla"](d_model=D, **MLA_DIMS)),
        "dsa": Case(R["dsa"](d_model=D, **MLA_DIMS, index_n_heads=2, index_head_dim=8, index_topk=T)),
        "hierarchical": Case(R["hierarchical"](d_model=D, **MLA_DIMS, index_n_heads=2, index_head_dim=8, topk=T,
                                               pool_size=8, pool_block=2)),
        "csa": Case(R["csa"](d_model=D, **CSA_DIMS, pool=4, stride=2, index_heads=2, index_head_dim=8,
                             index_topk=T)),                            # every complete entry read
        "hca": Case(R["hca"](d_model=D, **CSA_DIMS, pool=2)),
        "v4_window": Case(R["v4_window"](d_model=D, **CSA_DIMS)),  # window 3 < T: older tokens drop out
        "linear_attention": Case(R["linear_attention"](d_model=D, **RECURRENT)),
        "lightning": Case(R["lightning"](d_model=D, n_heads=2, head_dim=4, chunk_size=4)),  # T = 6: two chunks
        "deltanet": Case(R["deltanet"](d_model=D, **RECURRENT)),
        "gated_deltanet": Case(R["gated_deltanet"](d_model=D, **RECURRENT)),
        "kda": Case(R["kda"](d_model=D, **RECURRENT, gate_rank=4)),
        "gated_deltaproduct": Case(R["gated_deltaproduct"](d_model=D, **RECURRENT)),
        "mamba2": Case(R["mamba2"](d_model=D, n_heads=4, head_dim=2, d_state=4, n_groups=2, chunk_size=4)),
        "mamba": Case(R["mamba"](d_model=D, d_inner=8, d_state=3, dt_rank=2, bcdt_norm="weighted", chunk_size=4)),
        "rglru": Case(R["rglru"](d_model=D, lru_width=8, n_heads=2, chunk_size=4)),
        "ffn": Case(R["ffn"](d_model=D, d_ff=24)),
        "moe": Case(R["moe"](d_model=D, n_experts=4, top_k=2, d_expert=8, router="sigmoid", router_bias=True,
                             n_shared=1, d_shared=8, latent_dim=8)),
        "mlp_experts": Case(R["mlp_experts"](d_model=D, d_ff=24, n_experts=4, top_k=2, d_expert=8)),
        "engram": Case(R["engram"](d_model=D, vocab_size=VOCAB, orders=(2, 3), heads_per_order=2, rows=11,
                                   head_dim=4, conv_kernel=2),
                       call=lambda m, x: m(x, token_ids=_ids())[0]),
        "residual": Case(R["residual"](d_model=D), **depth),
        "mhc": Case(R["mhc"](d_model=D, n_streams=2, sinkhorn_iters=5), **depth),
        "attnres": Case(R["attnres"](d_model=D, group_size=1), **depth),
        "gated_residual": Case(R["gated_residual"](d_model=D), **depth),
        "hyper_connection": Case(R["hyper_connection"](d_model=D, n_streams=2), **depth),
    }


def test_every_registered_kind_has_a_case():
    assert set(cases()) == set(stores.REGISTRY), "add a gradcheck case for each new store kind"


def _module(case: Case) -> nn.Module:
    torch.manual_seed(0)
    m = case.build(case.cfg).double()
    for name, p in m.named_parameters():  # move the zero / one initialisations, so every path counts
        with torch.no_grad():
            p.add_(0.1 * torch.randn_like(p))
    return m


def _gradcheck(fn, inputs) -> None:
    assert torch.autograd.gradcheck(fn, tuple(inputs), eps=1e-6, atol=1e-5, rtol=1e-3, fast_mode=True)


@pytest.mark.parametrize("kind", sorted(cases()))
def test_store_output_passes_gradcheck(kind):
    case = cases()[kind]
    m = _module(case)
    names = [n for n, _ in m.named_parameters()]
    x = torch.randn(B, T, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1)).requires_grad_()
    params = [p.detach().clone().requires_grad_() for p in m.parameters()]

    def fn(x, *ps):
        return case.call(lambda *a, **k: functional_call(m, dict(zip(names, ps)), a, k), x)

    _gradcheck(fn, [x, *params])


def _signals(m: nn.Module, case: Case, x: torch.Tensor):
    with training_signals() as sig:
        case.call(m, x)
    return sig


@pytest.mark.parametrize("kind", sorted(k for k in cases() if _signals(_module(cases()[k]), cases()[k],
                                                                        torch.randn(B, T, D, dtype=torch.float64)
                                                                        ).losses))
def test_auxiliary_losses_pass_gradcheck(kind):
    """Each auxiliary loss against the parameters it trains (x and the others held)."""
    case = cases()[kind]
    m = _module(case)
    x = torch.randn(B, T, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    for name in _signals(m, case, x).losses:
        m.zero_grad(set_to_none=True)
        _signals(m, case, x).mean(name).backward()
        trained = [n for n, p in m.named_parameters() if p.grad is not None]
        assert trained, f"{kind}: the {name!r} loss trains nothing"
        if name == "indexer":  # the imitation trains exactly what the (top-k) output does not reach
            m.zero_grad(set_to_none=True)
            case.call(m, x).sum().backward()
            from_output = {n for n, p in m.named_parameters() if p.grad is not None}
            assert from_output.isdisjoint(trained) and from_output | set(trained) == {n for n, _ in
                                                                                        m.named_parameters()}
        values = dict(m.named_parameters())

        def fn(*ps, name=name, trained=trained):
            with training_signals() as sig:
                case.call(lambda *a, **k: functional_call(m, {**values, **dict(zip(trained, ps))}, a, k), x)
            return sig.mean(name)

        _gradcheck(fn, [values[n].detach().clone().requires_grad_() for n in trained])


@pytest.mark.parametrize("fmt", ["fp8", "fp4"])
def test_quantised_entries_pass_the_gradient_straight_through(fmt):
    x = torch.randn(3, 5, 16, dtype=torch.float64, requires_grad=True)
    w = torch.randn(3, 5, 16, dtype=torch.float64)
    q = fake_quantize_entries(x, rope_dim=4, fmt=fmt, block=4)
    (g,) = torch.autograd.grad((q * w).sum(), x)
    assert torch.equal(g, w)                               # identity through the rounding
    assert 0 < (q - x).abs().max() < x.abs().max() / 3     # and the values are rounded
    m = _module(Case(dataclasses.replace(cases()["csa"].cfg, cache_format=fmt, quant_block=4))).float()
    x = torch.randn(B, 9, D, generator=torch.Generator().manual_seed(1), requires_grad=True)
    y_train, _ = m(x)                                      # the training form of the coded cache
    with torch.no_grad():
        y_infer, _ = m(x)                                  # the coded rows themselves
    assert torch.equal(y_train, y_infer)
    y_train.square().sum().backward()
    assert x.grad.abs().sum() > 0 and m.kv_proj.weight.grad.abs().sum() > 0 and m.pooler.kv.weight.grad.any()
