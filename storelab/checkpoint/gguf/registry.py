"""``GGUF_ARCHS``: every GGUF architecture storelab reads, by ``general.architecture``.

Each module of ``_MODULES`` (in this package) ends with ``ARCHS``, a tuple of ``Arch``; adding an
architecture is an entry there (and a module's name here when it is a new file).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from storelab.checkpoint.gguf.arch import Arch, Meta
from storelab.checkpoint.gguf.header import read_header
from storelab.checkpoint.shards import CheckpointError

__all__ = ["GGUF_ARCHS", "arch_for", "config_from", "read_gguf_config"]

_MODULES = ("archs", "archs_qwen_linear", "archs_ssm", "archs_moe", "archs_more", "archs_v4", "archs_gemma4")


def _collect() -> dict[str, Arch]:
    out: dict[str, Arch] = {}
    for m in _MODULES:
        for a in importlib.import_module(f"storelab.checkpoint.gguf.{m}").ARCHS:
            if a.arch in out:
                raise ValueError(f"GGUF architecture {a.arch!r} declared twice ({m})")
            out[a.arch] = a
    return out


GGUF_ARCHS: dict[str, Arch] = _collect()


def arch_for(m: Meta) -> Arch:
    """The declaration of the file's ``general.architecture``; an unknown one lists the known."""
    name = m.str("general.architecture")
    if name not in GGUF_ARCHS:
        raise CheckpointError(f"{m.path}: general.architecture {name!r} is not read (GGUF architectures storelab "
                              f"reads: {', '.join(sorted(GGUF_ARCHS))})")
    return GGUF_ARCHS[name]


def config_from(arch: Arch, m: Meta) -> dict:
    """The transformers config dict of a GGUF: the architecture's fields, ``model_type``, and dtype float32
    (a GGUF's weights are dequantized to fp32; ``load(..., dtype=)`` narrows them). ``m`` may read the values
    of the architecture's ``config_tensors`` (``Meta.values``), and nothing else."""
    m.readable = arch.config_tensors
    hf = arch.config(m)
    hf.setdefault("model_type", arch.model_type)   # an architecture whose config picks it (deepseek2: v2 or v3)
    hf.setdefault("dtype", "float32")
    hf["gguf"] = {"architecture": arch.arch, "file_type": m.raw("general.file_type", None),
                  "name": m.raw("general.name", None)}
    return hf


def read_gguf_config(path: str | Path) -> dict:
    """The transformers-style config dict of a GGUF file; the header alone is read (and the architecture's
    ``config_tensors``, a few hundred bytes, where the file has them)."""
    h = read_header(path)
    m = Meta.of(h)
    return config_from(arch_for(m), m)
