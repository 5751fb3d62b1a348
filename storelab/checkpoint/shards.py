"""Reading a Hugging Face style folder: ``config.json`` and safetensors shards, lazily.

``Shards(folder)`` opens only the headers of the shards (names, shapes, dtypes); a
tensor's bytes are read when ``read(file, names)`` asks for them, one shard at a
time. Pickle files (``*.bin``, ``*.pt``) are never opened: a folder that has only
those is an error. Every error is a ``CheckpointError`` that names the file.
"""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from safetensors import safe_open

from storelab.files import read_json

__all__ = ["CheckpointError", "read_config", "Shards", "TORCH_DTYPES", "FLOAT_DTYPES", "INT_DTYPES"]

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"

# safetensors dtype strings -> torch dtypes
TORCH_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
    "F8_E8M0": torch.float8_e8m0fnu,
}
FLOAT_DTYPES = ("F64", "F32", "F16", "BF16")
INT_DTYPES = ("I64", "I32", "I16", "I8", "U8")


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded; the message names the tensor and the file."""


def read_config(folder: str | Path) -> dict:
    """The folder's ``config.json`` as a dict."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: not a folder (a checkpoint is a folder with config.json and safetensors)")
    path = folder / "config.json"
    try:
        d = read_json(path)  # a folder named config.json, a FIFO: refused before it is opened
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing (a checkpoint folder needs its config.json)") from None
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    if not isinstance(d, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(d).__name__}")
    return d


class Shards:
    """The safetensors files of a folder: which file holds each tensor, and its shape and dtype."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.where: dict[str, str] = {}              # tensor name -> file name
        self.info: dict[str, tuple[tuple[int, ...], str]] = {}  # name -> (shape, safetensors dtype)
        index = self.folder / INDEX
        if index.exists():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise CheckpointError(f"{index}: not a valid shard index ({e})") from None
            files = list(dict.fromkeys(weight_map.values()))
        else:
            weight_map = None
            files = sorted(p.name for p in self.folder.glob("*.safetensors"))
        if not files:
            pickles = sorted(p.name for p in self.folder.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt"))
            extra = f" (found {', '.join(pickles)}: pickle files are never read; convert them to safetensors)" \
                if pickles else ""
            only = " (a config.json alone is enough for accounting: storelab memory --checkpoint, " \
                "storelab.checkpoint.read_model_config)" if not pickles and (self.folder / "config.json").exists() else ""
            raise CheckpointError(f"{self.folder}: no safetensors files{extra}{only}")
        self.files = files
        for fname in files:
            for name, shape_dtype in self._header(fname).items():
                if weight_map is None and name in self.where:   # no index to say which copy is the tensor
                    raise CheckpointError(f"{self.folder}: tensor {name!r} is in both {self.where[name]} and {fname}, "
                                          f"and no {INDEX} says which to read: remove one file, or write the index")
                self.info[name] = shape_dtype
                if weight_map is None:
                    self.where[name] = fname
        if weight_map is not None:
            for name, fname in weight_map.items():
                if name not in self.info:
                    raise CheckpointError(f"{name}: the index {INDEX} puts it in {fname}, which does not hold it")
                self.where[name] = fname
            for name in self.info:
                if name not in weight_map:
                    raise CheckpointError(f"{name}: in a shard but not in the index {INDEX}")

    @contextmanager
    def _open(self, fname: str) -> Iterator:
        path = self.folder / fname
        if not path.exists():
            raise CheckpointError(f"{path}: shard file missing")
        try:
            with safe_open(str(path), framework="pt", device="cpu") as f:
                yield f
        except CheckpointError:
            raise
        except Exception as e:  # safetensors raises its own error type for damaged files
            if type(e).__name__ != "SafetensorError":
                raise
            raise CheckpointError(f"{path}: unreadable safetensors file, truncated or damaged ({e})") from None

    def _header(self, fname: str) -> dict[str, tuple[tuple[int, ...], str]]:
        """One file's tensors: name -> (shape, safetensors dtype), from its header."""
        with self._open(fname) as f:
            return {name: (tuple(f.get_slice(name).get_shape()), f.get_slice(name).get_dtype()) for name in f.keys()}

    def names(self) -> list[str]:
        return list(self.where)

    def read(self, fname: str, names: list[str]) -> Iterator[tuple[str, torch.Tensor]]:
        """Yield (name, tensor) for these names of one file, each read when asked for."""
        with self._open(fname) as f:
            for name in names:
                yield name, f.get_tensor(name)
