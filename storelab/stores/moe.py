"""Mixture of experts: one large feed-forward store split into many, a few read per token.

The router performs a coarse key match before recall (essay section 2, "Experts and
lookup tables"; Shazeer et al., arXiv 1701.06538): it removes most distractors before
any expert sees the query. Variants of the seven models:

* ``router``: "softmax" (Qwen3-Next: softmax over all experts, then top-k), "sigmoid"
  (DeepSeek-V3, arXiv 2412.19437; MiMo, Kimi, GLM) or "sqrtsoftplus" (DeepSeek-V4);
  ``router_bias`` adds the auxiliary-loss-free balancing bias to the scores for the
  choice only; ``router_logit_bias`` is a learned bias of the router's linear layer, added to
  the logits before the scores, so it weights as well as chooses (gpt-oss, arXiv 2508.10925);
  ``norm_topk_prob`` renormalises the chosen weights; ``routed_scaling``
  multiplies them; ``n_group`` / ``topk_group`` limit the choice to the best groups of experts
  (DeepSeek-V2 / V3's node-limited routing).
* ``routing="hash"`` (DeepSeek-V4's first layers, arXiv 2606.19348): the experts are a fixed table of the
  token id, ``table[vocab_size, top_k]``; the learned router still weights them.
  Needs ``token_ids`` in forward.
* Balancing, the family's (taken from the config): with ``router_bias`` DeepSeek-V3's
  auxiliary-loss-free update of the choice bias (a buffer, not a gradient parameter; rate
  ``bias_update_rate``, made by the training loop after its optimiser step) plus its
  complementary sequence-wise loss; without, the batch-wise auxiliary loss of Switch / Qwen;
  ``aux_loss_coef`` weights the loss (None: 1e-4 with the bias, DeepSeek-V3's alpha; 1e-3
  without, Qwen3-Next's ``router_aux_loss_coef``). Hash routing has no choice to balance.
  Under ``training_signals()`` each call adds ``"balance"`` (already weighted) and the bias update.
* ``n_shared`` shared experts of width ``d_shared`` read by every token, fused into one
  SwiGLU of width n_shared * d_shared (the same function); ``shared_gate`` multiplies
  them by sigmoid(w . x) (Qwen3-Next).
* ``latent_dim`` (Kimi K3's Stable LatentMoE, arXiv 2607.24653; NVIDIA's Nemotron-H LatentMoE):
  routed experts compute at a narrower width: z = RMSNorm(W_down x) (no norm with ``latent_norm``
  false, as Nemotron 3 Super), y = W_up sum_k w_k expert_k(z); the router and the shared experts
  stay at full width.
* ``activation`` may also be a plain unit (``relu2``: Nemotron-H's experts, up and down only).
* ``scale_input`` (Llama 4, transformers' ``Llama4TextMoe``): the routing weight multiplies the expert's
  input instead of its output, y = sum_k expert_k(w_k x); with a SwiGLU expert that is another function
  (silu is not linear). Each (token, expert) slot then runs as a token of its own with weight 1.
* ``activation``: the unit of the routed and shared experts, one of the gated activations of
  ``storelab.stores.ffn`` taken once at construction: "swiglu" (silu(gate) * up) or
  "clamped_swiglu" (gpt-oss's g sigmoid(alpha g) (u + up_shift), MiniMax-M3; ``swiglu_alpha``,
  ``swiglu_up_shift``). ``swiglu_limit`` clips both halves first (gate <= limit, |up| <= limit;
  DeepSeek-V4, MiniMax-M3).
* ``expert_biases``: each routed expert has biases on its gate/up and down projections
  (gpt-oss): expert_e(x) = W_down act(W_gate_up x + b_gate_up) + b_down, the whole weighted by w.

Experts are 3-D tensors ``gate_up [E, 2I, W]`` and ``down [E, W, I]`` (W = latent_dim or
d_model), the layout of transformers, so checkpoints copy in. Dispatch sorts the
(token, expert) slots by expert and runs each expert on its own tokens only.
Each call emits ``"load"``: the slots per expert, [E], summing to tokens x top_k (read it with
``with observe() as seen: ...; seen.last(module, "load")``; computed only inside such a block).

Update rule: none while reading; training writes the experts and the router.
Parameters (W = latent_dim or D, I = d_expert, S = n_shared * d_shared):
  stored = E D (router) [+ E choice bias] [+ E logit bias] + 3 E I W [+ E (2I + W) expert biases]
           [+ 2 D W + W latent] + 3 D S [+ D gate]
  active = the same with top_k experts in place of E (the router reads all E rows).
State per token: none (EmptyState).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from storelab.ops.norm import RMSNorm
from storelab.ops.routing import (ROUTER_SCORES, balance_loss, bias_step, expert_load, grouped_swiglu, route_fixed,
                                  route_topk)
from storelab.state import EmptyState
from storelab.stores.base import (CHANNEL, Card, Footprint, ParamCount, StoreConfig, add_loss, add_update, check_input,
                                  collecting, emit, register)
from storelab.stores.ffn import ACTIVATIONS, SWIGLU_ALPHA, SWIGLU_UP_SHIFT, check_activation

__all__ = ["MoEConfig", "MoE"]

ROUTINGS = ("learned", "hash")
# gated units (most), or plain ones (Nemotron-H's ReLU^2 experts); "power" needs a field experts do not have
EXPERT_ACTIVATIONS = tuple(k for k in ACTIVATIONS if k != "power")


@register("moe")
@dataclass(kw_only=True)
class MoEConfig(StoreConfig):
    d_model: int
    n_experts: int
    top_k: int
    d_expert: int
    router: str = "softmax"
    routing: str = "learned"
    router_bias: bool = False        # DeepSeek-V3's choice bias (a buffer, steers the choice only)
    router_logit_bias: bool = False  # gpt-oss: the router's linear layer has a learned bias
    expert_biases: bool = False      # gpt-oss: per-expert biases on gate_up and down
    norm_topk_prob: bool = True
    routed_scaling: float = 1.0
    n_group: int = 1                 # group-limited routing (DeepSeek-V3): experts in n_group groups,
    topk_group: int = 1              # the choice made among the topk_group best groups' experts
    n_shared: int = 0
    d_shared: int | None = None      # default: d_expert
    shared_gate: bool = False
    latent_dim: int | None = None
    latent_norm: bool = True         # the latent's RMSNorm (Kimi K3); Nemotron-H's latent projection has none
    vocab_size: int | None = None    # hash routing only
    activation: str = "swiglu"       # the experts' unit: "swiglu" or "clamped_swiglu"
    swiglu_limit: float | None = None
    swiglu_alpha: float = SWIGLU_ALPHA        # clamped_swiglu only
    swiglu_up_shift: float = SWIGLU_UP_SHIFT  # clamped_swiglu only
    norm_eps: float = 1e-6           # RMSNorm of the latent
    aux_loss_coef: float | None = None   # None: the family's (1e-4 with router_bias, else 1e-3)
    bias_update_rate: float = 1e-3       # router_bias: DeepSeek-V3's gamma
    scale_input: bool = False            # Llama 4: y = sum_k expert_k(w_k x), the weight on the expert's input

    SLOTS, FAMILY, CARD_ORDER = (CHANNEL,), "experts", 20
    CARD = Card(
        name="Experts",
        written_by="training",
        holds="judged by total parameters, at a small penalty",
        reading_costs="a few experts, chosen by a router or, in V4-Pro's first three layers, by a hash of the token",
        forgets="only when later training overwrites them",
        source="arXiv 1701.06538; 2412.19437 (bias routing); 2606.19348 (hash routing); 2607.24653 (latent experts)",
    )

    def __post_init__(self) -> None:
        self.check_positive("d_model", "n_experts", "d_expert")
        self.check(self.top_k > 0, "top_k", f"must be > 0, got {self.top_k!r}")
        self.check(self.top_k <= self.n_experts, "top_k", f"must be <= n_experts ({self.n_experts}), got {self.top_k}")
        self.check(self.router in ROUTER_SCORES, "router",
                   f"must be one of {tuple(ROUTER_SCORES)}, got {self.router!r}")
        self.check(self.routing in ROUTINGS, "routing", f"must be one of {ROUTINGS}, got {self.routing!r}")
        if self.routing == "hash":
            self.check(self.vocab_size is not None and self.vocab_size > 0, "vocab_size",
                       f"hash routing needs the vocabulary size (> 0), got {self.vocab_size!r}")
            self.check(not self.router_bias, "router_bias", "hash routing chooses by table; a choice bias is unused")
        self.check(self.n_group >= 1 and self.n_experts % self.n_group == 0, "n_group",
                   f"must be >= 1 and divide n_experts ({self.n_experts}), got {self.n_group!r}")
        self.check(1 <= self.topk_group <= self.n_group, "topk_group",
                   f"must be in [1, n_group = {self.n_group}], got {self.topk_group!r}")
        self.check(self.n_group == 1 or self.topk_group * (self.n_experts // self.n_group) >= self.top_k,
                   "topk_group", f"{self.topk_group} groups of {self.n_experts // max(self.n_group, 1)} experts "
                   f"hold fewer than top_k = {self.top_k}")
        self.check(self.routed_scaling > 0, "routed_scaling", f"must be > 0, got {self.routed_scaling!r}")
        self.check(self.n_shared >= 0, "n_shared", f"must be >= 0, got {self.n_shared!r}")
        if self.d_shared is not None:
            self.check(self.d_shared > 0, "d_shared", f"must be > 0, got {self.d_shared!r}")
        self.check(not self.shared_gate or self.n_shared > 0, "shared_gate", "needs n_shared > 0")
        if self.latent_dim is not None:
            self.check(self.latent_dim > 0, "latent_dim", f"must be > 0, got {self.latent_dim!r}")
        check_activation(self, EXPERT_ACTIVATIONS)
        self.check(self.aux_loss_coef is None or self.aux_loss_coef >= 0, "aux_loss_coef",
                   f"must be >= 0, got {self.aux_loss_coef!r}")
        self.check(self.bias_update_rate >= 0, "bias_update_rate", f"must be >= 0, got {self.bias_update_rate!r}")
        self.check(isinstance(self.scale_input, bool), "scale_input",
                   f"must be true or false, got {self.scale_input!r}")

    @property
    def balance_coef(self) -> float:
        """The auxiliary loss's weight: the config's, else the family's (0 for hash routing)."""
        if self.routing == "hash":
            return 0.0
        return self.aux_loss_coef if self.aux_loss_coef is not None else (1e-4 if self.router_bias else 1e-3)

    # -- sizes ---------------------------------------------------------------
    @property
    def expert_width(self) -> int:
        return self.latent_dim if self.latent_dim is not None else self.d_model

    @property
    def gated(self) -> bool:
        """Gated experts (gate and up rows, SwiGLU and kin) or plain ones (one up projection)."""
        return ACTIVATIONS[self.activation].gated

    @property
    def shared_width(self) -> int:
        return self.n_shared * (self.d_shared if self.d_shared is not None else self.d_expert)

    def _counts(self, experts: int) -> int:
        D, W = self.d_model, self.expert_width
        n = self.n_experts * D + (self.n_experts if self.router_bias else 0)   # router (+ choice bias)
        n += self.n_experts if self.router_logit_bias else 0                   # the router's own bias
        per = 3 if self.gated else 2                                           # gate, up, down (or up, down)
        n += per * experts * self.d_expert * W                                 # routed experts
        n += experts * (2 * self.d_expert + W) if self.expert_biases else 0    # their biases
        if self.latent_dim is not None:
            n += 2 * D * W + (W if self.latent_norm else 0)                    # down, up (+ RMSNorm)
        n += per * D * self.shared_width + (D if self.shared_gate else 0)      # shared experts (+ gate)
        return n

    def experts_per_token(self) -> tuple[int, int, int]:
        """(chosen, available, shared) experts per token."""
        return self.top_k, self.n_experts, self.n_shared

    def num_params(self) -> ParamCount:
        """Stored: every expert; active: top_k of them. The hash table is an integer buffer, not counted."""
        return ParamCount(stored=self._counts(self.n_experts), active=self._counts(self.top_k))

    def footprint(self, context: int, *, dtype: str = "bf16") -> Footprint:
        return Footprint(context=context, kept=0, read=0, state_bytes=0, read_flops=2 * self.num_params().active,
                         note=f"written in training: {self.top_k} of {self.n_experts} experts per token")

    def build(self) -> "MoE":
        return MoE(self)


class MoE(nn.Module):
    def __init__(self, cfg: MoEConfig):
        super().__init__()
        self.cfg = cfg
        D, E, I, W = cfg.d_model, cfg.n_experts, cfg.d_expert, cfg.expert_width
        self.router = nn.Linear(D, E, bias=cfg.router_logit_bias)
        if cfg.router_bias:
            # learned outside the gradient (aux-loss-free balancing); steers the choice only
            self.register_buffer("choice_bias", torch.zeros(E))
        if cfg.routing == "hash":
            self.register_buffer("table", _default_hash_table(cfg.vocab_size, E, cfg.top_k))
        self.gate_up = nn.Parameter(torch.randn(E, (2 if cfg.gated else 1) * I, W) * W ** -0.5)  # plain: up rows
        self.down = nn.Parameter(torch.randn(E, W, I) * I ** -0.5)
        if cfg.expert_biases:
            self.gate_up_bias = nn.Parameter(torch.zeros(E, 2 * I))
            self.down_bias = nn.Parameter(torch.zeros(E, W))
        if cfg.latent_dim is not None:
            self.latent_down = nn.Linear(D, W, bias=False)
            self.latent_norm = RMSNorm(W, eps=cfg.norm_eps) if cfg.latent_norm else nn.Identity()
            self.latent_up = nn.Linear(W, D, bias=False)
        S = cfg.shared_width
        if S:
            if cfg.gated:
                self.shared_gate_proj = nn.Linear(D, S, bias=False)
            self.shared_up_proj = nn.Linear(D, S, bias=False)
            self.shared_down_proj = nn.Linear(S, D, bias=False)
        if cfg.shared_gate:
            self.shared_gate = nn.Linear(D, 1, bias=False)
        self.act = ACTIVATIONS[cfg.activation]

    def route(self, x_ND: Tensor, token_ids_N: Tensor | None) -> tuple[Tensor, Tensor]:
        """(weights_NK, experts_NK) for these tokens."""
        cfg = self.cfg
        logits_NE = self.router(x_ND)
        if cfg.routing == "hash":
            experts_NK = self.table[token_ids_N]
            return route_fixed(logits_NE, experts_NK, score=cfg.router, normalize=cfg.norm_topk_prob,
                               scaling=cfg.routed_scaling), experts_NK
        return route_topk(logits_NE, top_k=cfg.top_k, score=cfg.router, bias_E=getattr(self, "choice_bias", None),
                          normalize=cfg.norm_topk_prob, scaling=cfg.routed_scaling, n_group=cfg.n_group,
                          topk_group=cfg.topk_group)

    def forward(self, x_BTD: Tensor, state: EmptyState | None = None, *, token_ids: Tensor | None = None
                ) -> tuple[Tensor, EmptyState]:
        cfg = self.cfg
        check_input(x_BTD, cfg.d_model)
        B, T, D = x_BTD.shape
        ids_N = None
        if cfg.routing == "hash":
            if token_ids is None or tuple(token_ids.shape) != (B, T):
                got = None if token_ids is None else list(token_ids.shape)
                raise ValueError(f"token_ids: hash routing needs token ids of shape [B, T] = [{B}, {T}], got {got}")
            ids_N = token_ids.reshape(-1).long()
            if ids_N.numel() and (ids_N.min() < 0 or ids_N.max() >= cfg.vocab_size):
                raise ValueError(f"token_ids: must lie in [0, vocab_size={cfg.vocab_size})")
        x_ND = x_BTD.reshape(-1, D)
        weights_NK, experts_NK = self.route(x_ND, ids_N)
        emit(self, "load", lambda: expert_load(experts_NK, cfg.n_experts).detach())
        if cfg.balance_coef:  # per sequence with the bias (DeepSeek-V3), else over the batch
            G = B if cfg.router_bias else 1
            add_loss(self, "balance", lambda: cfg.balance_coef * balance_loss(
                self.router(x_ND).view(G, -1, cfg.n_experts), experts_NK.view(G, -1, cfg.top_k), score=cfg.router))
        if cfg.router_bias and collecting():  # the update, after the optimiser step, from this call's load
            add_update(self, lambda load_E: self.choice_bias.add_(
                bias_step(load_E, cfg.bias_update_rate).to(self.choice_bias.dtype)),
                counts=expert_load(experts_NK, cfg.n_experts))

        act = self.act.unit(cfg)
        z_NW = self.latent_norm(self.latent_down(x_ND)) if cfg.latent_dim is not None else x_ND
        if cfg.scale_input:  # Llama 4: slot (n, k) reads w_nk z_n, its output summed unweighted
            N, K = experts_NK.shape
            z_NW = (z_NW[:, None] * weights_NK[..., None].to(z_NW.dtype)).reshape(N * K, -1)  # [N K, W]
            experts_NK, weights_NK = experts_NK.reshape(N * K, 1), weights_NK.new_ones(N * K, 1)
        biases = dict(gate_up_bias_EF=self.gate_up_bias, down_bias_ED=self.down_bias) if cfg.expert_biases else {}
        y_NW = grouped_swiglu(z_NW, experts_NK, weights_NK, self.gate_up, self.down, act=act, gated=cfg.gated,
                              **biases)
        if cfg.scale_input:
            y_NW = y_NW.view(N, K, -1).sum(1)
        y_ND = self.latent_up(y_NW) if cfg.latent_dim is not None else y_NW

        if cfg.shared_width:
            h_NS = (act(self.shared_gate_proj(x_ND), self.shared_up_proj(x_ND)) if cfg.gated
                    else act(self.shared_up_proj(x_ND)))
            shared_ND = self.shared_down_proj(h_NS)
            if cfg.shared_gate:
                shared_ND = torch.sigmoid(self.shared_gate(x_ND)) * shared_ND
            y_ND = y_ND + shared_ND
        seen = 0 if state is None else state.seen
        return y_ND.reshape(B, T, D), EmptyState(seen=seen + T)


def _default_hash_table(vocab_size: int, n_experts: int, top_k: int) -> Tensor:
    """[vocab, top_k] distinct experts per token, spread by a multiplicative hash of the id.

    A checkpoint overwrites it (DeepSeek-V4 ships its ``tid2eid``); this default only has
    to be deterministic, balanced and free of repeats within a row.
    """
    v = torch.arange(vocab_size, dtype=torch.long)
    base = (v * 2654435761) % n_experts                         # Knuth's multiplicative hash
    stride = n_experts // top_k
    return (base[:, None] + stride * torch.arange(top_k)[None, :]) % n_experts

