"""Small C kernels, built on first use with the machine's C compiler and loaded with ctypes.

A few of the ops have a form whose work on a CPU is mostly per call and per element when written as
tensor operations (the delta rules with small states: ``storelab.ops.delta_step``). Their C source lies
in ``storelab/ops/kernels``; ``library(name)`` compiles ``kernels/<name>.c`` once per source, compiler
and machine into the cache folder and loads it. No torch headers and no build system: one call to
``cc``, under a second for these files, and the tensors cross as data pointers.

Where there is no C compiler, or it fails, ``library`` answers None and says why in ``unavailable``; the
callers then run their tensor form, which computes the same thing. ``STORELAB_COMPILED=0`` turns the
kernels off. The cache folder is ``$STORELAB_CACHE_DIR``, else ``$XDG_CACHE_HOME/storelab``, else
``~/.cache/storelab``, in a ``kernels`` folder of its own (where that cannot be written, a folder of
the user's in the temporary one); each library is written to a temporary name there and moved into
place, so two processes building at once never load half a file.

Flags: ``-O3 -march=native`` (the file is built where it runs) and ``-fopenmp-simd`` (the kernels'
``omp simd`` loops, no OpenMP runtime); no fast-math, so the arithmetic is IEEE's. ``$CC`` names
another compiler. The kernels in ``OPENMP`` also take ``-fopenmp`` and split their work between the
threads of the OpenMP runtime torch loaded (see ``OPENMP``); the others are split between threads by
their callers (``in_threads``).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import re
import shutil
import subprocess
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

__all__ = ["compiled_library", "compiled_unavailable", "in_threads"]

KERNELS = Path(__file__).parent / "kernels"
FLAGS = ("-O3", "-fopenmp-simd", "-shared", "-fPIC", "-std=c11")
ARCH_FLAGS = ("-march=native",)  # dropped (and the build retried) where the compiler does not know it
# Kernels that split their work between threads with OpenMP. Built with -fopenmp, they name libgomp.so.1, which
# binds to the copy torch loaded before them (the same runtime, so the threads that run torch's operations run
# theirs too, and none spins against another); where -fopenmp fails, they build without it and run on one thread.
OPENMP = ("delta_chunk", "decode_step", "matvec")

_lock = threading.Lock()
_loaded: dict[str, ctypes.CDLL | None] = {}
_why: dict[str, str] = {}


def storage_root() -> Path:
    """storelab's folder for what it builds and measures on this machine: ``$STORELAB_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/storelab``, else ``~/.cache/storelab`` (kernels, ``storelab.ops.tuning``'s plans)."""
    return _root(os.environ.get("STORELAB_CACHE_DIR"), os.environ.get("XDG_CACHE_HOME"))


@functools.lru_cache(maxsize=8)
def _root(root: str | None, xdg: str | None) -> Path:
    if root:
        return Path(root)
    return (Path(xdg) if xdg else Path.home() / ".cache") / "storelab"


def cache_dir() -> Path:
    """Where built kernels are kept (module docstring)."""
    return storage_root() / "kernels"


def _writable(folder: Path) -> Path:
    """``folder``, made if missing; where it cannot be written, a folder of this user's in the temporary one."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        if os.access(folder, os.W_OK):
            return folder
    except OSError:
        pass
    fallback = Path(tempfile.gettempdir()) / f"storelab-kernels-{os.getuid() if hasattr(os, 'getuid') else 0}"
    fallback.mkdir(mode=0o700, exist_ok=True)
    return fallback


def _compiler() -> str | None:
    cc = os.environ.get("CC") or "cc"
    return shutil.which(cc) or shutil.which("gcc") or shutil.which("clang")


def _sources(name: str) -> list[Path]:
    """The files a kernel is built from: ``<name>*.c`` / ``.h`` and the headers of this folder they include."""
    own = sorted(p for p in KERNELS.iterdir() if p.stem.startswith(name) and p.suffix in (".c", ".h"))
    included = {m for p in own for m in re.findall(r'#include "([^"/]+)"', p.read_text())}
    return own + sorted(KERNELS / h for h in included if (KERNELS / h).exists() and KERNELS / h not in own)


def _build(name: str) -> ctypes.CDLL:
    cc = _compiler()
    if cc is None:
        raise OSError("no C compiler (cc, gcc or clang) on PATH")
    source = KERNELS / f"{name}.c"
    version = subprocess.run([cc, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    key = hashlib.sha256()
    for p in _sources(name):
        key.update(p.name.encode() + p.read_bytes())
    extra = ("-fopenmp",) if name in OPENMP else ()
    key.update(repr((cc, version, FLAGS, extra, ARCH_FLAGS, platform.machine(), platform.node())).encode())
    out_dir = _writable(cache_dir())
    target = out_dir / f"{name}-{key.hexdigest()[:16]}.so"
    if not target.exists():
        fd, tmp = tempfile.mkstemp(prefix=f".{name}-", suffix=".so", dir=out_dir)
        os.close(fd)
        try:
            errors = ""
            for flags in ((*extra, *ARCH_FLAGS), ARCH_FLAGS, extra, ()) if extra else (ARCH_FLAGS, ()):
                run = subprocess.run([cc, *FLAGS, *flags, "-o", tmp, str(source), "-lm"], capture_output=True,
                                     text=True)
                if run.returncode == 0:
                    break
                errors = run.stderr.strip()[-400:]
            else:
                raise OSError(f"{cc} could not build {source.name}: {errors}")
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    return ctypes.CDLL(str(target))


def compiled_library(name: str, signatures: dict[str, tuple[list, object]]) -> ctypes.CDLL | None:
    """The kernel library ``kernels/<name>.c``, built on first use, its functions typed by ``signatures``
    (function name -> (argument types, result type or None)); None where it cannot be built or
    ``STORELAB_COMPILED=0`` (then ``compiled_unavailable(name)`` says why)."""
    if os.environ.get("STORELAB_COMPILED", "1") == "0":
        _why[name] = "turned off by STORELAB_COMPILED=0"
        return None
    with _lock:
        if name not in _loaded:
            try:
                lib = _build(name)
                for fn, (argtypes, restype) in signatures.items():
                    getattr(lib, fn).argtypes, getattr(lib, fn).restype = argtypes, restype
                _loaded[name] = lib
            except (OSError, AttributeError) as e:  # no compiler, a failed build, an unloadable file, a
                _loaded[name] = None                # function missing: the tensor form runs
                _why[name] = str(e)
        return _loaded[name]


def compiled_unavailable(name: str) -> str | None:
    """Why ``compiled_library(name)`` answered None (None if it has not, or was not asked)."""
    return _why.get(name)


def in_threads(fn: Callable[[int, int], object], n_items: int, threads: int) -> None:
    """fn(start, stop) over [0, n_items) cut into ``threads`` ranges run at once (a kernel's ctypes call lets
    go of the GIL, so the ranges run in parallel), the first in the calling thread and the others in a pool kept
    for the process; one thread calls fn(0, n_items) itself."""
    n = max(1, min(threads, n_items))
    if n == 1:
        fn(0, n_items)
        return
    cuts = [n_items * i // n for i in range(n + 1)]
    pool = _pool(n - 1)
    parts = [pool.submit(fn, cuts[i], cuts[i + 1]) for i in range(1, n)]
    fn(cuts[0], cuts[1])
    for part in parts:
        part.result()


_pools: dict[int, ThreadPoolExecutor] = {}


def _pool(workers: int) -> ThreadPoolExecutor:
    """A pool of ``workers`` threads kept for the process (making threads for every call cost more than
    the work of a call: 0.95 against 0.55 ms for one group of the chunked delta rule here)."""
    with _lock:
        pool = _pools.get(workers)
        if pool is None:
            pool = _pools[workers] = ThreadPoolExecutor(workers, thread_name_prefix="storelab-kernel")
        return pool
