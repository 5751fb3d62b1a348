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

The kind says only which command a folder is for; which files are the command's to replace is
proven by content, never by a name. Every file written through ``atomic_path`` / ``atomic_write``
is recorded with its sha256 in the folder's manifest, ``.storelab-manifest.json`` (``MANIFEST``:
``{"format": "storelab-manifest-1", "files": {name: sha256}}``, updated under a lock on the folder,
so processes writing into one folder at once keep every entry). A file is the command's own
(``owned``) only when the manifest of its folder lists it with the hash it has now; a folder is,
when every file in it is. A ``step-*`` folder of a run is the run's when it holds DCP's files only
(``is_step_folder``: DCP writes them, not ``atomic_path``).

The rule: a folder of the command's own kind is its to rewrite (a resumed run, a report built
again) when every file it would replace or remove is its own; an empty or missing folder is
created; a folder of another kind is refused; in a folder of no known kind (a user's own) the
command adds its files but refuses to replace one it did not write. A marker file the user made
(``report.html`` in a folder of theirs) therefore protects itself, and a folder written by a
storelab older than the manifest is refused, saying so. ``force=True`` (the commands' ``--force``)
is the one way past a refusal; a run's ``--fresh`` is not. Each refusal is an ``OutputError`` (a
ValueError) naming the option, the folder and the file.

What a command clears is checked the same way: a run folder's ``step-*`` folders are removed on the
next checkpoint, so ``check_folder(..., "run")`` refuses a ``step-*`` entry that holds anything but
DCP's files (a user's file kept there), and ``storelab.train.checkpoint`` removes only folders that
``is_step_folder`` recognises. An output is never placed inside one of the command's own inputs, nor
an input inside the output folder (``inputs=``: ``export RUN RUN/step-00000002`` is refused, since the
run's next checkpoint would clear it). A single file with a JSON beside it (``memory --plot --out
mine.png`` writes mine.png and mine.json) is checked as a pair by ``check_files``: both are the
command's to rewrite when the manifest lists each of them as it is now, else each existing one is
refused unless ``force``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import re
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

__all__ = ["OutputError", "KINDS", "MANIFEST", "folder_kind", "is_step_folder", "owned", "check_folder", "check_file",
           "check_files", "check_apart", "atomic_write", "atomic_path"]

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
MANIFEST = ".storelab-manifest.json"  # the files storelab wrote into a folder, with their sha256
MANIFEST_FORMAT = "storelab-manifest-1"
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
        names = {p.name for p in folder.iterdir()} - {MANIFEST}
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


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _manifest(folder: Path) -> dict[str, str] | None:
    """The files the manifest of ``folder`` lists (name -> sha256), or None when it has none (or one that
    is not a storelab manifest)."""
    p = folder / MANIFEST
    if p.is_symlink() or not p.is_file():
        return None
    try:
        d = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    files = d.get("files") if isinstance(d, dict) and d.get("format") == MANIFEST_FORMAT else None
    if not isinstance(files, dict) or not all(isinstance(v, str) or isinstance(v, list) and
                                              all(isinstance(x, str) for x in v) for v in files.values()):
        return None
    return files


def _hashes(entry: str | list[str] | None) -> list[str]:
    """The sha256s a manifest entry accepts: one, or two while a replacement is under way (the file's old
    content and its new one: a process killed between the manifest's write and the file's rename leaves a
    file the manifest still lists)."""
    return [] if entry is None else [entry] if isinstance(entry, str) else list(entry)


def _record(path: Path, digest: str, *, pending: bool = False) -> None:
    """List ``path`` with ``digest`` in its folder's manifest (entries of files gone since are dropped);
    ``pending``: before the file is replaced, beside the hash it has now. The folder is locked meanwhile:
    subjects are trained by several processes into one folder."""
    folder = path.parent
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        files = {k: v for k, v in (_manifest(folder) or {}).items() if (folder / k).is_file() or k == path.name}
        old = [h for h in _hashes(files.get(path.name)) if path.is_file() and h == _sha256(path)]
        files[path.name] = old + [digest] if pending and old and old != [digest] else digest
        _replace(folder / MANIFEST, (json.dumps({"format": MANIFEST_FORMAT, "files": dict(sorted(files.items()))},
                                                indent=1) + "\n").encode())
    finally:
        os.close(fd)  # releases the lock


def owned(path: str | Path, *, step_folders: bool = False) -> bool:
    """Whether ``path`` is storelab's own: a file its folder's manifest lists with the sha256 it has now,
    or a folder (not a link) whose every file is. ``step_folders``: a run's ``step-*`` folder of DCP
    files only counts as its own (``is_step_folder``)."""
    path = Path(path)
    if path.is_symlink():
        return False
    if path.is_dir():
        if step_folders and STEP_FOLDER.fullmatch(path.name):
            return is_step_folder(path)
        if _manifest(path) is None:
            return False  # a folder storelab never wrote into
        try:
            return all(owned(p) for p in path.iterdir() if p.name != MANIFEST)
        except OSError:
            return False
    if not path.is_file():
        return not path.exists()
    files = _manifest(path.parent)
    return files is not None and _sha256(path) in _hashes(files.get(path.name))


def _not_owned(path: Path, option: str) -> OutputError:
    """The refusal of ``path``, saying why it is not the command's to replace."""
    if path.is_symlink() or (path.exists() and not path.is_file() and not path.is_dir()):
        why = "is a link or not a plain file, not one this command wrote"
    elif path.is_dir():
        why = (f"holds files this command did not write (a file its folder's {MANIFEST} does not list, or one "
               f"changed since)")
    elif _manifest(path.parent) is None:
        why = (f"was not written by this command: the folder has no {MANIFEST} (storelab's record of the files "
               f"it wrote, with their hashes), so the file is a user's, or the folder was written by a storelab "
               f"older than the manifest")
    else:
        why = f"was not written by this command, or was changed since (its hash is not the one {MANIFEST} lists)"
    return OutputError(f"{option}: {path} {why}: refusing to replace it (choose another folder, move it, or "
                       f"--force to overwrite)")


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
    if have in KINDS and have != kind:
        raise OutputError(f"{option}: {folder} is {KINDS[have]}, not {KINDS[kind]}: refusing to write into it "
                          f"(choose another folder, or --force to write anyway)")
    # its own kind, or a folder of the user's: every file the command would replace or remove must be its own
    for name in sorted({p.name for pat in files for p in folder.glob(pat)} | _dangling(folder, files)):
        if not owned(folder / name, step_folders=kind == "run"):
            raise _not_owned(folder / name, option)
    return folder


def _dangling(folder: Path, files: Iterable[str]) -> set[str]:
    """Links among ``files`` that point nowhere (``glob`` does not list them; a write would follow them)."""
    return {p.name for p in folder.iterdir() if p.is_symlink() and not p.exists() and any(p.match(f) for f in files)}


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
    ``"command": command``: when that JSON says so and the folders' manifests list every existing one
    as it is now (``owned``), they are the command's own (a plot drawn again); else each one that
    exists is refused unless ``force``."""
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
    if own and all(owned(p) for p in paths):
        return
    for p in paths:
        if p.exists() or p.is_symlink():
            also = f" (the command writes {', '.join(str(q) for q in paths)})" if len(paths) > 1 else ""
            raise OutputError(f"{option}: {p} exists and was not written by this command: refusing to replace "
                              f"it{also} (another name, or --force)")


@contextmanager
def atomic_path(path: str | Path, *, record: bool = True) -> Iterator[Path]:
    """A temporary path beside ``path`` (same suffix, so writers that go by it still do) to write into;
    on success it replaces ``path`` atomically and (``record``) is listed with its sha256 in the
    folder's manifest, which makes it the command's own to replace later; on failure it is removed."""
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
        digest = _sha256(tmp) if record else None
        if record:   # listed before the rename, beside the old content's hash: a kill in between loses nothing
            _record(path, digest, pending=True)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    _fsync_dir(path.parent)
    if record:
        _record(path, digest)


def atomic_write(path: str | Path, data: str | bytes, *, record: bool = True) -> Path:
    """Write ``data`` (text as UTF-8) to ``path`` atomically (recorded in the folder's manifest unless
    ``record`` is False); return the path."""
    raw = data.encode() if isinstance(data, str) else data
    with atomic_path(path, record=record) as tmp:
        tmp.write_bytes(raw)
    return Path(path)


def _replace(path: Path, raw: bytes) -> None:
    """Write ``raw`` to ``path`` through a temporary file and ``os.replace`` (the manifest's own write)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(raw)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _umask() -> int:
    cur = os.umask(0)
    os.umask(cur)
    return cur
