"""``storelab bench dist``: what each process holds, and a step's time, under DDP against FSDP2.

``bench_dist()`` launches ``torchrun --standalone --nproc-per-node N`` once per engine; each
process runs ``python -m storelab.bench.dist`` (``worker``): a few steps of the training loop
(``storelab.train.loop.train``, fp32, the same global batch), then counts, from its *local*
tensors, the bytes it holds: parameters (a DTensor counts its local shard), their gradients and
AdamW's state (``exp_avg``, ``exp_avg_sq``, ``step``). These are analytic (sums of
``numel * element_size``), not the process's resident memory: activations, communication buffers
and the allocator are left out. Step time: the median of the timed steps (after one warm-up step)
as seen by rank 0, between consecutive calls of the loop's ``on_step``.

The default model, a built-in attention stack of d_model 512, 12 layers, 8 heads of 64 and a
SwiGLU of 2,048 (``resolve_model``), has about 50M parameters on the tiny MQAR task's vocabulary.
Under DDP every process holds all of them (Li et al., arXiv 2006.15704); under FSDP2 each holds
1/N of every parameter, gradient and AdamW moment (Zhao et al., arXiv 2304.11277).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

MODEL_50M = dict(d_model=512, n_layers=12, n_heads=8, head_dim=64, d_ff=2048)
QUICK_MODEL = dict(d_model=32, n_layers=2, n_heads=2, head_dim=16, d_ff=64)


def _local_bytes(t: torch.Tensor | None) -> int:
    from torch.distributed.tensor import DTensor

    if t is None or not torch.is_tensor(t):
        return 0
    local = t.to_local() if isinstance(t, DTensor) else t  # a DTensor's shard on this process
    return local.numel() * local.element_size()


def worker(parallel: str, model_options: dict[str, Any], steps: int, batch_size: int) -> dict[str, Any] | None:
    """Inside a torchrun process: train ``steps`` steps, count the local bytes; rank 0 returns the row."""
    import torch.distributed as dist

    from storelab.train.distributed import Dist
    from storelab.train.loop import TrainConfig, train

    d = Dist.from_env()
    stamps: list[float] = []
    cfg = TrainConfig(model="attention", model_options=model_options, task="mqar", task_preset="tiny",
                      steps=steps + 1, batch_size=batch_size, warmup=1, parallel=parallel, threads=1,
                      eval_every=10**6, eval_examples=d.world, checkpoint_every=10**6, log_every=10**6)
    t0 = time.perf_counter()
    res = train(cfg, dist=d, on_step=lambda done, row: stamps.append(time.perf_counter()))
    times = [b - a for a, b in zip([t0] + stamps, stamps)][1:]  # the first step warms up
    held = {"params": sum(_local_bytes(p) for p in res.model.parameters()),
            "grads": sum(_local_bytes(p.grad) for p in res.model.parameters()),
            "optimizer": sum(_local_bytes(v) for st in res.optimizer.state.values() for v in st.values())}
    rows = [None] * d.world
    if d.world > 1:
        dist.all_gather_object(rows, held)
    else:
        rows = [held]
    d.close()
    if not d.main:
        return None
    n = sum(p.numel() for p in res.model.parameters())
    return {"parallel": res.parallel, "processes": d.world, "parameters": n, "per_process": rows,
            "step_s": statistics.median(times) if times else None, "steps_timed": len(times),
            "batch_size": batch_size}


def bench_dist(*, nproc: int = 2, model_options: dict[str, Any] | None = None, steps: int = 3, batch_size: int = 8,
               engines: tuple[str, ...] = ("ddp", "fsdp"), quick: bool = False) -> dict[str, Any]:
    """One torchrun launch per engine; the rows of rank 0 (bytes per process, step time)."""
    opts = model_options or (QUICK_MODEL if quick else MODEL_50M)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    rows = []
    for par in engines:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
               "-m", "storelab.bench.dist", par, json.dumps(opts), str(steps), str(batch_size)]
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=3600)
        if r.returncode != 0:
            rows.append({"parallel": par, "error": r.stderr.strip().splitlines()[-1:] or ["failed"]})
            continue
        rows.append(json.loads(r.stdout.strip().splitlines()[-1]))
    return {"model": {"stack": "attention", **opts}, "nproc": nproc, "rows": rows}


if __name__ == "__main__":  # one torchrun process of bench_dist
    par, opts, steps, batch = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    row = worker(par, opts, steps, batch)
    if row is not None:
        print(json.dumps(row))
    from storelab.train.distributed import Dist

    Dist(world=int(os.environ.get("WORLD_SIZE", "1"))).exit()  # the group is closed; see Dist.exit
