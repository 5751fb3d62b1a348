"""Data parallelism over torch.distributed (gloo on the CPU), started by torchrun.

``torchrun --nproc-per-node 2 -m storelab train ...`` sets RANK, WORLD_SIZE and
MASTER_ADDR/PORT; ``Dist.from_env()`` joins the process group. Every process builds
the same model from the same seed and generates the same *global* batch for each step
(batches are a function of (seed, step)), then takes its own contiguous slice. After
the backward pass ``all_reduce_grads`` sums the gradients over the processes -- the
all-reduce of DistributedDataParallel (arXiv 2006.15704), done once per step without
bucketing -- so every process takes the same optimizer step.

Equal to one process with the global batch: each process's loss is its slice's summed
token loss divided by the *global* number of scored tokens, so the summed gradients
are exactly the single-process gradient of the mean over the global batch. A parameter
that no example of the global batch reached (an expert no token chose) keeps
``grad = None`` everywhere, as it would in one process, so AdamW skips it the same way.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


@dataclass
class Dist:
    rank: int = 0
    world: int = 1

    @classmethod
    def from_env(cls) -> "Dist":
        """Join the process group when launched by torchrun (WORLD_SIZE > 1); else a single process."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        if not dist.is_initialized():
            dist.init_process_group(backend="gloo")
        return cls(rank=dist.get_rank(), world=dist.get_world_size())

    @property
    def main(self) -> bool:
        return self.rank == 0

    def shard(self, n: int) -> tuple[int, int]:
        """This process's examples [start, stop) of a global batch of n."""
        if n % self.world:
            raise ValueError(f"batch_size: the global batch {n} does not split over {self.world} processes")
        per = n // self.world
        return self.rank * per, (self.rank + 1) * per

    def all_reduce_grads(self, params: list[torch.nn.Parameter]) -> None:
        """Sum gradients over processes; a parameter without a gradient anywhere keeps None."""
        if self.world == 1:
            return
        has = torch.tensor([p.grad is not None for p in params], dtype=torch.uint8)
        dist.all_reduce(has, op=dist.ReduceOp.MAX)
        grads = []
        for p, h in zip(params, has.tolist()):
            if h:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
                grads.append(p.grad)
        if not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        off = 0
        for g in grads:
            g.copy_(flat[off:off + g.numel()].view_as(g))
            off += g.numel()

    def sum(self, x: float) -> float:
        if self.world == 1:
            return x
        t = torch.tensor([x], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t.item()

    def sum_tensor(self, t: torch.Tensor) -> torch.Tensor:
        """A tensor summed over processes (a copy; the tensor itself when alone)."""
        if self.world == 1:
            return t
        out = t.clone()
        dist.all_reduce(out, op=dist.ReduceOp.SUM)
        return out

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def close(self) -> None:
        # every process reaches the barrier before any tears gloo down: a process that exits
        # while its peer is still in a collective aborts ("terminate called without an active exception")
        if self.world > 1 and dist.is_initialized():
            dist.barrier()
            dist.destroy_process_group()
