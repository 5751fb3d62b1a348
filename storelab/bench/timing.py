"""Timing helpers: warm-up, then the median of repeated runs; the machine's matmul rate."""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch


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


def matmul_rate(n: int = 2048, dtype: torch.dtype = torch.float32, repeats: int = 5) -> float:
    """The machine's fp32 matrix-product rate in FLOP/s, measured now (2 n^3 per product)."""
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    t = time_fn(lambda: a @ b, repeats=repeats, warmup=1)
    return 2 * n**3 / t
