"""``GGUFShards``: a GGUF file seen as a ``Shards`` of transformers-named fp32 tensors.

The loader (``storelab/checkpoint/loader.py``) and every family work on a ``Shards``: ``folder``,
``files``, ``info {name: (shape, dtype)}``, ``where {name: file}``, ``names()``, ``read(file, names)``.
Here the names are transformers' (``model.layers.0.self_attn.q_proj.weight``), made by the
architecture's rules (``arch.Rule``) from the GGUF tensors; ``info`` gives each one's transformers
shape (the rule run on ``meta`` tensors, from the header alone) and dtype ``F32``; ``read`` reads the
GGUF pieces' bytes (one seek and one read each, no mmap kept), dequantizes them with gguf-py's
``gguf.quants.dequantize`` (every type it implements: ``DEQUANTIZED``) and applies the rule, so
the tensor handed over is fp32 in transformers' layout. ``where`` names the file of a rule's first
piece; a rule whose pieces lie in several shards of a split file reads each from its own.

Reads are counted as ``storelab.checkpoint.reader.CountingShards`` counts a folder's: ``bytes_read``
(the headers, a config tensor, then every stored byte read), ``header_bytes``; ``tensor(name)`` reads
one transformers tensor (what the streamed model, ``storelab.checkpoint.stream``, asks for unit by unit),
``tensor_bytes(names)`` the GGUF bytes those occupy.

``gguf_stored_bytes(path)``: the bytes each GGUF type occupies as stored (Q4_K, Q6_K, F32, ...),
from the header only.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import torch

from storelab.checkpoint.gguf.arch import Meta, Rule
from storelab.checkpoint.gguf.dequant import DEQUANTIZED, INTEGER, INTEGER_NAMES, read_tensor
from storelab.checkpoint.gguf.header import Header, TensorInfo, read_header
from storelab.checkpoint.gguf.registry import arch_for, config_from
from storelab.checkpoint.shards import CheckpointError, Shards

__all__ = ["GGUFShards", "gguf_stored_bytes", "read_tensor", "DEQUANTIZED"]


def gguf_stored_bytes(path: str | Path) -> dict[str, int]:
    """{GGML type name: bytes its tensors occupy in the file(s)}, from the header only."""
    out: dict[str, int] = {}
    for t in read_header(path).tensors.values():
        out[t.qtype.name] = out.get(t.qtype.name, 0) + t.nbytes
    return out


def _meta(t: TensorInfo) -> torch.Tensor:
    return torch.empty(t.shape, dtype=INTEGER.get(t.qtype, torch.float32), device="meta")


class GGUFShards(Shards):
    """A GGUF file (or split file) as transformers-named fp32 tensors; ``hf`` is its config dict."""

    def __init__(self, path: str | Path, header: Header | None = None):
        self.header = header if header is not None else read_header(path)
        h = self.header
        self.folder = h.path                 # named in the loader's messages: the file itself
        self.files = list(h.files)
        self.meta = Meta.of(h)
        self.arch = arch_for(self.meta)
        self.hf = config_from(self.arch, self.meta)
        self.header_bytes = h.header_bytes
        self.bytes_read = h.header_bytes + self.meta.bytes_read   # the headers and any config tensor
        self.rules: dict[str, tuple[Rule, tuple[str, ...]]] = {}   # hf name -> (rule, the GGUF names)
        self.where, self.info = {}, {}
        used: set[str] = set(self.arch.config_tensors)   # read by the config (Meta.values)
        n = self.hf["num_hidden_layers"]
        for r in self.arch.rules(self.hf):
            for bid in (range(n) if "{bid}" in r.hf else (None,)):
                hf_name = r.hf.format(bid=bid) if bid is not None else r.hf
                names = tuple(p.format(bid=bid) if bid is not None else p for p in r.gguf)
                if hf_name in self.rules:
                    continue
                have = [x in h.tensors for x in names]
                if not any(have):
                    continue
                if not all(have):
                    missing = names[have.index(False)]
                    raise CheckpointError(f"{h.path}: tensor {missing!r} missing: {hf_name!r} is made of "
                                          f"{', '.join(names)} (general.architecture {self.arch.arch!r})")
                try:
                    out = r.make(*[_meta(h.tensors[x]) for x in names])
                except (RuntimeError, ValueError, IndexError) as e:
                    where = ", ".join(f"{x!r} shape {list(h.tensors[x].shape)}" for x in names)
                    raise CheckpointError(f"{h.path}: mis-shaped tensor {where}: {r.what or 'read'} for "
                                          f"{hf_name!r} fails ({e})") from None
                self.rules[hf_name] = (r, names)
                ints = {h.tensors[x].qtype for x in names} & set(INTEGER)   # an integer table keeps its type
                self.info[hf_name] = (tuple(out.shape), INTEGER_NAMES[ints.pop()] if ints else "F32")
                self.where[hf_name] = h.tensors[names[0]].file
                used.update(names)
        pats = [re.compile(p) for p in self.arch.ignored]
        unused = [x for x in h.tensors if x not in used and not any(p.search(x) for p in pats)]
        if unused:
            t = h.tensors[unused[0]]
            raise CheckpointError(f"{h.folder / t.file}: tensor {t.name!r}: no rule of general.architecture "
                                  f"{self.arch.arch!r} reads it ({len(unused)} unread: "
                                  f"{', '.join(unused[:4])}{' ...' if len(unused) > 4 else ''})")

    def tensor(self, name: str) -> torch.Tensor:
        """The transformers tensor ``name``: its GGUF pieces read (counted), dequantized, the rule applied."""
        if name not in self.rules:
            raise CheckpointError(f"missing tensor {name!r}: no rule of general.architecture {self.arch.arch!r} "
                                  f"makes it from {self.folder}")
        h = self.header
        r, pieces = self.rules[name]
        out = []
        for x in pieces:
            out.append(read_tensor(h.folder, h.tensors[x]))
            self.bytes_read += h.tensors[x].nbytes
        return r.make(*out).contiguous()

    def read(self, fname: str, names: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (transformers name, fp32 tensor) for these names, each read and dequantized when asked for."""
        for name in names:
            yield name, self.tensor(name)

    def tensor_bytes(self, names) -> int:
        """The GGUF bytes these transformers tensors are made of (each GGUF tensor once)."""
        pieces = {x for n in set(names) for x in self.rules[n][1]}
        return sum(self.header.tensors[x].nbytes for x in pieces)
