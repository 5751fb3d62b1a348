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
    t = Table(title=title, show_lines=False, header_style="bold")
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*[fmt(v) for v in r])
    return t


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
