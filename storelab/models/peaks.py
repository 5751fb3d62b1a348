"""The peak memory of a run whose size the user sets, measured on the model before the run.

``check_run_fits`` (``storelab.models.memory_terms``) refuses what the config alone shows to be too
large: the weights, the cache at the requested length and one call's activations. That bound is a
floor: what a store keeps while it computes (masks, gathered entries, a selection probe's scores,
the logits of every position in a probe that scores them all) depends on its code, not on its
config. So the commands whose size the user gives (``generate --prompt-len``, ``probe mhc
--contexts``, ``probe selection --contexts``) run the very same work on the model at a few small
sizes first, measure the bytes its tensors hold at their peak (torch's profiler sees every CPU
allocation and free: exact, with no allocator in the way), fit how the peak grows with the size,
and read the fit at the size asked for:

* ``generate`` (prompt of T tokens in chunks of s, then m new tokens): the first call's peak g(s)
  grows at most quadratically with the chunk (a [s, s] score block, the logits of s positions), the
  later calls add what each entry of the cache costs, u + c s per token (the cache itself, and masks
  or scores of s queries by every entry); g is fitted on three unchunked prompts, u and c on two
  chunk sizes, and the estimate is ``g(s) + (T + m - s)(u + c s)``;
* ``probe mhc`` (n rows of C tokens, scored in one call, six times): quadratic in C, fitted on
  three small contexts with the same n;
* ``probe selection`` (prefill in chunks of 1,024, then the exact attention of the last queries
  over every entry, for every selecting layer at once): linear in C past the chunk, fitted on
  contexts of one, two and three chunks.

A fit whose curvature is negative (a transient that stops growing once a budget caps it) is read
as the line through its last two points, which lies above it. The estimate adds the weights, a
``MARGIN`` for what the allocator keeps beside the tensors, and is refused (naming the option)
where it passes half of this machine's memory. Measured against the process's peak resident
memory in ``tests/test_peaks.py``.

The resident peak follows the tensors' only where glibc's heap does not grow with the sum of
transients that grow inside a loop while something the loop keeps sits between them: the chunked
read of compressed attention (``storelab.stores.compressed``) once kept each chunk's output and
decoded the entries anew for every chunk, and ``probe mhc`` on the tiny DeepSeek-V4 held 1.46 GiB
resident at 8,192 tokens x 8 rows for 525 MiB of tensors. It now decodes once and fills one output
(787 MiB resident there; the estimate reads 1.41 GiB), held against the estimate in
``tests/test_peaks.py``.
"""

from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Any, Callable

import torch

MARGIN = 2.5             # resident memory over tensor bytes (glibc keeps freed blocks; up to 2.1x measured)
OVERHEAD = 96 << 20      # bytes held beside the tensors by one run (BLAS buffers, Python objects; ~70 MiB measured)
SKIP = 40                # a run no longer than the fits' sizes is measured only where the config's floor
                         # (run_bytes) times this passes the limit (peaks measured at most 10x that floor)
LARGE = 4096             # generate: prompt and new tokens past this are always measured first
PROMPTS = (64, 128, 256)  # unchunked calibration prompts (generate)
CHUNKS = (32, 64)         # chunk sizes whose per-entry cost gives u and c (generate)
CHUNKED_LENGTHS = (256, 512)
MHC_CONTEXTS = (128, 256, 512)


def allocation_peak(prof) -> int:
    """The largest running sum of the CPU allocation events one profiled span saw (bytes).

    Frees of blocks allocated before the span are not reported (the profiler cannot size
    them), so the sum only ever overstates what was held: an upper bound."""
    from torch._C._autograd import DeviceType

    events = [(e.start_ns(), -e.nbytes()) for e in prof.profiler.kineto_results.events()
              if e.name() == "[memory]" and e.device_type() == DeviceType.CPU]
    events.sort()  # by time; at equal times allocations (negated: first) before frees, an upper bound
    now = peak = 0
    for _, neg in events:
        now -= neg
        peak = max(peak, now)
    return peak


@contextmanager
def _quiet_stderr():
    """File descriptor 2 to /dev/null: the profiler's C++ side prints "profiler_start/stop" there."""
    import os
    import sys

    try:
        sys.stderr.flush()
        saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    except OSError:  # pragma: no cover - no descriptor 2 to quiet
        yield
        return
    os.dup2(null, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def tensor_peak(fn: Callable[[], Any]) -> int:
    """Bytes the tensors made by ``fn()`` hold at their peak (what it returns is dropped)."""
    from torch.profiler import ProfilerActivity, profile

    gc.collect()
    with _quiet_stderr(), torch.inference_mode(), \
            profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    peak = allocation_peak(prof)
    del prof
    gc.collect()  # the profiler's results sit in reference cycles
    return peak


def extrapolate(points: list[tuple[int, int]], x: int) -> float:
    """The peak at ``x`` from measured (size, bytes) points: the parabola through the last three, or,
    where it bends down (or there are two points), the line through the last two, which lies above it;
    never below the largest measurement."""
    pts = sorted(points)
    (x2, y2), (x3, y3) = pts[-2], pts[-1]
    slope = (y3 - y2) / (x3 - x2)
    line = y3 + max(0.0, slope) * (x - x3)
    if len(pts) >= 3:
        x1, y1 = pts[-3]
        curv = ((y3 - y2) / (x3 - x2) - (y2 - y1) / (x2 - x1)) / (x3 - x1)
        if curv > 0:
            quad = y3 + slope * (x - x3) + curv * (x - x3) * (x - x2)
            return max(quad, line, float(y3))
    return max(line, float(y3))


def weight_bytes(model) -> int:
    """Bytes of the model's parameters and buffers as held (already allocated: part of every peak)."""
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()] if t.device.type != "meta")


def estimate(model, tensors: float) -> int:
    """The resident peak a run reaches: weights, its tensors' peak with the margin, and the overhead."""
    return int(weight_bytes(model) + MARGIN * tensors + OVERHEAD)


def _prompt(model, T: int, batch: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(T)
    return torch.randint(0, model.cfg.vocab_size, (batch, T), generator=g)


def generate_tensors(model, *, prompt_len: int, new_tokens: int, chunk: int = 0) -> float:
    """Tensor bytes at the peak of ``generate`` (prompt of ``prompt_len`` in chunks of ``chunk``, 0 one
    call, then ``new_tokens``), fitted on small runs (see the module docstring)."""
    from storelab.models.model import generate

    def run(T: int, s: int) -> int:
        return tensor_peak(lambda: generate(model, _prompt(model, T), 2, chunk=s))

    T, m = prompt_len, new_tokens
    s = T if chunk <= 0 or chunk >= T else chunk
    g = [(x, run(x, 0)) for x in PROMPTS]
    if T + m <= PROMPTS[-1]:
        return float(max(y for _, y in g))
    first = extrapolate(g, s)
    if T + m - s <= 0:
        return first
    # per entry of the cache beyond the first chunk: u + c s, from two chunk sizes
    per = []
    for c in CHUNKS:
        a, b = (run(L, c) for L in CHUNKED_LENGTHS)
        per.append((c, max(0.0, (b - a) / (CHUNKED_LENGTHS[1] - CHUNKED_LENGTHS[0]))))
    (c1, p1), (c2, p2) = per
    c = max(0.0, (p2 - p1) / (c2 - c1))
    u = max(p1 - c * c1, p2 - c * c2, 0.0)
    return first + (T + m - s) * (u + c * s)


def fitted_tensors(run: Callable[[int], Any], sizes: tuple[int, ...], size: int) -> float:
    """Tensor bytes at the peak of ``run(size)``, fitted on ``run`` at ``sizes`` (measured directly where
    ``size`` is no larger than the first). The probes' fits (``storelab.probes``): mhc on contexts
    ``MHC_CONTEXTS`` with the same rows, selection on one, two and three chunks."""
    if size <= sizes[0]:
        return float(tensor_peak(lambda: run(size)))
    pts = [(x, tensor_peak(lambda x=x: run(x))) for x in sizes]
    return extrapolate(pts, size)


def gate(model, floor: int, measure: Callable[[], float], *, option: str, held: str, instead: str,
         large: bool = True) -> int | None:
    """Refuse a run whose peak passes half this machine's memory: at once where the config's ``floor``
    (``run_bytes``) does, after ``measure()`` (tensor bytes: ``generate_tensors`` or ``fitted_tensors``) where the run
    is ``large`` (past the sizes the fits run: a transient that grows with the square of the size could
    pass the limit however low the floor) or the floor is within ``SKIP`` of the limit; the estimate
    measured (bytes), None where none was needed."""
    from storelab.models.config import machine_bytes
    from storelab.models.memory_terms import human_bytes

    have = machine_bytes()
    if not have or (floor * SKIP <= have / 2 and not large):
        return None
    if floor > have / 2:
        raise ValueError(f"{option}: {held} of {model.cfg.name} hold at least {human_bytes(floor, unit='GiB')} "
                         f"(weights, cache and activations), more than half of this machine's "
                         f"{human_bytes(have, unit='GiB')}; {instead}")
    if any(p.device.type != "cpu" for p in model.parameters()):  # the profiler sees CPU memory; streamed: read per call
        return None
    return check_peak(model, measure(), option=option, held=held, instead=instead)


def check_peak(model, tensors: float, *, option: str, held: str, instead: str) -> int:
    """Refuse (ValueError naming ``option``) a run whose estimated resident peak passes half this
    machine's memory; return the estimate (bytes)."""
    from storelab.models.config import machine_bytes
    from storelab.models.memory_terms import human_bytes

    need, have = estimate(model, tensors), machine_bytes()
    if have and need > have / 2:
        raise ValueError(f"{option}: {held} of {model.cfg.name} reach about {human_bytes(need, unit='GiB')} at their "
                         f"peak (measured on short runs of the same work, then fitted), more than half of this "
                         f"machine's {human_bytes(have, unit='GiB')}; {instead}")
    return need
