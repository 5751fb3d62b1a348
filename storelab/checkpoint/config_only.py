"""A checkpoint's model from its ``config.json`` alone: accounting without weights.

    read_model_config(path) -> ModelConfig

``path`` is a checkpoint folder (only its config.json is read: no safetensors need be there)
or a config.json file itself (any file name), or a GGUF file (its header's metadata). The family's own translation is used, the one
``load`` uses before reading weights (``storelab.checkpoint.families``), so ``storelab memory
--checkpoint`` and ``storelab models --checkpoint`` count exactly the model ``load`` builds.
The model is named after the folder (``Qwen3.6-27B``) and titled with its family.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from storelab.checkpoint.families import family_for
from storelab.checkpoint.gguf import is_gguf, read_gguf_config
from storelab.checkpoint.shards import CheckpointError, read_config
from storelab.files import read_json

__all__ = ["read_model_config", "read_hf_config"]


def read_hf_config(path: str | Path) -> tuple[dict, Path]:
    """(config.json as a dict, the file it came from) for a folder or a JSON file; for a GGUF file, the
    transformers-style config made from its metadata (``storelab.checkpoint.gguf``, the header alone)."""
    path = Path(path)
    if is_gguf(path):
        return read_gguf_config(path), path
    if path.is_dir():
        return read_config(path), path / "config.json"
    if not path.exists():
        raise CheckpointError(f"{path}: no such folder or file (give a checkpoint folder or its config.json)")
    try:
        d = read_json(path)  # a FIFO or a folder is refused before it is opened
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    if not isinstance(d, dict):
        raise CheckpointError(f"{path}: expected a JSON object, got {type(d).__name__}")
    return d, path


def read_model_config(path: str | Path):
    """The storelab ModelConfig of a checkpoint's config.json; no weight is read or needed."""
    hf, file = read_hf_config(path)
    try:
        fam = family_for(hf)
    except CheckpointError as e:
        raise CheckpointError(str(e).replace("config.json: ", f"{file}: ", 1)) from None
    try:
        cfg = fam.to_config(hf)
    except CheckpointError as e:
        raise CheckpointError(f"{file}: {e}".replace(f"{file}: config.json: ", f"{file}: ")) from None
    except ValueError as e:
        raise CheckpointError(f"{file}: {e}") from None
    name = file.parent.name if file.name == "config.json" and file.parent.name else file.stem
    title = f"{name} ({hf.get('model_type')})"
    return dataclasses.replace(cfg, name=name or cfg.name, title=title)
