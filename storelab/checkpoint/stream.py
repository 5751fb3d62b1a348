"""Checkpoints larger than memory: a model whose weights stay in the shards until a layer runs.

    model = stream(folder)                       # a storelab Model; no weight in memory
    logits, cache = model(token_ids_BT, cache)   # each layer read, run for the whole batch, let go
    logits, cache = streamed_forward(folder, token_ids_BT, cache)   # the same, in one call

How. ``stream`` builds the checkpoint's model exactly as ``load`` does (``loader.plan``: the
model on ``meta`` in its target dtype, the family's name table checked against the headers,
FP8 pieces paired with their scales), but fills nothing. Instead each *unit* of the model's
forward (the embedding, every block, the depth head, the final norm, the LM head) gets a
pre-hook that reads that unit's tensors from the shards (``CountingShards``: plain reads, no
memory map), turns them into ours with the table's functions (dequantized, sliced, stacked:
``Src.make``, as ``fill`` does, then cast to the parameter's dtype) and puts them in the
parameters' slots; and a hook after the call puts the model's own ``meta`` tensors back. ``Model.forward``
itself runs unchanged, so the streamed forward is the in-memory forward, bit for bit: the
layers run in order on the whole batch, the residual stream, mHC's streams and AttnRes's
group sums pass between them as ever, the cache (the per-layer states, the selection groups'
shares, the views of an owner's cache: ``relink``) is built and returned as ever, and only
activations and the cache outlive a layer. A decoding step after a prefill is another call,
which reads every layer again.

Why hooks on the units, not a second forward: the model's forward is the one place that
knows how layers, depth states and shared states fit together (encoder-decoder included);
copying it would drift. Between calls the model holds its own meta parameters, so ties hold (a
tied LM head is the embedding's parameter; its hook fills it again from the embedding's entry).

A GGUF file streams the same way: ``plan`` reads it with ``GGUFShards``, which counts and reads per
tensor as ``CountingShards`` does (each unit's GGUF tensors read and dequantized during its call).

Memory: the largest unit's weights (twice while a stacked or dequantized tensor is made),
plus activations and the cache. Reads: all weights once per call (``bytes_read`` on the
model's ``.streamed``). Probes work unchanged as long as they touch weights only inside a
call (the forgetting probe computes its gates in a hook on the store, inside the call).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor, nn

from storelab.checkpoint.loader import plan
from storelab.checkpoint.reader import CountingShards
from storelab.checkpoint.shards import CheckpointError
from storelab.checkpoint.table import Src, ours_to_load

__all__ = ["stream", "streamed_forward", "Streamer"]


class Streamer:
    """The hooks that fill a meta-built model's units from the shards for the length of their call."""

    def __init__(self, model: nn.Module, table: dict[str, Src], shards: CountingShards, device: torch.device):
        self.shards, self.device = shards, device
        ours = ours_to_load(model)
        by_id = {id(t): name for name, t in ours.items()}   # a tied tensor answers to its first name
        self.units: dict[str, list[tuple[nn.Module, str, Tensor, Src]]] = {}
        units = [("embed", model.embed)] + [(f"blocks.{i}", b) for i, b in enumerate(model.blocks)] + \
                [("depth_head", model.depth_head), ("norm", model.norm), ("lm_head", model.lm_head)]
        for prefix, unit in units:
            entries = []
            for name, t in unit.state_dict(prefix=prefix + ".", keep_vars=True).items():
                mine = by_id[id(t)]
                owner_name, _, attr = name.rpartition(".")
                entries.append((model.get_submodule(owner_name), attr, t, table[mine]))
            self.units[prefix] = entries
            unit.register_forward_pre_hook(lambda mod, args, prefix=prefix: self.fill(prefix))
            unit.register_forward_hook(lambda mod, args, out, prefix=prefix: self.free(prefix))

    @torch.no_grad()
    def fill(self, prefix: str) -> None:
        """Read the unit's tensors and put them in its parameters and buffers."""
        for owner, attr, t, src in self.units[prefix]:
            val = src.make(*[self.shards.tensor(n) for n in src.names])
            val = val.to(device=self.device, dtype=t.dtype if t.dtype.is_floating_point else val.dtype)
            if tuple(val.shape) != tuple(t.shape):  # cannot happen after plan()'s check; a guard
                raise CheckpointError(f"{self.shards.folder}: {prefix}.{attr}: read {list(val.shape)}, "
                                      f"needs {list(t.shape)}")
            self._put(owner, attr, t, val)

    @torch.no_grad()
    def free(self, prefix: str) -> None:
        """Put the meta tensors back: the unit's weights are let go."""
        for owner, attr, t, _ in self.units[prefix]:
            self._put(owner, attr, t)

    @staticmethod
    def _put(owner: nn.Module, attr: str, t: Tensor, val: Tensor | None = None) -> None:
        """``val`` in the slot of ``t`` (a parameter of its own), or ``t`` itself again when None:
        the model's own meta parameter, so a tie (the LM head's weight is the embedding's) holds."""
        slots = owner._parameters if isinstance(t, nn.Parameter) else owner._buffers
        if val is None:
            slots[attr] = t
        else:
            slots[attr] = nn.Parameter(val, requires_grad=t.requires_grad) if isinstance(t, nn.Parameter) else val


def stream(path: str | Path, *, dtype=None, device: str | torch.device = "cpu") -> nn.Module:
    """The checkpoint's model with its weights left in the shards, read unit by unit during each call.
    Checked as ``load`` checks (every tensor against the headers) before it returns; ``.streamed``
    is its ``Streamer`` (``.streamed.shards.bytes_read``: what the calls have read)."""
    device = torch.device(device)
    if device.type == "meta":
        raise CheckpointError("device: a streamed model computes; for accounting load(path, device='meta')")
    p = plan(path, dtype=dtype, shards=CountingShards)
    model = p.model.eval()
    model.streamed = Streamer(model, p.table, p.shards, device)
    model.checkpoint = {**model.checkpoint, "streamed": True}
    return model


@torch.no_grad()
def streamed_forward(path: str | Path, token_ids_BT: Tensor, cache: list | None = None, *, dtype=None,
                     **kwargs) -> tuple[Tensor, list]:
    """``model(token_ids_BT, cache, **kwargs)`` of the checkpoint at ``path``, streamed: the same
    logits and cache as the loaded model's. Each call reads the headers again (keep ``stream(path)``
    to call it many times)."""
    return stream(path, dtype=dtype)(token_ids_BT, cache, **kwargs)
