"""Name tables: where each of our tensors comes from in a checkpoint.

A family's table maps every tensor of our model (its ``state_dict`` name) to a
``Src``: the checkpoint tensors it is made of and the function that makes it.
The function also runs on ``meta`` tensors, so the loader checks every shape
from the shard headers before reading a byte.

    copy(name)               the tensor as it is
    plus_one(name)           1 + w: norms stored as an offset from one (Qwen3-Next, MiniMax, Gemma)
    rows(name, start, stop)  a slice along the first axis (a fused projection split in two)
    Src(names, fn, what)     anything else (per-expert matrices stacked, fused rows re-laid, ...)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

__all__ = ["Src", "copy", "plus_one", "rows", "ours_to_load"]


@dataclass(frozen=True)
class Src:
    names: tuple[str, ...]
    fn: Callable[..., Tensor] | None = None   # pieces -> our tensor; None: the single piece
    what: str = ""                            # how the pieces become ours, for error messages
    integer: bool = False                     # the pieces hold integers (a hash table), not weights
    quantized: bool = False                   # FP8 pieces allowed (read with their scales)

    def make(self, *pieces: Tensor) -> Tensor:
        return pieces[0] if self.fn is None else self.fn(*pieces)


def copy(name: str, *, integer: bool = False) -> Src:
    return Src((name,), integer=integer)


def plus_one(name: str) -> Src:
    return Src((name,), lambda w: w.float() + 1.0, "1 + w")


def rows(name: str, start: int, stop: int) -> Src:
    return Src((name,), lambda w: w[start:stop], f"rows {start}:{stop}")


def ours_to_load(model: torch.nn.Module) -> dict[str, Tensor]:
    """Our tensors a checkpoint must fill: the state dict, a tied LM head counted once (as the embedding)."""
    sd = model.state_dict(keep_vars=True)
    tied = getattr(model, "cfg", None) is not None and model.cfg.tie_embeddings
    return {k: v for k, v in sd.items() if not (tied and k == "lm_head.weight")}
