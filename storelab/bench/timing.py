"""Timing helpers: warm-up, then the median of repeated runs; the machine's matmul rate.

On a shared machine a single timing means little. ``compare`` runs several
functions in rounds (one call of each per round, in turn), so that whatever else
the machine is doing at a given moment falls on all of them alike; the ratio of
their medians is then the figure to read. ``matmul_rate`` is the machine's own
fp32 matrix-product rate, the yardstick for "what fraction of this machine".
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["Timing", "time_fn", "compare", "matmul_rate", "matmul_fn", "read_rate"]


@dataclass(frozen=True)
class Timing:
    """Seconds per call: median and minimum over ``n`` timed calls."""

    median: float
    best: float
    n: int

    def as_dict(self) -> dict[str, float | int]:
        return {"median_s": self.median, "best_s": self.best, "n": self.n}


def time_fn(fn: Callable[[], object], *, repeats: int = 5, warmup: int = 1, min_time: float = 0.0) -> float:
    """Median wall time in seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs."""
    with torch.inference_mode():
        for _ in range(warmup):
            fn()
        times = []
        t_start = time.perf_counter()
        while len(times) < repeats or (time.perf_counter() - t_start) < min_time:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
            if len(times) >= 50:
                break
    return statistics.median(times)


def compare(fns: dict[str, Callable[[], object]], *, repeats: int = 5, warmup: int = 1,
            budget_s: float | None = None, inference: bool = True) -> dict[str, Timing]:
    """Time several functions in interleaved rounds; one ``Timing`` per name.

    Each round calls every function once, in the given order. ``budget_s`` stops
    adding rounds once that much time has passed (after at least two rounds), so a
    slow peer cannot make a run take minutes. ``inference=False`` runs them with autograd
    recording (the training benches); otherwise under ``torch.inference_mode``.
    """
    times: dict[str, list[float]] = {name: [] for name in fns}
    with torch.inference_mode(inference):
        for _ in range(warmup):
            for fn in fns.values():
                fn()
        t_start = time.perf_counter()
        for r in range(repeats):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
            if budget_s is not None and r >= 1 and time.perf_counter() - t_start > budget_s:
                break
    return {name: Timing(statistics.median(ts), min(ts), len(ts)) for name, ts in times.items()}


def matmul_fn(n: int = 2048, dtype: torch.dtype = torch.float32) -> tuple[Callable[[], object], float]:
    """A square matrix product to time, and its FLOPs (2 n^3)."""
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    return (lambda: a @ b), 2.0 * n**3


def matmul_rate(n: int = 2048, dtype: torch.dtype = torch.float32, repeats: int = 5) -> float:
    """The machine's fp32 matrix-product rate in FLOP/s, measured now (2 n^3 per product)."""
    fn, flops = matmul_fn(n, dtype)
    return flops / time_fn(fn, repeats=repeats, warmup=1)


def read_rate(nbytes: int = 512 * 2**20, repeats: int = 5) -> float:
    """The machine's rate of reading memory in bytes/s, measured now on torch's threads: the best of ``repeats``
    sums of an fp32 buffer of ``nbytes`` (larger than the caches of the machines seen, so read from memory; the
    best, not the median: a decode step's limit is the fastest the memory gives). A decode step reads every weight
    once, so its time is bounded below by its bytes over this rate."""
    x = torch.ones(max(1, nbytes // 4))
    x.sum()
    best = float("inf")
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        x.sum()
        best = min(best, time.perf_counter() - t0)
    return x.numel() * 4 / best
