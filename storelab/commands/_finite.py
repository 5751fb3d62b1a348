"""Non-finite numbers are an error or a result marked invalid, never a figure (issue 30, kind 5).

``check_weights(model, source)`` refuses a model with a NaN or infinite parameter before it runs,
naming the tensor (weights with NaN decode as ``<pad><pad><pad>``, and a probe's median half-life
comes out nan beside a "ranking stability" of 1). ``check_logits`` does the same for an activation
met while generating. ``invalid_fields(result)`` lists the non-finite numbers of a probe's result
(a probe on finite weights whose activations overflow must go on: its result is marked invalid,
and its figures are not shown).
"""

from __future__ import annotations

import math
from typing import Any

import torch


def check_weights(model: torch.nn.Module, source: Any) -> None:
    """A ValueError naming the first parameter of ``model`` (read from ``source``) holding NaN or inf;
    parameters not yet read (on the meta device: streamed layer by layer) are checked by the activations."""
    for name, p in model.named_parameters():
        if p.device.type == "meta" or not p.dtype.is_floating_point:
            continue
        bad = int((~torch.isfinite(p.detach())).sum())
        if bad:
            raise ValueError(f"weights: tensor {name!r} of {source} holds {bad:,} non-finite value(s) (NaN or inf) "
                             f"of {p.numel():,}: every output would be meaningless")


def check_logits(logits: torch.Tensor, where: str) -> None:
    """A ValueError when the logits (an activation) hold NaN or inf."""
    if not bool(torch.isfinite(logits).all()):
        raise ValueError(f"activations: the logits at {where} are not finite (NaN or inf): the weights are finite "
                         f"but the computation overflowed (try --dtype fp32)")


def invalid_fields(result: Any, path: str = "") -> list[str]:
    """The paths (``a.b[2].c``) of the non-finite floats in a probe's result."""
    if isinstance(result, float):
        return [] if math.isfinite(result) else [path or "value"]
    if isinstance(result, dict):
        return [q for k, v in result.items() if k != "essay" for q in invalid_fields(v, f"{path}.{k}" if path else k)]
    if isinstance(result, (list, tuple)):
        return [q for i, v in enumerate(result) for q in invalid_fields(v, f"{path}[{i}]")]
    return []
