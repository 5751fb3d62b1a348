"""Console and JSON output shared by the CLI, the report and training: a rich table for people, one JSON
document for machines. A neutral module: any layer may use it, it imports nothing of storelab."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any, Iterable

from rich.console import Console
from rich.table import Table

console = Console(stderr=False)
err_console = Console(stderr=True)


def clean(o: Any) -> Any:
    if isinstance(o, float) and (math.isnan(o) or math.isinf(o)):
        return None
    if isinstance(o, dict):
        return {str(k): clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [clean(v) for v in o]
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "item") and callable(o.item):
        return o.item()
    return o


def emit_json(data: Any) -> None:
    """Print one JSON document on stdout and nothing else."""
    sys.stdout.write(json.dumps(clean(data), indent=2))
    sys.stdout.write("\n")
    sys.stdout.flush()


def table(title: str, columns: list[str], rows: Iterable[Iterable[Any]]) -> Table:
    """A rich table. On a narrow terminal text wraps between words: no column is made narrower than its
    longest word (up to ``WORD``) where all of them fit in the width, and a column of numbers never is
    (so "5.12e+04" is not cut into "5.12e+0" above "4")."""
    raw = [list(r) for r in rows]
    cells = [[fmt(v) for v in r] for r in raw]
    longest, numeric = [], []
    for j in range(len(columns)):
        words = columns[j].split() + [w for r in cells if j < len(r) for w in r[j].split()]
        longest.append(min(WORD, max((len(w) for w in words), default=1)))
        numeric.append(all(isinstance(r[j], (int, float)) or r[j] is None for r in raw if j < len(r)))
    fits = sum(longest) + 3 * len(columns) + 1 <= console.width
    t = Table(title=title, show_lines=False, header_style="bold")
    for j, c in enumerate(columns):
        t.add_column(c, overflow="fold", min_width=longest[j] if fits or numeric[j] else None)
    for r in cells:
        t.add_row(*r)
    return t


WORD = 16  # the widest a column is kept for its longest word; longer words fold


def fmt(v: Any) -> str:
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 1e4 or abs(v) < 1e-3:
            return f"{v:.3g}"
        return f"{v:,.3f}".rstrip("0").rstrip(".")
    if isinstance(v, int):
        return f"{v:,}"
    return "" if v is None else str(v)
