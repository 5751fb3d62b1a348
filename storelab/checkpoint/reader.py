"""Shards read with plain file reads, every byte counted: a 100-GB checkpoint's gates for megabytes.

    reader = CountingShards(folder)      # the headers: 8 bytes + the JSON header of each file
    reader.tensor(name)                  # exactly that tensor's bytes: seek, read, count
    reader.bytes_read, reader.header_bytes

A safetensors file is an 8-byte little-endian header length n, n bytes of JSON header (each
tensor's dtype, shape and ``data_offsets`` [start, end) counted from the end of the header),
then the tensors' bytes. ``CountingShards`` is a ``Shards`` (same index checks, same ``info``,
``where``, ``read``) that parses those headers itself instead of memory-mapping the file with
safetensors, and reads each tensor with one ``seek`` and one ``readinto`` straight into the
tensor's own storage. So

* what a caller reads is countable (``bytes_read``; a test holds it to header + gate bytes);
* nothing is memory-mapped: a page of the file is never part of this process's memory (a
  touched page of an mmap counts in its RSS until the map is closed), only the tensors asked
  for, which the caller frees. The streamed model (``storelab.checkpoint.stream``) relies on it.

Every error names the file (a short or damaged header, offsets outside the file) or the tensor.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Iterator

import torch

from storelab.checkpoint.shards import TORCH_DTYPES, CheckpointError, Shards

__all__ = ["CountingShards", "ELEMENT_BYTES"]

MAX_HEADER = 100 * 2**20   # safetensors' own limit on the JSON header
ELEMENT_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                 "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}


class CountingShards(Shards):
    """The shards of a folder, headers parsed and tensors read by hand; ``bytes_read`` counts it all
    (headers included, ``header_bytes`` of it)."""

    def __init__(self, folder: str | Path):
        self.bytes_read = 0
        self.header_bytes = 0
        self.spans: dict[str, tuple[int, int]] = {}   # name -> absolute [start, end) in its file
        super().__init__(folder)

    def _header(self, fname: str) -> dict[str, tuple[tuple[int, ...], str]]:
        path = self.folder / fname
        if not path.exists():
            raise CheckpointError(f"{path}: shard file missing")
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"{path}: unreadable safetensors file, truncated or damaged (shorter than "
                                      "its 8-byte header length)")
            (n,) = struct.unpack("<Q", head)
            if n > min(MAX_HEADER, size - 8):
                raise CheckpointError(f"{path}: unreadable safetensors file, truncated or damaged (a header of "
                                      f"{n} bytes in a file of {size})")
            raw = f.read(n)
        self.bytes_read += 8 + n
        self.header_bytes += 8 + n
        try:
            header = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CheckpointError(f"{path}: unreadable safetensors file, damaged header ({e})") from None
        if not isinstance(header, dict):
            raise CheckpointError(f"{path}: unreadable safetensors file, the header is not a JSON object")
        out = {}
        base = 8 + n
        for name, e in header.items():
            if name == "__metadata__":
                continue
            try:
                dt, shape, (lo, hi) = e["dtype"], tuple(int(s) for s in e["shape"]), e["data_offsets"]
            except (KeyError, TypeError, ValueError) as err:
                raise CheckpointError(f"{path}: tensor {name!r}: a header entry without dtype, shape and "
                                      f"data_offsets ({err})") from None
            want = ELEMENT_BYTES.get(dt, 0) * int(torch.Size(shape).numel())
            if dt not in ELEMENT_BYTES or hi - lo != want or lo < 0 or base + hi > size:
                raise CheckpointError(f"{path}: tensor {name!r}: dtype {dt}, shape {list(shape)} and bytes "
                                      f"[{lo}, {hi}) do not agree, or lie past the end of the file "
                                      "(truncated or damaged)")
            self.spans[name] = (base + lo, base + hi)
            out[name] = (shape, dt)
        return out

    def tensor(self, name: str) -> torch.Tensor:
        """The tensor ``name``, read from its file with one seek and one read (counted)."""
        if name not in self.where:
            raise CheckpointError(f"missing tensor {name!r}: no shard of {self.folder} holds it "
                                  f"(files: {', '.join(self.files)})")
        shape, dt = self.info[name]
        lo, hi = self.spans[name]
        out = torch.empty(shape, dtype=TORCH_DTYPES[dt])
        if hi > lo:
            path = self.folder / self.where[name]
            with open(path, "rb") as f:
                f.seek(lo)
                got = f.readinto(memoryview(out.view(-1).view(torch.uint8).numpy()))
            if got != hi - lo:
                raise CheckpointError(f"{path}: tensor {name!r}: read {got} of its {hi - lo} bytes (truncated)")
            self.bytes_read += got
        return out

    def read(self, fname: str, names: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
        for name in names:
            yield name, self.tensor(name)

    def tensor_bytes(self, names) -> int:
        """The bytes these tensors occupy in their files."""
        return sum(self.spans[n][1] - self.spans[n][0] for n in set(names))
