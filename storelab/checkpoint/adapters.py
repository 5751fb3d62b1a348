"""What a checkpoint family computes that our store configs cannot yet say.

An adapter is data (a dict saved in our ``config.json``) plus a module class that
replaces a built store's class in place, keeping its parameters and names. The loader
applies a family's adapters after building the model; ``save`` writes them and
``load`` applies them again, so a saved model gives the same logits.

``clamped_swiglu`` (MiniMax-M3's experts, dense and shared MLPs; the unit of gpt-oss,
arXiv 2508.10925, with the gate and up halves not interleaved):

    g = min(gate, limit),  u = clamp(up, -limit, limit)
    act = g * sigmoid(alpha * g) * (u + up_shift)

where our ``moe``/``ffn`` stores compute ``silu(gate) * up`` (alpha = 1, shift = 0).
It is applied to the ``channel`` store of the listed layers.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from storelab.ops.routing import expert_load
from storelab.state import EmptyState
from storelab.stores.base import check_input
from storelab.stores.ffn import FFN
from storelab.stores.moe import MoE

__all__ = ["apply_adapters", "clamped_swiglu", "KINDS"]


def clamped_swiglu(gate: Tensor, up: Tensor, *, alpha: float, limit: float | None, up_shift: float) -> Tensor:
    if limit is not None:
        gate = gate.clamp(max=limit)
        up = up.clamp(min=-limit, max=limit)
    return gate * torch.sigmoid(alpha * gate) * (up + up_shift)


def _act(mod: nn.Module, gate: Tensor, up: Tensor) -> Tensor:
    a = mod.adapter
    return clamped_swiglu(gate, up, alpha=a["alpha"], limit=a.get("limit"), up_shift=a.get("up_shift", 0.0))


class ClampedSwigluFFN(FFN):
    """An ``ffn`` (swiglu) whose unit is ``clamped_swiglu``."""

    def forward(self, x_BTD: Tensor, state: EmptyState | None = None, *, token_ids: Tensor | None = None):
        check_input(x_BTD, self.cfg.d_model)
        seen = 0 if state is None else state.seen
        h_BTF = _act(self, self.gate_proj(x_BTD), self.up_proj(x_BTD))
        return self.down_proj(h_BTF), EmptyState(seen=seen + x_BTD.shape[1])


class ClampedSwigluMoE(MoE):
    """A learned-routing ``moe`` whose experts and shared experts use ``clamped_swiglu``."""

    def forward(self, x_BTD: Tensor, state: EmptyState | None = None, *, token_ids: Tensor | None = None):
        cfg = self.cfg
        check_input(x_BTD, cfg.d_model)
        B, T, D = x_BTD.shape
        x_ND = x_BTD.reshape(-1, D)
        ids_N = None if token_ids is None or cfg.routing != "hash" else token_ids.reshape(-1).long()
        weights_NK, experts_NK = self.route(x_ND, ids_N)
        self.last_load = expert_load(experts_NK, cfg.n_experts).detach()
        y_ND = torch.zeros_like(x_ND)
        for e in experts_NK.unique().tolist():  # each expert on its own tokens
            tok_M, slot_M = torch.where(experts_NK == e)
            gate, up = nn.functional.linear(x_ND[tok_M], self.gate_up[e]).chunk(2, dim=-1)
            out = nn.functional.linear(_act(self, gate, up), self.down[e])
            y_ND.index_add_(0, tok_M, out * weights_NK[tok_M, slot_M, None].to(out.dtype))
        if cfg.shared_width:
            h_NS = _act(self, self.shared_gate_proj(x_ND), self.shared_up_proj(x_ND))
            shared_ND = self.shared_down_proj(h_NS)
            if cfg.shared_gate:
                shared_ND = torch.sigmoid(self.shared_gate(x_ND)) * shared_ND
            y_ND = y_ND + shared_ND
        seen = 0 if state is None else state.seen
        return y_ND.reshape(B, T, D), EmptyState(seen=seen + T)


KINDS = {"clamped_swiglu": {FFN: ClampedSwigluFFN, MoE: ClampedSwigluMoE}}


def apply_adapters(model: nn.Module, adapters: list[dict[str, Any]]) -> None:
    """Swap the listed layers' channel stores to the adapter's class; record the adapters on the model."""
    for a in adapters:
        kind = a.get("kind")
        if kind not in KINDS:
            raise ValueError(f"adapters: unknown adapter kind {kind!r} (known: {', '.join(KINDS)})")
        for i in a["layers"]:
            mod = model.blocks[i].channel
            for base, cls in KINDS[kind].items():
                if type(mod) is base or type(mod) is cls:
                    if isinstance(mod, MoE) and mod.cfg.latent_dim is not None:
                        raise ValueError(f"adapters: {kind} on layer {i}: latent experts are not supported")
                    if isinstance(mod, FFN) and not mod.cfg.gated:
                        raise ValueError(f"adapters: {kind} on layer {i}: needs a swiglu ffn")
                    mod.__class__ = cls
                    mod.adapter = dict(a)
                    break
            else:
                raise ValueError(f"adapters: {kind} on layer {i}: its channel store is {type(mod).__name__}")
    model.adapters = [dict(a) for a in adapters]
