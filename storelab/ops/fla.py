"""Optional dispatch of the delta rules to the Triton kernels of flash-linear-attention ("fla").

fla (https://github.com/fla-org/flash-linear-attention) ships fused GPU kernels of the same
chunked algorithms as ``storelab.ops.delta``: ``chunk_gated_delta_rule`` (Gated DeltaNet, Yang,
Kautz and Hatamizadeh, arXiv 2412.06464) and ``chunk_kda`` (Kimi Delta Attention, arXiv
2510.26692). They are never required: on a CPU, without CUDA, or without fla, the recurrent
stores run storelab's own chunked forms, which compute the same thing (``RecurrentStore.backend``
says which one a store found at construction).

* Install: ``pip install fla-core`` (storelab's ``gpu`` extra: fla's kernels alone; the
  ``flash-linear-attention`` package adds its layers and models); it needs triton.
* Turn off: ``STORELAB_FLA=0`` in the environment (read when a store is built).

fla's contract, which ``run_fla`` maps ours onto: ``fn(q, k, v, g, beta, scale=None,
initial_state=None, output_final_state=False, ...) -> (o, final_state or None)``, layout
[B, T, H, K] (not head-first), g the log decay (per head [B, T, H] for the gated delta rule,
per key channel [B, T, H, K] for KDA), state [N, H, K, V] in fp32, the same heads for q, k
and v. Ours lets value heads outnumber query/key heads (value head h reads query/key head
h // (HV / H)); ``run_fla`` repeats q and k to HV heads before the call, so fla's own
grouped-head conventions never come into play.

Shape legend: B batch, T tokens, H query/key heads, HV value heads, K key width, V value width.
"""

from __future__ import annotations

import importlib
import logging
import os
from typing import Callable, Iterable

import torch
from torch import Tensor

from storelab.ops.delta import check_delta_shapes

__all__ = ["FLA_DEVICES", "fla_kernels", "run_fla"]

FLA_DEVICES = ("cuda",)  # device types whose tensors go to fla's kernels

# our op name -> (fla module, function)
_KERNELS = {
    "gated_delta_rule": ("fla.ops.gated_delta_rule", "chunk_gated_delta_rule"),
    "kda": ("fla.ops.kda", "chunk_kda"),
}

_log = logging.getLogger(__name__)


def fla_kernels(names: Iterable[str]) -> dict[str, Callable]:
    """fla's kernels for the given ops ("gated_delta_rule", "kda"), those that import; {} when off.

    Off when ``STORELAB_FLA=0`` or when CUDA is not available. A kernel whose import fails (fla
    missing, a triton that cannot load) is left out, with a debug log line and no error.
    """
    names = list(names)
    unknown = [n for n in names if n not in _KERNELS]
    if unknown:
        raise ValueError(f"names: unknown kernels {unknown} (known: {sorted(_KERNELS)})")
    if os.environ.get("STORELAB_FLA", "1") == "0" or not torch.cuda.is_available():
        return {}
    found = {}
    for name in names:
        module, attr = _KERNELS[name]
        try:
            found[name] = getattr(importlib.import_module(module), attr)
        except Exception as e:  # missing package, triton that cannot load, a version without the function
            _log.debug("fla kernel %s unavailable: %s: %s", name, type(e).__name__, e)
    return found


def run_fla(fn: Callable, q: Tensor, k: Tensor, v: Tensor, *, g: Tensor, beta: Tensor, scale: float | None = None,
            initial_state: Tensor | None = None, output_final_state: bool = False) -> tuple[Tensor, Tensor | None]:
    """Our op contract (``storelab.ops.delta``) on one of fla's kernels; returns (o [B,T,HV,V], S or None).

    q, k [B, T, H, K]; v [B, T, HV, V] with HV a multiple of H; g the log decay (<= 0), [B, T, HV]
    per head or [B, T, HV, K] per key channel (the kernel decides which it accepts: the gated
    delta rule the first, KDA the second); beta [B, T, HV]; initial_state [B, HV, K, V];
    ``scale`` multiplies q, default K ** -0.5. o comes back in v's dtype, S in fp32.
    """
    # g's dims say which rule: [B, T, HV] per head (the gated delta rule), [B, T, HV, K] per key channel (KDA)
    B, T, H, K, HV, V = check_delta_shapes("run_fla", q, k, v, g, beta, initial_state, g.dim() == 4)
    S0_BHKV = None if initial_state is None else initial_state.float().contiguous()
    if T == 0:  # nothing to write; the kernels' grids would be empty
        S = S0_BHKV if S0_BHKV is not None else v.new_zeros(B, HV, K, V, dtype=torch.float32)
        return v.new_zeros(v.shape), (S if output_final_state else None)
    if HV != H:  # grouped heads: value head h reads query/key head h // (HV / H)
        q, k = q.repeat_interleave(HV // H, dim=2), k.repeat_interleave(HV // H, dim=2)
    o, S = fn(q.contiguous(), k.contiguous(), v.contiguous(), g.contiguous(), beta.contiguous(),
              scale=K ** -0.5 if scale is None else scale, initial_state=S0_BHKV,
              output_final_state=output_final_state)
    return o.to(v.dtype), (S.float() if output_final_state else None)
