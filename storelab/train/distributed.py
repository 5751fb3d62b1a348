"""Training over several processes on torch's own engines: DDP and FSDP2; mixed precision.

``torchrun --nproc-per-node N -m storelab train --parallel ddp|fsdp ...`` sets RANK, WORLD_SIZE,
LOCAL_RANK and MASTER_ADDR/PORT; ``Dist.from_env(device)`` joins the process group -- nccl when
the process trains on a CUDA device (``--device cuda``: ``cuda:LOCAL_RANK``), gloo on the CPU
(``--device cpu``, the default: the tiny models and the tests run there alike on any machine). Every process builds the same
model from the same seed and generates the same *global* batch for each step (batches are a
function of (seed, step)), then takes its own contiguous slice.

The engines, one small declared object each, chosen once (``engine(parallel, dist, precision)``):

* ``Plain`` - one process: the module itself (``--parallel none``, the default when WORLD_SIZE is 1);
* ``DDP`` - ``torch.nn.parallel.DistributedDataParallel`` (Li et al., arXiv 2006.15704): every process
  holds the whole model and the whole AdamW state; the gradients are all-reduced in buckets during
  the backward pass. The default when WORLD_SIZE > 1. ``find_unused_parameters=True``: a layer that
  reads another layer's cache leaves the parameters that only write one without a gradient, on
  every process, and those keep ``grad = None`` as they would in one process;
* ``FSDP`` - FSDP2, ``torch.distributed.fsdp.fully_shard`` (Zhao et al., arXiv 2304.11277) on every
  block and on the root, over a one-dimensional ``DeviceMesh``: each process holds 1/N of every
  parameter and of the AdamW state (DTensor shards), all-gathers a block's weights for its forward
  and backward, and reduce-scatters the gradients.

Equal to one process with the global batch: each process's loss is its slice's summed token loss
divided by the *global* number of scored tokens, so the gradient wanted is the *sum* over
processes. Both engines average (divide by N), so the loop scales the loss it differentiates by
``loss_scale`` = N before ``backward`` (exact for N a power of two). Gradient clipping works on
either: under FSDP2 ``clip_grad_norm_`` reduces the norm over the DTensor shards, so it is the
global norm of one process.

Mixed precision (``--precision bf16``, default fp32): bf16 parameters and compute, fp32 gradient
reduction and fp32 master weights (what AdamW updates). FSDP2 by its ``MixedPrecisionPolicy(
param_dtype=bfloat16, reduce_dtype=float32)`` (the all-gathered copies are bf16, the shards stay
fp32); one process and DDP by ``torch.autocast(dtype=bfloat16)`` around the forward. The recurrent
stores keep their states in fp32 for bf16 inputs (``storelab.ops.precision``).

Gradient accumulation (``--accumulate N``): every process splits its slice into N micro-batches and
syncs the gradients only on the last one (``DDP.no_sync()``; FSDP2's
``set_requires_gradient_sync(False)``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist

__all__ = ["Dist", "PARALLEL", "PRECISIONS", "default_parallel", "engine"]

PARALLEL = ("none", "ddp", "fsdp")
PRECISIONS = ("fp32", "bf16")


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    device: torch.device = torch.device("cpu")

    @classmethod
    def from_env(cls, device: str = "cpu") -> "Dist":
        """Join the process group when launched by torchrun (WORLD_SIZE > 1); else a single process.
        ``device``: ``cpu`` (backend gloo), ``cuda`` (``cuda:LOCAL_RANK``, backend nccl) or ``auto``
        (cuda when torch sees one, else cpu)."""
        if device not in ("cpu", "cuda", "auto"):
            raise ValueError(f"device: one of cpu, cuda, auto, got {device!r}")
        if device == "cuda" and not torch.cuda.is_available():
            raise ValueError("device: cuda asked for, but torch sees no CUDA device (use --device cpu)")
        world = int(os.environ.get("WORLD_SIZE", "1"))
        cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        if world <= 1:
            return cls(device=device)
        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if cuda else "gloo")
        return cls(rank=dist.get_rank(), world=dist.get_world_size(), device=device)

    @property
    def main(self) -> bool:
        return self.rank == 0

    def shard(self, n: int) -> tuple[int, int]:
        """This process's examples [start, stop) of a global batch of n."""
        if n % self.world:
            raise ValueError(f"batch_size: the global batch {n} does not split over {self.world} processes")
        per = n // self.world
        return self.rank * per, (self.rank + 1) * per

    def sum(self, x: float) -> float:
        if self.world == 1:
            return x
        t = torch.tensor([x], dtype=torch.float64, device=self._comm_device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.item()

    def sum_tensor(self, t: torch.Tensor) -> torch.Tensor:
        """A tensor summed over processes (a copy; the tensor itself when alone)."""
        if self.world == 1:
            return t
        out = t.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out

    @property
    def _comm_device(self) -> torch.device:
        return self.device if dist.get_backend() == "nccl" else torch.device("cpu")

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def close(self) -> None:
        """Leave the process group, in order: a barrier (no process tears its group down while a peer is
        still in a collective: that one aborts, "terminate called without an active exception"), then
        ``destroy_process_group``, then a barrier on the rendezvous store (``_closed``: no process exits
        while a peer is still tearing its group down)."""
        if self.world > 1 and dist.is_initialized():
            store = dist.distributed_c10d._get_default_store()
            dist.barrier()
            dist.destroy_process_group()
            _closed(store, self.world)

    def exit(self) -> None:
        """End a process that was one of several (the CLI, after ``close`` and its output): flush stdout and
        stderr and leave with ``os._exit(0)``, so that no destructor runs at interpreter exit. Why: once
        FSDP2 has built a device mesh, the gloo group's threads outlive ``destroy_process_group`` (4 threads
        remain, measured with torch 2.13), and their teardown at exit aborted about one two-node run in 40
        on a loaded machine (SIGABRT after the run was complete and saved). One process: does nothing."""
        if self.world > 1:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)


def _closed(store, world: int, timeout_s: float = 300.0) -> None:
    """Wait on the store until all ``world`` processes have called this (after destroying their group).
    Best effort: a store that went away, or a peer that never comes within ``timeout_s``, ends the wait
    with a warning, since the run's outputs are written by then."""
    from datetime import timedelta

    try:
        store.set_timeout(timedelta(seconds=timeout_s))
        if store.add("storelab/closed", 1) >= world:
            store.set("storelab/all_closed", "1")
        store.wait(["storelab/all_closed"])
    except (RuntimeError, TimeoutError, dist.DistError) as e:  # DistStoreError and the socket errors
        warnings.warn(f"leaving the process group: the other processes did not all report closed ({e})",
                      stacklevel=2)


def default_parallel(world: int) -> str:
    """``ddp`` when there are several processes, ``none`` for one."""
    return "ddp" if world > 1 else "none"


class Plain:
    """One process: the module as it is; bf16 by autocast."""

    name = "none"
    loss_scale = 1.0

    def __init__(self, dist_: Dist, precision: str):
        self.dist, self.precision = dist_, precision

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        """The model ready for its optimizer (FSDP2 shards it in place)."""
        return model

    def wrap(self, objective: torch.nn.Module) -> torch.nn.Module:
        """What the loop calls for a micro-batch's (total, ...) (DDP wraps the objective)."""
        return objective

    def full(self, t: torch.Tensor) -> torch.Tensor:
        """A reduced value (the gradient norm) as a plain tensor."""
        return t

    def autocast(self):
        if self.precision == "bf16":
            return torch.autocast(self.dist.device.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def sync(self, module: torch.nn.Module, enabled: bool):
        """Within the block, the backward pass syncs the gradients over processes only if ``enabled``."""
        return contextlib.nullcontext()


class DDP(Plain):
    """DistributedDataParallel around the objective: whole model and optimizer on every process."""

    name = "ddp"

    def __init__(self, dist_: Dist, precision: str):
        super().__init__(dist_, precision)
        self.loss_scale = float(dist_.world)  # DDP averages; the loop's losses want the sum

    def wrap(self, objective: torch.nn.Module) -> torch.nn.Module:
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.dist.device.index] if self.dist.device.type == "cuda" else None
        return DistributedDataParallel(objective, device_ids=ids, find_unused_parameters=True)

    def sync(self, module: torch.nn.Module, enabled: bool):
        return contextlib.nullcontext() if enabled else module.no_sync()


class FSDP(Plain):
    """FSDP2: ``fully_shard`` on each block, then on the model (embedding, final norm, head)."""

    name = "fsdp"

    def __init__(self, dist_: Dist, precision: str):
        super().__init__(dist_, precision)
        self.loss_scale = float(dist_.world)  # the reduce-scatter averages; the loop's losses want the sum
        self.model = None

    def prepare(self, model: torch.nn.Module) -> torch.nn.Module:
        """Shard the model in place (before the optimizer is made: it must see the DTensor shards)."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(self.dist.device.type, (self.dist.world,))
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) \
            if self.precision == "bf16" else MixedPrecisionPolicy()
        # the logits are a view (a linear layer over [B, T, D]); the loop never writes into them in place
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
        for block in model.blocks:
            fully_shard(block, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        self.model = model
        return model

    def full(self, t: torch.Tensor) -> torch.Tensor:
        return t.full_tensor()  # clip_grad_norm_ over DTensor gradients returns a replicated DTensor

    def autocast(self):
        return contextlib.nullcontext()  # the policy casts the parameters

    def sync(self, module: torch.nn.Module, enabled: bool):
        self.model.set_requires_gradient_sync(enabled)
        return contextlib.nullcontext()


ENGINES = {"none": Plain, "ddp": DDP, "fsdp": FSDP}


def engine(parallel: str, dist_: Dist, precision: str = "fp32") -> Plain:
    """The engine of ``parallel`` (one of ``PARALLEL``) for this process group."""
    if parallel not in ENGINES:
        raise ValueError(f"parallel: one of {', '.join(PARALLEL)}, got {parallel!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision: one of {', '.join(PRECISIONS)}, got {precision!r}")
    if parallel == "none" and dist_.world > 1:
        raise ValueError(f"parallel: none is one process, but {dist_.world} were launched: use ddp or fsdp "
                         "(or auto)")
    if parallel != "none" and dist_.world == 1 and not dist.is_initialized():
        raise ValueError(f"parallel: {parallel} needs a process group: launch with torchrun "
                         "(torchrun --nproc-per-node N -m storelab train ...), or use --parallel none")
    return ENGINES[parallel](dist_, precision)
