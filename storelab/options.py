"""Command-line options that validate themselves, and the one way a command reports a bad input.

Every numeric option of every command is declared through ``count`` / ``integer`` / ``number`` /
``seed`` / ``int_list`` / ``force``: the range sits beside the option, and a value outside it is
refused by the parser before anything runs, with the option's name, as exit code 2
(``Invalid value for '--chunk': -4 is not in the range x>=0``). Floats must be finite (no ``nan``,
no ``inf``). Every command that builds and runs a model takes ``device()`` and ``dtype()``:
``--device cpu|cuda|cuda:N|auto`` (resolved by the parser: auto is cuda when torch sees one; cuda
asked for on a machine without it is refused, naming ``--device``) and ``--dtype fp32|bf16|fp16``
(default None: the checkpoint's own, as ``storelab.load`` reads it). ``user_errors()`` turns the ValueErrors raised inside a command (a config field, a
refused output) into ``error: <message>`` on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any, Iterator

import typer

__all__ = ["integer", "count", "cores", "number", "seed", "int_list", "force", "device", "dtype", "resolve_device", "DTYPES", "user_errors", "fail", "SEED_MAX"]

SEED_MAX = 2**63 - 2  # torch's generators take 64-bit seeds; commands also seed with seed + 1


def integer(default: Any, *names: str, help: str = "", min: int | None = None, max: int | None = None) -> Any:
    """An int option within [min, max] (either end open when None)."""
    return typer.Option(default, *names, help=help, min=min, max=max)


def count(default: Any, *names: str, help: str = "", zero: bool = False) -> Any:
    """A positive int option (``zero=True``: 0 allowed too, usually meaning 'the default')."""
    return typer.Option(default, *names, help=help, min=0 if zero else 1)


def cores(default: Any, *names: str, help: str = "") -> Any:
    """A count of threads or processes: 0 (the default) up to this machine's cores (``os.cpu_count()``); more
    would only contend, and a thousand torch threads end in a MemoryError."""
    import os

    return typer.Option(default, *names, help=help, min=0, max=os.cpu_count() or 1)


def _finite(name: str, above: float | None):
    def check(value):
        if isinstance(value, float) and not math.isfinite(value):
            raise typer.BadParameter(f"must be a finite number, got {value}", param_hint=f"'{name}'")
        if above is not None and value is not None and value <= above:
            raise typer.BadParameter(f"must be > {above:g}, got {value:g}", param_hint=f"'{name}'")
        return value

    return check


def number(default: Any, *names: str, help: str = "", min: float | None = None, max: float | None = None,
           min_open: bool = False) -> Any:
    """A finite float option within [min, max] (``min_open``: min itself excluded)."""
    return typer.Option(default, *names, help=help, min=None if min_open else min, max=max,
                        callback=_finite(names[0], min if min_open else None))


def seed(default: int = 0, *names: str, help: str = "Random seed.") -> Any:
    """A seed: an int in [0, SEED_MAX]."""
    return typer.Option(default, *(names or ("--seed",)), help=help, min=0, max=SEED_MAX)


MAX_LIST = 64  # values in one list option: each is a run of its own (a context length, a width)


def int_list(default: str, name: str, *, help: str = "", min: int = 1, max_items: int = MAX_LIST) -> Any:
    """A comma-separated list of ints, each >= min, at most ``max_items`` of them (each value is work of
    its own: 3,000 context lengths would run for days); the command receives a tuple of ints (declare
    the parameter ``str``: the parser reads text, this callback returns the tuple)."""
    def parse(value):
        if value is None or isinstance(value, tuple):
            return value
        items = [s.strip() for s in str(value).split(",") if s.strip()]
        if not items:
            raise typer.BadParameter("expected a comma-separated list of integers, got nothing", param_hint=f"'{name}'")
        if len(items) > max_items:
            raise typer.BadParameter(f"at most {max_items} values (each is a run of its own), got {len(items):,}",
                                     param_hint=f"'{name}'")
        out = []
        for s in items:
            try:
                v = int(s)
            except ValueError:
                raise typer.BadParameter(f"expected comma-separated integers, got {s!r} in {value!r}",
                                         param_hint=f"'{name}'") from None
            if v < min:
                raise typer.BadParameter(f"every value must be >= {min}, got {v}", param_hint=f"'{name}'")
            out.append(v)
        return tuple(out)

    return typer.Option(default, name, help=help, callback=parse)


def force() -> Any:
    """``--force``: the one way to write into a folder of another kind or over a file the command did not write."""
    return typer.Option(False, "--force", help="Write even into a folder of another kind, or over files this "
                                               "command did not write (they are lost).")


DTYPES = ("fp32", "bf16", "fp16")   # the names --dtype takes (storelab.checkpoint.loader.DTYPE_NAMES reads them)


def resolve_device(value: str, option: str = "--device") -> str:
    """``cpu``, ``cuda`` or ``cuda:N`` as asked, ``auto`` as cuda when torch sees a GPU (else cpu); a
    typer.BadParameter naming ``option`` for any other text, or for CUDA on a machine without it."""
    import re

    v = str(value).strip().lower()
    if v == "cpu":
        return v
    m = re.fullmatch(r"cuda(?::(\d+))?|auto", v)
    if m is None:
        raise typer.BadParameter(f"expected cpu, cuda, cuda:N or auto, got {value!r}", param_hint=f"'{option}'")
    import torch

    if v == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if not torch.cuda.is_available():
        built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "built without CUDA"
        raise typer.BadParameter(f"{value!r}: CUDA is not available here (torch {torch.__version__}, {built}); "
                                 f"give {option} cpu (or auto)", param_hint=f"'{option}'")
    if m.group(1) is not None and int(m.group(1)) >= torch.cuda.device_count():
        raise typer.BadParameter(f"{value!r}: this machine has {torch.cuda.device_count()} CUDA device(s), "
                                 f"numbered from 0", param_hint=f"'{option}'")
    return v


def device(default: str = "cpu") -> Any:
    """``--device``: where the model is built and run; the command receives the resolved name
    (``resolve_device``), never ``auto``."""
    return typer.Option(default, "--device", help="cpu, cuda, cuda:N, or auto (cuda when there is one).",
                        callback=lambda value: None if value is None else resolve_device(value))


def dtype() -> Any:
    """``--dtype``: the model's parameter dtype, one of ``DTYPES``; None (the default): the checkpoint's own
    (config.json's ``dtype``), fp32 for a model with random weights."""
    def check(value):
        if value is not None and value not in DTYPES:
            raise typer.BadParameter(f"expected one of {', '.join(DTYPES)}, got {value!r}", param_hint="'--dtype'")
        return value

    return typer.Option(None, "--dtype", help="fp32, bf16 or fp16 (default: the checkpoint's own; fp32 for "
                                              "random weights).", callback=check)


def fail(message: str) -> None:
    """Print ``error: message`` on stderr and exit with code 2."""
    from rich.markup import escape

    from storelab.console import err_console

    err_console.print(f"[red]error:[/red] {escape(str(message))}", soft_wrap=True)  # a path is never cut in two
    raise typer.Exit(2)


@contextmanager
def user_errors() -> Iterator[None]:
    """Within the block, a ValueError (a bad config field, a refused output) is the user's error: exit 2."""
    try:
        yield
    except ValueError as e:
        fail(str(e))

