"""Command-line options that validate themselves, and the one way a command reports a bad input.

Every numeric option of every command is declared through ``count`` / ``integer`` / ``number`` /
``seed`` / ``int_list`` / ``force``: the range sits beside the option, and a value outside it is
refused by the parser before anything runs, with the option's name, as exit code 2
(``Invalid value for '--chunk': -4 is not in the range x>=0``). Floats must be finite (no ``nan``,
no ``inf``). ``user_errors()`` turns the ValueErrors raised inside a command (a config field, a
refused output) into ``error: <message>`` on stderr and exit code 2, never a traceback.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any, Iterator

import typer

__all__ = ["integer", "count", "number", "seed", "int_list", "force", "user_errors", "fail", "SEED_MAX"]

SEED_MAX = 2**63 - 2  # torch's generators take 64-bit seeds; commands also seed with seed + 1


def integer(default: Any, *names: str, help: str = "", min: int | None = None, max: int | None = None) -> Any:
    """An int option within [min, max] (either end open when None)."""
    return typer.Option(default, *names, help=help, min=min, max=max)


def count(default: Any, *names: str, help: str = "", zero: bool = False) -> Any:
    """A positive int option (``zero=True``: 0 allowed too, usually meaning 'the default')."""
    return typer.Option(default, *names, help=help, min=0 if zero else 1)


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


def int_list(default: str, name: str, *, help: str = "", min: int = 1) -> Any:
    """A comma-separated list of ints, each >= min; the command receives a tuple of ints (declare the
    parameter ``str``: the parser reads text, this callback returns the tuple)."""
    def parse(value):
        if value is None or isinstance(value, tuple):
            return value
        items = [s.strip() for s in str(value).split(",") if s.strip()]
        if not items:
            raise typer.BadParameter("expected a comma-separated list of integers, got nothing", param_hint=f"'{name}'")
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

