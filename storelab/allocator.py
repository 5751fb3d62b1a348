"""Keep freed memory in the process: the CPU training loop's page faults.

PyTorch's CPU allocator is the C library's ``malloc``. glibc serves a large block (above its mmap
threshold, 128 KiB to start, raised up to 32 MiB by what has been freed) with a fresh ``mmap`` and
unmaps it on ``free``; below that, freed memory at the heap's top beyond the trim threshold goes back
to the system too. Either way the next tensor of that size starts on pages the kernel must fault in
and zero, one 4 KiB page at a time. A training step makes and frees hundreds of megabytes of
activations and gradients, so every step faults them all in again: measured here (Gated DeltaNet
forward + backward, B=1, T=4,096, 8 heads of 64, one thread) 40,000 minor faults per step, a fifth to
a third of the step's time on this machine; with the settings below, none after the first step.

``keep_freed_memory()`` sets glibc's mmap threshold to its largest value (32 MiB: blocks up to that
size come from the heap) and the trim threshold out of reach (freed heap memory is kept for the next
step), what the CUDA caching allocator does for GPU memory. The cost: the process's resident size
stays at its peak rather than shrinking between steps. The training loop (``storelab.train.train``,
so ``storelab train`` and the report's trained hybrids), its step-time calibration, ``storelab
bench``, ``storelab generate`` and ``storelab probe`` call it; a script that trains through the library can
call it once. Inference has the same faults: a SmolLM2-135M prefill of 1,024 tokens in chunks of 512 (one
thread, 2026-12-07) took 180,000-200,000 minor faults each time, none after the first with these settings. It changes nothing
(and answers False) where the C library is not glibc, and the environment variable
``STORELAB_KEEP_FREED_MEMORY=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

__all__ = ["keep_freed_memory"]

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest (HEAP_MAX_SIZE / 2 on 64-bit)
TRIM_THRESHOLD = (1 << 31) - 1  # an int: mallopt takes one


def keep_freed_memory() -> bool:
    """Set glibc's malloc to keep freed memory for reuse (module docstring); True when it took effect."""
    if os.environ.get("STORELAB_KEEP_FREED_MEMORY", "1") == "0":
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
        libc.gnu_get_libc_version  # glibc only: other C libraries' mallopt differ or lack these parameters
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
