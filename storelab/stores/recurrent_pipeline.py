"""The pipeline every recurrent store shares, and the declared rule it runs (essay section 3).

For each token x_t (n writes per token where the rule takes several, ``writes`` of the config):

  q, k, v = SiLU(short causal conv_W([W_q x; W_k x; W_v x]))   (tail of W-1 inputs kept between calls)
  q, k    = L2-normalised per head (k per head of each write)
  S_t     = rule.op(S_{t-1}; k_t, v_t, the rule's gates)        (storelab.ops)
  o_t     = S_t^T q_t / sqrt(K),  y_t = W_o (RMSNorm(o_t) [* rule's output gate])

What varies between the kinds is a ``Rule``, a small declared object each config hands over
(``cfg.rule()``, asked once, at construction): its op, the parameters its gates own and how they
are made, how each gate is computed, and the name of fla's kernel of the same rule. The module
never asks which kind it is.

Shape legend: B batch, T tokens, D model width, n writes per token, H q/k heads, HV value heads,
K key width, V value width, C conv channels.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from storelab.ops import fla as fla_dispatch
from storelab.ops.conv import causal_conv1d
from storelab.ops.norm import l2_norm, rms_norm
from storelab.ops.precision import at_least_fp32
from storelab.state import RecurrentState
from storelab.stores.base import check_input

if TYPE_CHECKING:
    from storelab.stores.recurrent import _RecurrentConfig

__all__ = ["Rule", "RecurrentStore"]

Gate = Callable[["RecurrentStore", Tensor], Tensor]  # (store, x_BTD) -> the gate's values


def _no_params(cfg) -> dict:
    return {}


@dataclass(frozen=True)
class Rule:
    """A recurrent rule as data: what the shared pipeline runs between its projections and its output.

    op           the update, an op of ``storelab.ops`` called as ``op(q, k, v, *, [g,] [beta,] scale,
                 initial_state, output_final_state, chunk_size, mode)``; k and v carry the config's
                 ``writes`` axes ([B, T, H, K] for one write per token, [B, T, n, H, K] for n)
    params       cfg -> the parameters the gates own, name -> module or ``nn.Parameter``, in
                 registration order: the names are the checkpoints' keys and the order that of the
                 optimizer's state, so neither moves. No plain tensors: a constant kept as a buffer
                 is in no checkpoint, and a model built on ``meta`` to be loaded could not fill it
                 (compute such constants in the gate, from the config)
    beta         the write step, [B, T, (n,) HV], or None (additive writes: linear attention)
    log_decay    g <= 0, [B, T, HV] per head or [B, T, H, K] per key channel, or None (no decay)
    output_gate  [B, T, HV, V], multiplies the normed output, or None
    fla          the name of fla's kernel of the same rule (``storelab.ops.fla``), or None
    """

    op: Callable[..., tuple[Tensor, Tensor | None]]
    params: Callable[["_RecurrentConfig"], dict[str, nn.Module | Tensor]] = _no_params
    beta: Gate | None = None
    log_decay: Gate | None = None
    output_gate: Gate | None = None
    fla: str | None = None


class RecurrentStore(nn.Module):
    """One recurrent layer of any kind: the shared pipeline around its config's rule;
    ``forward(x, state) -> (y, RecurrentState)``.

    Parameters: q_proj, k_proj, v_proj, conv_weight, o_norm, o_proj, then the rule's own (``Rule.params``).
    A chunked store whose rule names an fla kernel looks it up once, at construction
    (``storelab.ops.fla.fla_kernels``), and runs it on CUDA tensors; ``backend`` says what it found.
    """

    def __init__(self, cfg: "_RecurrentConfig"):
        super().__init__()
        self.cfg = cfg
        self.rule = rule = cfg.rule()
        D, H, HV, K, V, n = cfg.d_model, cfg.n_heads, cfg.n_value_heads, cfg.head_k_dim, cfg.head_v_dim, cfg.n_writes
        self.q_proj = nn.Linear(D, H * K, bias=False)
        self.k_proj = nn.Linear(D, n * H * K, bias=False)
        self.v_proj = nn.Linear(D, n * HV * V, bias=False)
        self.conv_weight = nn.Parameter(torch.randn(cfg.conv_channels, cfg.conv_kernel) / math.sqrt(cfg.conv_kernel))
        self.o_norm = nn.Parameter(torch.ones(V))
        self.o_proj = nn.Linear(HV * V, D, bias=False)
        params = rule.params(cfg)   # made once: each call draws its initial values from the generator
        self._rule_params = tuple(params)  # the names of the gates' own parameters (gate_params)
        for name, p in params.items():
            if not isinstance(p, (nn.Module, nn.Parameter)):
                raise TypeError(f"Rule.params: {name} is a {type(p).__name__}; a rule owns modules and parameters "
                                f"only (compute constants in its gate)")
            setattr(self, name, p)
        # the gates the op takes, by its keyword names; fla's kernel of the rule (op name -> kernel), if any
        self._gates = tuple((kw, gate) for kw, gate in (("g", rule.log_decay), ("beta", rule.beta)) if gate is not None)
        self._fla = fla_dispatch.fla_kernels([rule.fla]) if rule.fla is not None and cfg.mode == "chunk" else {}

    @property
    def backend(self) -> str:
        """What construction found: "fla" (fla's kernel of this rule, run on CUDA tensors) or "torch"."""
        return "fla" if self._fla else "torch"

    # -- gates (also read by probes: the forgetting probe asks for _log_decay) ------------------
    def _beta(self, x_BTD: Tensor) -> Tensor | None:
        return None if self.rule.beta is None else self.rule.beta(self, x_BTD)

    def _log_decay(self, x_BTD: Tensor) -> Tensor | None:
        """g <= 0: the log of what each step keeps of the old state; None when the rule has no decay."""
        return None if self.rule.log_decay is None else self.rule.log_decay(self, x_BTD)

    def gate_params(self) -> dict[str, str]:
        """What ``_log_decay`` reads at x = 0, parameter name -> "zero" (a weight applied to x, zero there)
        or "read" (a tensor the gate keeps: A_log, dt_bias, a projection's bias): the rule's own
        parameters (``Rule.params``). The weights-only forgetting estimate reads exactly the "read" ones
        (``storelab.probes.gate_weights``)."""
        out: dict[str, str] = {}
        for name in self._rule_params:
            part = getattr(self, name)
            if isinstance(part, nn.Module):   # a projection of x (Rule.params: a module or a parameter)
                out.update({f"{name}.{pn}": "read" if pn.rsplit(".", 1)[-1] == "bias" else "zero"
                            for pn, _ in part.named_parameters()})
            else:
                out[name] = "read"
        return out

    # -- the store -------------------------------------------------------------------
    def forward(self, x_BTD: Tensor, state: RecurrentState | None = None, *, token_ids=None):
        cfg, rule = self.cfg, self.rule
        check_input(x_BTD, cfg.d_model)
        B, T, _ = x_BTD.shape
        H, HV, K, V, n, w = cfg.n_heads, cfg.n_value_heads, cfg.head_k_dim, cfg.head_v_dim, cfg.n_writes, cfg.writes
        state = state if state is not None else RecurrentState()
        # one product for the three projections (their weights stacked, a few KB), not three and a cat
        W_qkv = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])
        qkv_BTC = F.linear(x_BTD, W_qkv)
        qkv_BTC, tail = causal_conv1d(qkv_BTC, self.conv_weight, tail_BWC=state.conv, activation="silu")
        q, k, v = qkv_BTC.split([H * K, n * H * K, n * HV * V], dim=-1)
        q_BTHK = l2_norm(at_least_fp32(q.reshape(B, T, H, K)))
        k_BTwHK = l2_norm(at_least_fp32(k.reshape(B, T, *w, H, K)))                   # w: the writes axes, () or (n,)
        v_BTwHV = at_least_fp32(v.reshape(B, T, *w, HV, V))
        gates = {kw: gate(self, x_BTD) for kw, gate in self._gates}
        fla_fn = self._fla.get(rule.fla) if q_BTHK.device.type in fla_dispatch.FLA_DEVICES else None
        if fla_fn is not None:
            o_BTHV, S = fla_dispatch.run_fla(fla_fn, q_BTHK, k_BTwHK, v_BTwHV, **gates, initial_state=state.S,
                                             output_final_state=True)
        else:
            o_BTHV, S = rule.op(q_BTHK, k_BTwHK, v_BTwHV, **gates, initial_state=state.S, output_final_state=True,
                                chunk_size=cfg.chunk_size, mode=cfg.mode)
        o_BTHV = rms_norm(o_BTHV, self.o_norm, cfg.norm_eps)
        if rule.output_gate is not None:
            o_BTHV = o_BTHV * rule.output_gate(self, x_BTD)
        y_BTD = self.o_proj(o_BTHV.reshape(B, T, HV * V).to(x_BTD.dtype))
        return y_BTD, RecurrentState(seen=state.seen + T, S=at_least_fp32(S), conv=tail)
