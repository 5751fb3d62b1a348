"""Output safety: no command loses a user's file.

Every command that writes a folder says, before any work starts, which kind of folder it writes
(``check_folder(path, kind, files, force=...)``), and writes each file atomically
(``atomic_write`` / ``atomic_path``: a temporary file in the same folder, then ``os.replace``), so a
kill at any moment leaves the old file or the new one, never half of one.

The kinds, and how each is known from the files the command itself writes (its markers):

==========  ===============================================  =========================================
kind        written by                                       known by
==========  ===============================================  =========================================
save        ``storelab save`` / ``storelab.save``            config.json with model_type "storelab"
run         ``storelab train --out``                         checkpoint.json (the DCP checkpoint's
                                                             pointer), a step-<8 digits> folder of
                                                             DCP files only (``is_step_folder``),
                                                             checkpoint.safetensors (an older run),
                                                             or a config.json with "train_config"
hf          (a Hugging Face model folder, never written)      any other config.json, *.safetensors,
                                                             *.bin, tokenizer files
report      ``storelab report``                              report.json or report.html
recall      ``storelab recall``                              recall.json
capacity    ``storelab capacity --plot``                     capacity.json
probe       ``storelab probe --out``                         probe.json
subjects    ``storelab subjects train --out``                subjects.json (the index of the trained
                                                             subjects beside their safetensors)
==========  ===============================================  =========================================

The rule: a folder of the command's own kind is its to rewrite (a resumed run, a report built
again); an empty or missing folder is created; a folder of another kind is refused; in a folder
of no known kind (a user's own) the command adds its files but refuses to replace one it did not
write. ``force=True`` (the commands' ``--force``) is the one way past a refusal. Each refusal is an
``OutputError`` (a ValueError) naming the option, the folder and the file.

What a command clears is checked the same way: a run folder's ``step-*`` folders are removed on the
next checkpoint, so ``check_folder(..., "run")`` refuses a ``step-*`` entry that holds anything but
DCP's files (a user's file kept there), and ``storelab.train.checkpoint`` removes only folders that
``is_step_folder`` recognises. An output is never placed inside one of the command's own inputs, nor
an input inside the output folder (``inputs=``: ``export RUN RUN/step-00000002`` is refused, since the
run's next checkpoint would clear it). A single file with a JSON beside it (``memory --plot --out
mine.png`` writes mine.png and mine.json) is checked as a pair by ``check_files``: both are the
command's to rewrite when the JSON says it wrote them (``"command"``), else each existing one is
refused unless ``force``.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

__all__ = ["OutputError", "KINDS", "folder_kind", "is_step_folder", "check_folder", "check_file", "check_files",
           "check_apart", "atomic_write", "atomic_path"]

KINDS = {
    "save": "a storelab save (config.json with model_type 'storelab')",
    "run": "a storelab train run (checkpoint.json)",
    "hf": "a Hugging Face model folder",
    "report": "a storelab report folder (report.json)",
    "recall": "a storelab recall folder (recall.json)",
    "capacity": "a storelab capacity folder (capacity.json)",
    "probe": "a storelab probe folder (probe.json)",
    "subjects": "a storelab subjects folder (subjects.json)",
}
STEP_FOLDER = re.compile(r"step-\d{8}(\.tmp)?")
DCP_FILE = re.compile(r"\.metadata(\.tmp)?|__\d+(_\d+)?\.(distcp|metadata)(\.tmp)?")  # what dcp.save writes
HF_MARKERS = ("*.safetensors", "*.bin", "*.pt", "*.pth", "*.gguf", "tokenizer.json", "tokenizer_config.json",
              "generation_config.json", "model.safetensors.index.json")


class OutputError(ValueError):
    """An output the command must not write; the message names the option, the folder and the file."""


def _config_json(folder: Path) -> dict | None:
    p = folder / "config.json"
    if not p.is_file():
        return None
    try:
        d = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}  # a config.json of someone else's, unreadable to us
    return d if isinstance(d, dict) else {}


def folder_kind(folder: str | Path) -> str | None:
    """The kind of an existing folder (a key of ``KINDS``), ``"empty"``, ``"other"`` (a folder with files
    of no known kind), or None when nothing is there."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    try:
        names = {p.name for p in folder.iterdir()}
    except OSError:
        return "other"
    if not names:
        return "empty"
    if "report.json" in names or "report.html" in names:
        return "report"
    if "checkpoint.json" in names or "checkpoint.safetensors" in names:
        return "run"
    if "subjects.json" in names:
        return "subjects"
    if any(is_step_folder(folder / n) for n in names):
        return "run"  # a run killed while writing its first checkpoint (a DCP step folder, no pointer yet)
    cfg = _config_json(folder)
    if cfg is not None:
        if cfg.get("model_type") == "storelab":
            return "save"
        if "train_config" in cfg:
            return "run"
        return "hf"
    if any(next(folder.glob(m), None) is not None for m in HF_MARKERS):
        return "hf"
    if "recall.json" in names:
        return "recall"
    if "capacity.json" in names:
        return "capacity"
    if "probe.json" in names:
        return "probe"
    return "other"


def is_step_folder(path: str | Path) -> bool:
    """Whether ``path`` is a checkpoint step folder as ``storelab train`` writes it: named
    ``step-<8 digits>`` (``.tmp`` while written) and holding DCP's files only (or nothing yet).
    Only such a folder is the run's to remove; a user's file kept in one makes it the user's."""
    path = Path(path)
    if not STEP_FOLDER.fullmatch(path.name) or path.is_symlink() or not path.is_dir():
        return False
    try:
        return all(DCP_FILE.fullmatch(p.name) and p.is_file() and not p.is_symlink() for p in path.iterdir())
    except OSError:
        return False


def _inside(inner: Path, outer: Path) -> bool:
    inner, outer = inner.resolve(), outer.resolve()
    return inner == outer or outer in inner.parents


def check_apart(out: str | Path, inputs: Iterable[str | Path | None], *, option: str = "--out",
                folder: bool = True) -> None:
    """Refuse an output at, or inside, one of the command's inputs (a folder it reads), and (when the
    output is a ``folder`` the command writes or clears) an input inside the output."""
    out = Path(out)
    for src in inputs:
        if src is None:
            continue
        src = Path(src)
        if _inside(out, src):
            where = "is" if out.resolve() == src.resolve() else f"is inside {src},"
            raise OutputError(f"{option}: {out} {where} an input of this command: write the output to another "
                              f"folder, outside it")
        if folder and _inside(src, out):
            raise OutputError(f"{option}: {out} holds {src}, an input of this command: write the output to "
                              f"another folder")


def _writable_parent(path: Path, option: str) -> None:
    """The nearest existing ancestor of ``path`` must be a folder this process may write in."""
    p = path.absolute()
    while not p.exists():
        if p.parent == p:
            break
        p = p.parent
    if not p.is_dir():
        raise OutputError(f"{option}: cannot create {path}: {p} is a file, not a folder")
    if not os.access(p, os.W_OK | os.X_OK):
        raise OutputError(f"{option}: cannot write {path}: {p} is not writable")


def check_folder(folder: str | Path, kind: str, files: Iterable[str] = (), *, force: bool = False,
                 option: str = "--out", inputs: Iterable[str | Path | None] = ()) -> Path:
    """Say whether ``folder`` may receive the files of a ``kind`` folder; raise ``OutputError`` if not.

    ``files`` are the names (or glob patterns) the command will write there; ``inputs`` the files and
    folders it reads (``check_apart``). Nothing is created: the check runs before the work, the writes
    after it."""
    if kind not in KINDS:
        raise ValueError(f"kind: one of {', '.join(KINDS)}, got {kind!r}")
    folder = _check_kind(Path(folder), kind, files, force=force, option=option)
    check_apart(folder, inputs, option=option)
    return folder


def _check_kind(folder: Path, kind: str, files: Iterable[str], *, force: bool, option: str) -> Path:
    if folder.exists() and not folder.is_dir():
        raise OutputError(f"{option}: {folder} is a file, not a folder (give a folder to write into)")
    if not folder.exists():
        _writable_parent(folder, option)
        return folder
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputError(f"{option}: cannot write into {folder}: the folder is not writable")
    have = folder_kind(folder)
    if force or have == "empty":
        return folder
    if have == kind == "run":  # the next checkpoint replaces the pointer and removes every step folder but its own
        for name in ("checkpoint.json", "config.json"):
            p = folder / name
            if p.is_symlink() or (p.exists() and not p.is_file()):
                raise OutputError(f"{option}: {p} is not a file this command wrote (a link or a folder): "
                                  f"refusing to replace it (move it, or --force)")
        theirs = sorted(p.name for p in folder.glob("step-*") if not is_step_folder(p))
        if theirs:
            raise OutputError(f"{option}: {folder / theirs[0]} holds files this command did not write, and the "
                              f"run's next checkpoint would remove it (move them, or --force to lose them)")
    if have == kind:
        return folder
    if have in KINDS:
        raise OutputError(f"{option}: {folder} is {KINDS[have]}, not {KINDS[kind]}: refusing to write into it "
                          f"(choose another folder, or --force to write anyway)")
    clash = sorted({p.name for pat in files for p in folder.glob(pat)})
    if clash:
        raise OutputError(f"{option}: {folder / clash[0]} exists and was not written by this command: refusing to "
                          f"replace it (choose another folder, or --force to overwrite)")
    return folder


def check_file(path: str | Path, *, force: bool = False, option: str = "--out") -> Path:
    """Say whether the file ``path`` may be written: not a folder, in a writable place, and not an
    existing file unless ``force``."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{option}: {path} is a folder, not a file name")
    if path.exists() and not force:
        raise OutputError(f"{option}: {path} exists: refusing to replace it (another name, or --force)")
    _writable_parent(path.parent if str(path.parent) else Path("."), option)
    return path


def check_files(paths: Iterable[str | Path], command: str, *, force: bool = False, option: str = "--out") -> None:
    """Say whether the files ``paths`` may be written together, the last one a JSON that records
    ``"command": command``: when that JSON exists and says so, every file is the command's own (a
    plot drawn again); else each one that exists is refused unless ``force``."""
    paths = [Path(p) for p in paths]
    for p in paths:
        if p.is_dir():
            raise OutputError(f"{option}: {p} is a folder, not a file name")
        _writable_parent(p.parent if str(p.parent) else Path("."), option)
    if force:
        return
    try:
        own = json.loads(paths[-1].read_text()).get("command") == command
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        own = False
    if own:
        return
    for p in paths:
        if p.exists() or p.is_symlink():
            also = f" (the command writes {', '.join(str(q) for q in paths)})" if len(paths) > 1 else ""
            raise OutputError(f"{option}: {p} exists and was not written by this command: refusing to replace "
                              f"it{also} (another name, or --force)")


@contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """A temporary path beside ``path`` (same suffix, so writers that go by it still do) to write into;
    on success it replaces ``path`` atomically, on failure it is removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=f".tmp{path.suffix}", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_write(path: str | Path, data: str | bytes) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` atomically; return the path."""
    raw = data.encode() if isinstance(data, str) else data
    with atomic_path(path) as tmp:
        tmp.write_bytes(raw)
    return Path(path)


def _umask() -> int:
    cur = os.umask(0)
    os.umask(cur)
    return cur
