"""Chunk sizes and blocking of the chunked delta rules, chosen by measurement on the CPU that runs them.

The best chunk of the chunked form depends on the machine: on one CPU C = 32 ran 20-25 % faster than
64, on the next (AVX-512, a larger cache) the tensor form's best group of chunks moved by 4x. So the ops'
``chunk_size=None`` (their default) asks ``chunk_plan`` here, which, the first time a form meets a
head shape, times the candidates on inputs of that shape and keeps the fastest:
    the C kernel (``kernels/delta_chunk.c``): C in ``CHUNKS``;
    the tensor form (where the kernel is not built): C in ``CHUNKS`` x the size of its groups of chunks in
    ``GROUPS`` (numbers per q-sized tensor of a group, ``delta.GROUP_FLOATS``).
A calibration is ``ROUNDS`` interleaved rounds over ``CAL_TOKENS`` tokens and 2 x threads heads, the best
round of each candidate compared (about 0.1 s for heads of 64, under a second for 256). The choices are
kept for the process and in a file per CPU (``tuning/<cpu>.json`` in ``compiled.storage_root()``, the CPU
named by its model, its caches, its core count and torch's version), so a machine calibrates once. Keys:
the form, the decay (per head or none, or per channel), K, V, dtype and threads.
A file that cannot be read or parsed is calibrated again and rewritten (it holds nothing but these
choices); one that cannot be written leaves the choices in the process only.

``STORELAB_TUNING=0`` turns calibration off: C = ``DEFAULT_CHUNK``, groups of ``delta.GROUP_FLOATS``.
A chunk size the caller passes is used as given. Training keeps its own chunk (``delta_train``): the
backward's best chunk is another question, left to its own measurement (docs/bench.md).
The chunk size changes the order of the sums, not the result: every candidate equals the per-token rule
to rounding (tests/test_ops_recurrent.py runs them all).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

import torch

from storelab.ops.compiled import storage_root

__all__ = ["ChunkPlan", "chunk_plan", "tuning_file", "DEFAULT_CHUNK"]

DEFAULT_CHUNK = 32
CHUNKS = (16, 32, 64)
GROUPS = (1 << 15, 1 << 17, 1 << 19)
CAL_TOKENS = 1024
ROUNDS = 3


class ChunkPlan(NamedTuple):
    chunk: int                # tokens per chunk
    group_floats: int | None  # the tensor form's group size (numbers per q-sized tensor); None for the kernel


_lock = threading.Lock()
_plans: dict[str, ChunkPlan] = {}
_loaded_from: Path | None = None


@functools.lru_cache(maxsize=1)
def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


@functools.lru_cache(maxsize=1)
def _caches() -> str:
    sizes = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            sizes.append(f"L{(index / 'level').read_text().strip()}{(index / 'type').read_text().strip()[0]}"
                         f"={(index / 'size').read_text().strip()}")
        except OSError:
            continue
    return ",".join(sizes)


@functools.lru_cache(maxsize=1)
def cpu_id() -> str:
    """This machine as the tuning file names it: its CPU model, caches and cores, and torch's version."""
    text = f"{_cpu_name()}|{_caches()}|{os.cpu_count()}|{torch.__version__}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def tuning_file() -> Path:
    """Where this CPU's choices are kept (module docstring)."""
    return _tuning_file(storage_root())


@functools.lru_cache(maxsize=8)
def _tuning_file(root: Path) -> Path:
    return root / "tuning" / f"{cpu_id()}.json"


def _load(path: Path) -> dict[str, ChunkPlan]:
    try:
        data = json.loads(path.read_text())
        plans = {k: ChunkPlan(int(v["chunk"]), None if v["group_floats"] is None else int(v["group_floats"]))
                 for k, v in data["plans"].items()}
        return {k: p for k, p in plans.items() if p.chunk >= 1 and (p.group_floats is None or p.group_floats >= 1)}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}


def _save(path: Path, plans: dict[str, ChunkPlan]) -> None:
    data = {"cpu": _cpu_name(), "caches": _caches(), "cores": os.cpu_count(), "torch": torch.__version__,
            "plans": {k: p._asdict() for k, p in sorted(plans.items())}}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tuning-", suffix=".json", dir=path.parent)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except OSError:
        pass  # the choices stay in this process


def _key(form: str, K: int, V: int, dtype: torch.dtype, threads: int, per_channel: bool) -> str:
    decay = "channel" if per_channel else "head"
    return f"{form}|decay={decay}|K={K}|V={V}|{str(dtype).removeprefix('torch.')}|threads={threads}"


def chunk_plan(form: str, K: int, V: int, dtype: torch.dtype, per_channel: bool) -> ChunkPlan:
    """The chunk (and for the tensor form its group size) for ``form`` ("kernel" or "tensor") at heads of K x V
    in ``dtype`` on torch's present thread count: kept, or calibrated now (module docstring)."""
    if os.environ.get("STORELAB_TUNING", "1") == "0":
        return ChunkPlan(DEFAULT_CHUNK, None)
    global _loaded_from
    threads = torch.get_num_threads()
    key = _key(form, K, V, dtype, threads, per_channel)
    with _lock:
        path = tuning_file()
        if _loaded_from != path:
            _plans.clear()
            _plans.update(_load(path))
            _loaded_from = path
        plan = _plans.get(key)
        if plan is None:
            plan = _plans[key] = calibrate(form, K, V, dtype, per_channel)
            _save(path, {**_load(path), **_plans})
        return plan


def _candidates(form: str) -> list[ChunkPlan]:
    if form == "kernel":
        return [ChunkPlan(c, None) for c in CHUNKS]
    return [ChunkPlan(c, g) for c in CHUNKS for g in GROUPS]


def calibrate(form: str, K: int, V: int, dtype: torch.dtype, per_channel: bool,
              tokens: int = CAL_TOKENS, rounds: int = ROUNDS) -> ChunkPlan:
    """Time each candidate plan of ``form`` on random inputs of this head shape; the fastest (best round)."""
    from storelab.ops import delta

    threads = torch.get_num_threads()
    H = 2 * threads
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(1, tokens, H, K, generator=gen, dtype=dtype)
    k = torch.nn.functional.normalize(torch.randn(1, tokens, H, K, generator=gen, dtype=dtype), dim=-1)
    v = torch.randn(1, tokens, H, V, generator=gen, dtype=dtype)
    g = torch.nn.functional.logsigmoid(torch.randn(1, tokens, H, *((K,) if per_channel else ()), generator=gen,
                                                   dtype=dtype)) * 0.1
    beta = torch.rand(1, tokens, H, generator=gen, dtype=dtype)
    scale = K ** -0.5

    def run(plan: ChunkPlan):
        if form == "kernel":
            out = delta._chunked_compiled(q, k, v, g, beta, scale, None, plan.chunk)
            if out is not None:
                return
        delta._chunked(q, k, v, g, beta, scale, None, plan.chunk, plan.group_floats)

    plans = _candidates(form)
    best = {p: float("inf") for p in plans}
    with torch.inference_mode():
        for p in plans:  # a first run of each, untimed (buffers, the kernel's build)
            run(p)
        for _ in range(rounds):
            for p in plans:
                t0 = time.perf_counter()
                run(p)
                best[p] = min(best[p], time.perf_counter() - t0)
    return min(plans, key=lambda p: (best[p], p.chunk != DEFAULT_CHUNK))
