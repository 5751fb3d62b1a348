"""Reading a user's file as what it should be: a regular file checked before it is opened (a folder named
``config.json`` or a FIFO given as a model is refused, not waited on), JSON refused naming the file when it
is not UTF-8, not JSON, or nested deeper than Python's parser goes (a RecursionError otherwise).

    regular_file(path)   # ValueError naming it unless a regular file (missing: FileNotFoundError, as open)
    read_json(path)      # the parsed value, every failure a ValueError naming the file
"""

from __future__ import annotations

import json
import stat
from pathlib import Path
from typing import Any

__all__ = ["regular_file", "read_text", "read_json", "parse_json"]


def regular_file(path: str | Path) -> Path:
    """``path`` when it is a regular file (followed through links); a folder, a FIFO, a socket or a device
    is refused by name before anything opens it (a FIFO would block the read)."""
    path = Path(path)
    mode = path.stat().st_mode  # FileNotFoundError for a missing file, as open() gives
    if stat.S_ISDIR(mode):
        raise ValueError(f"{path}: a folder, not a file")
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise ValueError(f"{path}: {kind}, not a regular file (storelab reads files, not streams)")
    return path


def read_text(path: str | Path, what: str = "a text file") -> str:
    """The UTF-8 text of a regular file."""
    path = regular_file(path)
    try:
        return path.read_text()
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text (expected {what})") from None
    except OSError as e:
        raise ValueError(f"{path}: cannot read the file ({e.strerror})") from None


def parse_json(text: str, path: str | Path) -> Any:
    """``text`` parsed as JSON; malformed or too deeply nested JSON a ValueError naming ``path``."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON: {e}") from None
    except RecursionError:
        raise ValueError(f"{path}: JSON nested too deep to read (thousands of levels)") from None


def read_json(path: str | Path) -> Any:
    """The parsed JSON of a regular file, every failure a ValueError naming the file."""
    return parse_json(read_text(path, "JSON"), path)
