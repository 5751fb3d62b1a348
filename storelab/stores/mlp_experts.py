"""A dense MLP and routed experts side by side in one channel slot (Gemma 4's MoE block, Google 2026).

Gemma 4's 26B-A4B layers (transformers' ``Gemma4TextDecoderLayer`` with ``enable_moe_block``) keep the dense
feed-forward store of Gemma 3 and add a store of experts beside it, both reading the same stream x (the sum
before the channel sublayer), each through its own norms, their outputs summed:

    y = n_mlp_out(MLP(n_mlp_in(x))) + n_exp_out(sum_k w_k expert_{e_k}(n_exp_in(x)))

The router (Shazeer et al., arXiv 1701.06538) reads x through a weightless RMS norm, times a learned per-channel
``router_scale`` and D^-0.5; a softmax over the ``n_experts`` logits picks the top ``top_k``, whose weights are
renormalised to sum to 1 and then multiplied by a learned ``per_expert_scale`` of the expert chosen. Experts and
the MLP use the same gated unit (``activation``: GeGLU with tanh GELU in Gemma 4).

Because the experts read the stream itself (their norm is not the MLP's), the block hands this store x
unnormalised (``READS_STREAM``): the store owns the four norms, and the block keeps only the norm after the
sum (Gemma's sandwich ``post_feedforward_layernorm``).

Update rule: none while reading; training writes the MLP, the router and the experts.
Parameters (D = d_model, F = d_ff, E = n_experts, I = d_expert):
  stored = 3 D F (MLP) + 4 D (norms) + E D + D + E (router, its scale, per-expert scales) + 3 E I D (experts)
  active = the same with top_k experts in place of E (the router reads all E rows).
State per token: none (EmptyState). Weights are transformers' names: ``mlp.{gate,up,down}_proj``,
``router.{proj,scale,per_expert_scale}``, ``experts.{gate_up_proj [E, 2I, D], down_proj [E, D, I]}``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from storelab.ops.norm import RMSNorm, rms_norm
from storelab.ops.precision import at_least_fp32
from storelab.ops.routing import expert_load, grouped_swiglu
from storelab.state import EmptyState
from storelab.stores.base import CHANNEL, Card, Footprint, ParamCount, StoreConfig, check_input, emit, register
from storelab.stores.ffn import ACTIVATIONS, FFN, FFNConfig

__all__ = ["MLPExpertsConfig", "MLPExperts"]

GATED = tuple(k for k, a in ACTIVATIONS.items() if a.gated)


@register("mlp_experts")
@dataclass(kw_only=True)
class MLPExpertsConfig(StoreConfig):
    d_model: int
    d_ff: int                        # the dense MLP's width
    n_experts: int
    top_k: int
    d_expert: int
    activation: str = "geglu_tanh"   # the MLP's and the experts' gated unit
    norm_eps: float = 1e-6

    SLOTS, FAMILY, CARD_ORDER = (CHANNEL,), "experts", 25
    READS_STREAM = True              # the block hands x itself: the experts' norm is not the MLP's
    CARD = Card(
        name="MLP beside experts",
        written_by="training",
        holds="a dense feed-forward store plus experts judged by total parameters",
        reading_costs="the whole MLP and a few experts, for every token",
        forgets="only when later training overwrites them",
        source="Gemma 4 (Google, 2026: transformers' Gemma4TextDecoderLayer); arXiv 1701.06538 (experts)",
    )

    def __post_init__(self) -> None:
        self.check_positive("d_model", "d_ff", "n_experts", "d_expert", "norm_eps")
        self.check(isinstance(self.top_k, int) and 0 < self.top_k <= self.n_experts, "top_k",
                   f"must be in [1, n_experts = {self.n_experts}], got {self.top_k!r}")
        self.check(self.activation in GATED, "activation", f"must be a gated unit, one of {GATED}, "
                                                           f"got {self.activation!r}")

    def mlp(self) -> FFNConfig:
        return FFNConfig(d_model=self.d_model, d_ff=self.d_ff, activation=self.activation)

    def _counts(self, experts: int) -> int:
        D, E = self.d_model, self.n_experts
        return self.mlp().num_params().stored + 4 * D + E * D + D + E + 3 * experts * self.d_expert * D

    def num_params(self) -> ParamCount:
        return ParamCount(stored=self._counts(self.n_experts), active=self._counts(self.top_k))

    def experts_per_token(self) -> tuple[int, int, int]:
        return self.top_k, self.n_experts, 0

    def footprint(self, context: int, *, dtype: str = "bf16") -> Footprint:
        return Footprint(context=context, kept=0, read=0, state_bytes=0, read_flops=2 * self.num_params().active,
                         note=f"written in training: the MLP and {self.top_k} of {self.n_experts} experts per token")

    def build(self) -> "MLPExperts":
        return MLPExperts(self)


class Router(nn.Module):
    """Top-k of a softmax over a weightless-normed, rescaled x; the chosen weights renormalised, then scaled per
    expert (transformers' ``Gemma4TextRouter``)."""

    def __init__(self, cfg: MLPExpertsConfig):
        super().__init__()
        self.cfg = cfg
        self.proj = nn.Linear(cfg.d_model, cfg.n_experts, bias=False)
        self.scale = nn.Parameter(torch.ones(cfg.d_model))
        self.per_expert_scale = nn.Parameter(torch.ones(cfg.n_experts))

    def forward(self, x_ND: Tensor) -> tuple[Tensor, Tensor]:
        c = self.cfg
        h_ND = rms_norm(x_ND, eps=c.norm_eps) * self.scale * c.d_model ** -0.5
        probs_NE = torch.softmax(at_least_fp32(self.proj(h_ND)), dim=-1)
        top = torch.topk(probs_NE, c.top_k, dim=-1)
        weights_NK = top.values / top.values.sum(-1, keepdim=True)
        return weights_NK * self.per_expert_scale[top.indices], top.indices


class MLPExperts(nn.Module):
    def __init__(self, cfg: MLPExpertsConfig):
        super().__init__()
        self.cfg = cfg
        D, E, I = cfg.d_model, cfg.n_experts, cfg.d_expert
        self.mlp = FFN(cfg.mlp())
        self.norm_mlp_in, self.norm_mlp_out = RMSNorm(D, cfg.norm_eps), RMSNorm(D, cfg.norm_eps)
        self.norm_experts_in, self.norm_experts_out = RMSNorm(D, cfg.norm_eps), RMSNorm(D, cfg.norm_eps)
        self.router = Router(cfg)
        self.gate_up = nn.Parameter(torch.randn(E, 2 * I, D) * D ** -0.5)
        self.down = nn.Parameter(torch.randn(E, D, I) * I ** -0.5)
        self.unit = ACTIVATIONS[cfg.activation].unit(cfg.mlp())

    def forward(self, x_BTD: Tensor, state: EmptyState | None = None, *, token_ids: Tensor | None = None
                ) -> tuple[Tensor, EmptyState]:
        c = self.cfg
        check_input(x_BTD, c.d_model)
        B, T, D = x_BTD.shape
        y_BTD = self.norm_mlp_out(self.mlp(self.norm_mlp_in(x_BTD))[0])
        x_ND = x_BTD.reshape(-1, D)
        weights_NK, experts_NK = self.router(x_ND)
        emit(self, "load", lambda: expert_load(experts_NK, c.n_experts).detach())
        e_ND = grouped_swiglu(self.norm_experts_in(x_ND), experts_NK, weights_NK, self.gate_up, self.down,
                              act=self.unit)
        seen = 0 if state is None else state.seen
        return y_BTD + self.norm_experts_out(e_ND).view(B, T, D), EmptyState(seen=seen + T)
