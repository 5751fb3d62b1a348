"""The model file format's small pieces: layer index lists and a TOML writer.

Layer lists (``at = ...`` in a model file): ``"all"``, an index (negative counts from
the end), a slice ``"start:stop:step"`` with Python's meaning over ``range(n_layers)``,
or a list of those. ``compact_indices`` writes runs of equal step back as slices.

TOML: the standard library reads it (``tomllib``); ``dumps_toml`` writes the subset a
model file uses (scalars, lists, tables, arrays of tables).
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["expand_indices", "compact_indices", "dumps_toml"]


def expand_indices(spec: Any, n: int, where: str) -> list[int]:
    """``"all"``, an int, ``"a:b:c"`` (Python slice over range(n)) or a list of those -> indices."""
    items = spec if isinstance(spec, list) else [spec]
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
                if len(nums) > 3:
                    raise ValueError
                s = slice(*nums)
                out.extend(range(n)[s])
            except ValueError:
                raise ValueError(f"{where}: bad slice {it!r} (want 'start:stop:step')") from None
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
