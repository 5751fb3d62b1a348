"""A GGUF file's header, read by hand: metadata and tensor infos, never a tensor's bytes.

    h = read_header(path)         # the file, or every shard of a split file named by its first
    h.meta["llama.block_count"]   # metadata: python ints, floats, bools, strs, lists
    h.tensors["blk.0.attn_q.weight"]   # TensorInfo: torch-order shape, GGML type, file, absolute offset, bytes

The layout (the GGUF spec, ggml-org/ggml ``docs/gguf.md``; gguf-py ``gguf_writer.py`` writes it):
``b"GGUF"``, u32 version (2 or 3), u64 tensor count, u64 metadata count, the metadata (a string key,
a u32 value type, the value; arrays are a u32 element type, a u64 length, the elements), then per
tensor its name, u32 dims count, u64 dims (ggml order: the fastest-varying first, so torch's shape
is reversed), u32 GGML type, u64 offset from the data section; the data section starts at the next
multiple of ``general.alignment`` (32 by default). Strings are a u64 length and UTF-8 bytes.

Why not ``gguf.GGUFReader``: it builds numpy views per array element (a 150k-entry vocabulary
and its merges take seconds) and a truncated file surfaces as an IndexError or a reshape
error. This parser walks the same layout with ``struct`` over an mmap (only the header's pages
are touched) in tens of milliseconds for any model size, and every failure is a
``CheckpointError`` naming the file and the key or tensor: truncated file, wrong magic, an
unknown value or tensor type, a tensor whose bytes lie past the end of its file.

A split GGUF (llama.cpp's ``gguf-split``, ``GGUFWriter(split_max_*)``) is ``name-00001-of-0000n.gguf``
... ``name-0000n-of-0000n.gguf``; every shard carries ``split.no``, ``split.count`` and
``split.tensors.count``, the first one the model's metadata. Given the first shard (or any one), the
others are found by name (gguf-py's ``SHARD_NAME_FORMAT``); a missing one is an error naming it.
"""

from __future__ import annotations

import mmap
import re
import struct
from dataclasses import dataclass
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from storelab.checkpoint.shards import CheckpointError

__all__ = ["TensorInfo", "Strings", "Header", "read_header", "is_gguf", "shard_files", "MAGIC"]

MAGIC = b"GGUF"
VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
SPLIT = re.compile(r"^(?P<stem>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")

# GGUF metadata value types (gguf-py constants.GGUFValueType): id -> struct format
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
         7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
STRING, ARRAY = 8, 9


class Strings(Sequence):
    """A metadata array of strings, kept as its bytes and decoded on first use (tokenizer vocabularies)."""

    def __init__(self, raw: bytes, n: int):
        self.raw, self.n, self._items = raw, n, None

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        if self._items is None:
            items, pos, raw = [], 0, self.raw
            for _ in range(self.n):
                k = struct.unpack_from("<Q", raw, pos)[0]
                items.append(raw[pos + 8:pos + 8 + k].decode("utf-8", errors="replace"))
                pos += 8 + k
            self._items = items
        return self._items[i]

    def __eq__(self, other) -> bool:
        return list(self) == list(other)

    def __repr__(self) -> str:
        return f"Strings({self.n} entries)"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]          # torch order (ggml's dims reversed)
    qtype: GGMLQuantizationType
    file: str                       # the file's name, in the header's folder
    offset: int                     # absolute, in that file
    nbytes: int                     # as stored


@dataclass
class Header:
    path: Path                      # the file given (the first shard of a split file)
    files: list[str]                # every file's name, in order
    meta: dict                      # the first file's metadata
    tensors: dict[str, TensorInfo]  # all files' tensors, in file order
    header_bytes: int = 0           # every file's header (up to its data section), read by ``read_header``

    @property
    def folder(self) -> Path:
        return self.path.parent


def is_gguf(path: str | Path) -> bool:
    """A file whose first four bytes are ``GGUF`` (a ``.gguf`` name that is not one is read and refused)."""
    path = Path(path)
    if not path.is_file():
        return False
    if path.suffix == ".gguf":
        return True
    with open(path, "rb") as f:
        return f.read(4) == MAGIC


def shard_files(path: Path) -> list[Path]:
    """The files of a split GGUF by their names (one file when the name says no split)."""
    m = SPLIT.match(path.name)
    if m is None:
        return [path]
    count = int(m["count"])
    files = [path.with_name(f"{m['stem']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]
    for f in files:
        if not f.is_file():
            raise CheckpointError(f"{f}: missing shard {files.index(f) + 1} of {count} of the split GGUF {path.name} "
                                  f"(split.count {count}; every -0000k-of-{count:05d} file must sit beside it)")
    return files


class _Cursor:
    """Reads the header's fields in order; running off the end is a CheckpointError naming what was read."""

    def __init__(self, buf, path: Path):
        self.buf, self.path, self.pos, self.size = buf, path, 0, len(buf)

    def take(self, n: int, what: str) -> int:
        at = self.pos
        if n < 0 or at + n > self.size:
            raise CheckpointError(f"{self.path}: truncated or damaged GGUF header: {what} needs bytes "
                                  f"[{at}, {at + n}) of a file of {self.size}")
        self.pos = at + n
        return at

    def scalar(self, fmt: str, what: str):
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        n = self.scalar("<Q", what)
        at = self.take(n, what)
        return bytes(self.buf[at:at + n]).decode("utf-8", errors="replace")

    def strings(self, n: int, key: str) -> "Strings":
        """An array of n strings: only walked here (a vocabulary of 150k entries in ~20 ms), decoded when read."""
        buf, pos, size, unpack = self.buf, self.pos, self.size, struct.unpack_from
        start = pos
        for i in range(n):
            if pos + 8 > size:
                break
            pos += 8 + unpack("<Q", buf, pos)[0]
        else:
            if pos <= size:
                self.pos = pos
                return Strings(bytes(buf[start:pos]), n)
        raise CheckpointError(f"{self.path}: truncated or damaged GGUF header: metadata {key!r} ({n} strings) "
                              f"runs past the end of the file ({size} bytes)")

    def value(self, vtype: int, key: str):
        if vtype in SCALARS:
            return self.scalar(SCALARS[vtype], f"metadata {key!r}")
        if vtype == STRING:
            return self.string(f"metadata {key!r}")
        if vtype == ARRAY:
            etype = self.scalar("<I", f"metadata {key!r}")
            n = self.scalar("<Q", f"metadata {key!r}")
            if etype in NUMPY:
                width = np.dtype(NUMPY[etype]).itemsize
                at = self.take(n * width, f"metadata {key!r} ({n} elements)")
                return np.frombuffer(self.buf, dtype=NUMPY[etype], count=n, offset=at).tolist()
            if etype == STRING:
                return self.strings(n, key)
            if etype == ARRAY:
                return [self.value(ARRAY, f"{key}[{i}]") for i in range(n)]
            raise CheckpointError(f"{self.path}: metadata {key!r}: unknown array element type {etype}")
        raise CheckpointError(f"{self.path}: metadata {key!r}: unknown value type {vtype}")


def _read_one(path: Path) -> tuple[dict, list[tuple[str, tuple[int, ...], int, int]], int, int]:
    """(metadata, [(name, torch shape, type id, offset from data start)], data start, file size)."""
    size = path.stat().st_size
    if size < 24:
        raise CheckpointError(f"{path}: not a GGUF file (truncated: {size} bytes, shorter than the 24-byte header)")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        if mm[:4] != MAGIC:
            raise CheckpointError(f"{path}: not a GGUF file (magic {bytes(mm[:4])!r}, expected {MAGIC!r})")
        c = _Cursor(mm, path)
        c.take(4, "magic")
        version = c.scalar("<I", "version")
        if version not in VERSIONS:
            raise CheckpointError(f"{path}: GGUF version {version} is not read (versions {VERSIONS})")
        n_tensors, n_kv = c.scalar("<Q", "tensor count"), c.scalar("<Q", "metadata count")
        meta: dict = {}
        for i in range(n_kv):
            key = c.string(f"metadata key {i}")
            if key in meta:
                raise CheckpointError(f"{path}: metadata {key!r} appears twice")
            meta[key] = c.value(c.scalar("<I", f"metadata {key!r}"), key)
        infos = []
        for i in range(n_tensors):
            name = c.string(f"tensor name {i}")
            n_dims = c.scalar("<I", f"tensor {name!r}")
            if n_dims > 8:
                raise CheckpointError(f"{path}: tensor {name!r}: {n_dims} dimensions (damaged header)")
            dims = [c.scalar("<Q", f"tensor {name!r}") for _ in range(n_dims)]
            qtype = c.scalar("<I", f"tensor {name!r}")
            offset = c.scalar("<Q", f"tensor {name!r}")
            infos.append((name, tuple(reversed(dims)), qtype, offset))
        align = meta.get("general.alignment", DEFAULT_ALIGNMENT)
        if isinstance(align, bool) or not isinstance(align, int) or align <= 0 or align & (align - 1):
            raise CheckpointError(f"{path}: metadata 'general.alignment': {align!r} is not a power of two")
        start = (c.pos + align - 1) // align * align
    return meta, infos, start, size


def read_header(path: str | Path) -> Header:
    """The header of a GGUF file, or of every shard of a split one (the first shard names the rest)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such GGUF file")
    files = shard_files(path)
    tensors: dict[str, TensorInfo] = {}
    meta: dict = {}
    header_bytes = 0
    for k, f in enumerate(files):
        m, infos, start, size = _read_one(f)
        header_bytes += start
        if k == 0:
            meta = m
        count = m.get("split.count", 1)
        if count != len(files) or m.get("split.no", 0) != k:
            raise CheckpointError(f"{f}: metadata split.no {m.get('split.no')!r} / split.count {count!r} disagree "
                                  f"with its name (shard {k + 1} of {len(files)})")
        for name, shape, qtype, off in infos:
            if name in tensors:
                raise CheckpointError(f"{f}: tensor {name!r} appears twice (also in {tensors[name].file})")
            if qtype not in GGMLQuantizationType._value2member_map_:
                raise CheckpointError(f"{f}: tensor {name!r}: unknown GGML tensor type {qtype}")
            t = GGMLQuantizationType(qtype)
            block, tsize = GGML_QUANT_SIZES[t]
            inner = shape[-1] if shape else 1
            if inner % block:
                raise CheckpointError(f"{f}: tensor {name!r}: {t.name} needs rows of a multiple of {block} "
                                      f"elements, shape {list(shape)}")
            nbytes = int(np.prod(shape, dtype=np.int64)) // block * tsize
            if start + off + nbytes > size:
                raise CheckpointError(f"{f}: tensor {name!r} ({t.name}, shape {list(shape)}): its bytes "
                                      f"[{start + off}, {start + off + nbytes}) lie past the end of the file "
                                      f"({size} bytes; truncated)")
            tensors[name] = TensorInfo(name, shape, t, f.name, start + off, nbytes)
    if count_key := meta.get("split.tensors.count"):
        if count_key != len(tensors):
            raise CheckpointError(f"{path}: metadata split.tensors.count {count_key} but the shards hold "
                                  f"{len(tensors)} tensors")
    return Header(path=files[0], files=[f.name for f in files], meta=meta, tensors=tensors, header_bytes=header_bytes)
