"""The model file format's small pieces: layer index lists and a TOML writer.

Layer lists (``at = ...`` in a model file): ``"all"``, an index (negative counts from
the end), a slice ``"start:stop:step"`` with Python's meaning over ``range(n_layers)``,
or a list of those. ``compact_indices`` writes runs of equal step back as slices.

TOML: the standard library reads it (``tomllib``); ``dumps_toml`` writes the subset a
model file uses (scalars, lists, tables, arrays of tables).

Types: ``check_types(table, cls)`` holds each value of a table to its config field's declared
type before the config is built: an ``int`` field takes an integer (not ``4.5``, not ``true``,
not ``"four"``), a ``float`` field a finite number, a ``bool`` field true or false, a ``str``
field a string, a ``tuple[int, ...]`` field a list of integers, and ``X | None`` also null.
"""

from __future__ import annotations

import functools
import json
import math
import types
import typing
from typing import Any

__all__ = ["expand_indices", "compact_indices", "dumps_toml", "check_types"]

_NAMES = {int: "an integer", float: "a finite number", bool: "true or false", str: "a string", dict: "a table"}


@functools.cache
def _hints(cls) -> dict[str, Any]:
    import dataclasses

    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.name in hints}


def _fits(v: Any, t: Any) -> bool:
    if t is Any:
        return True
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        return any(_fits(v, o) for o in typing.get_args(t))
    if t is type(None):
        return v is None
    if t is bool:
        return isinstance(v, bool)
    if t is int:
        return isinstance(v, int) and not isinstance(v, bool)
    if t is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if t is str:
        return isinstance(v, str)
    if t is tuple or typing.get_origin(t) is tuple:
        args = typing.get_args(t)
        if not isinstance(v, (list, tuple)):
            return False
        if args and args[-1] is not Ellipsis:  # tuple[int, int]: that many, each of its type
            return len(v) == len(args) and all(_fits(x, a) for x, a in zip(v, args))
        return all(_fits(x, args[0] if args else Any) for x in v)
    if t is dict or typing.get_origin(t) is dict:
        return isinstance(v, dict)
    return True  # a type this file format does not restrict


def _describe(t: Any) -> str:
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        opts = [o for o in typing.get_args(t) if o is not type(None)]
        return " or ".join(_describe(o) for o in opts) + " (or null: leave it out)"
    if typing.get_origin(t) is dict:
        return "a table"
    if t is tuple or typing.get_origin(t) is tuple:
        args = typing.get_args(t)
        if args and args[-1] is not Ellipsis:
            return "a list [" + ", ".join(_describe(a).removeprefix("an ").removeprefix("a ") for a in args) + "]"
        return "a list, each " + _describe(args[0]) if args else "a list"
    return _NAMES.get(t, getattr(t, "__name__", str(t)))


def check_types(table: dict[str, Any], cls, skip: tuple[str, ...] = ("kind",)) -> None:
    """Raise a ValueError naming the first field of ``table`` whose value is not of the type that
    ``cls`` (a config dataclass) declares for it; unknown keys are left to the config to name."""
    hints = _hints(cls)
    for k, v in table.items():
        if k in skip or k not in hints:
            continue
        if not _fits(v, hints[k]):
            shown = json.dumps(v) if isinstance(v, bool) or v is None else repr(v)  # as the file wrote it
            raise ValueError(f"{k}: must be {_describe(hints[k])}, got {shown}")


def expand_indices(spec: Any, n: int, where: str) -> list[int]:
    """``"all"``, an int, ``"a:b:c"`` (Python slice over range(n)) or a list of those -> indices."""
    items = spec if isinstance(spec, list) else [spec]
    if not items:
        raise ValueError(f"{where}: an empty list selects no layer")
    out: list[int] = []
    for it in items:
        if isinstance(it, bool):
            raise ValueError(f"{where}: expected an index or slice, got {it!r}")
        if isinstance(it, int):
            if not -n <= it < n:
                raise ValueError(f"{where}: layer index {it} out of range for {n} layers")
            out.append(it % n)
        elif isinstance(it, str) and it == "all":
            out.extend(range(n))
        elif isinstance(it, str) and ":" in it:
            parts = it.split(":")
            try:
                nums = [int(p) if p.strip() else None for p in parts]
                if len(nums) > 3 or (len(nums) == 3 and nums[2] == 0):
                    raise ValueError
                s = slice(*nums)
            except ValueError:
                raise ValueError(f"{where}: bad slice {it!r} (want 'start:stop:step', step not 0)") from None
            if nums[0] is not None and not -n <= nums[0] < n:
                raise ValueError(f"{where}: slice {it!r} starts at layer {nums[0]}, out of range for {n} layers")
            picked = range(n)[s]
            if not picked:
                raise ValueError(f"{where}: slice {it!r} selects no layer of {n}")
            out.extend(picked)
        else:
            raise ValueError(f"{where}: expected 'all', an index, a slice 'start:stop:step' or a list, got {it!r}")
    return out


def compact_indices(idx: list[int], n: int) -> Any:
    """Inverse of ``expand_indices``: runs of equal step become slices."""
    if len(idx) == n and idx == list(range(n)):
        return "all"
    out: list[Any] = []
    i = 0
    while i < len(idx):
        j = i + 1
        if j < len(idx):
            step = idx[j] - idx[i]
            while j + 1 < len(idx) and idx[j + 1] - idx[j] == step:
                j += 1
            if j - i >= 2 and step > 0:
                stop = idx[j] + 1
                out.append(f"{idx[i]}:{stop}" if step == 1 else f"{idx[i]}:{stop}:{step}")
                i = j + 1
                continue
        out.append(idx[i])
        i += 1
    return out[0] if len(out) == 1 else out


# -- TOML -------------------------------------------------------------------
def _key(k: str) -> str:
    return k if k.replace("_", "").replace("-", "").isalnum() else json.dumps(k)


def _val(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)  # JSON string escapes are valid TOML basic strings
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_val(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_val(x)}" for k, x in v.items()) + " }"
    if v is None:
        raise ValueError("TOML has no null: drop the key instead")
    raise ValueError(f"cannot write {type(v).__name__} as TOML")


def dumps_toml(d: dict[str, Any]) -> str:
    """TOML text for a dict of scalars, lists, tables and arrays of tables (None values dropped)."""
    lines: list[str] = []

    def table(prefix: str, t: dict[str, Any], header: str | None) -> None:
        if header is not None:
            lines.append("")
            lines.append(header)
        subs = []
        for k, v in t.items():
            if v is None:
                continue
            if isinstance(v, dict):
                subs.append((k, v))
            elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
                subs.append((k, v))
            else:
                lines.append(f"{_key(k)} = {_val(v)}")
        for k, v in subs:
            name = f"{prefix}{_key(k)}"
            if isinstance(v, dict):
                table(name + ".", v, f"[{name}]")
            else:
                for item in v:
                    table(name + ".", item, f"[[{name}]]")

    table("", d, None)
    return "\n".join(lines).lstrip("\n") + "\n"
