"""``save(model, path)``: our model as config.json + safetensors, which ``load`` reads back.

The layout is Hugging Face's: one ``model.safetensors``, or shards
``model-0000k-of-0000n.safetensors`` with ``model.safetensors.index.json`` when the
tensors exceed ``max_shard_bytes``. Names are ours (``blocks.3.token.q_proj.weight``);
a tied LM head is written once, as the embedding. Beside the model config, ``adapters`` records
the layers whose channel unit is MiniMax's clamped SwiGLU (``storelab.checkpoint.adapters``).

The folder is checked before anything is written (``storelab.outputs``): a storelab save is
rewritten, a new or empty folder filled; a Hugging Face folder, a train run, or a folder holding a
file of the same name is refused unless ``force``. Every file is written atomically, the new shards
first and ``config.json`` last; a previous save's shards that the new index no longer names are
removed only then.
"""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.torch import save_file

from storelab.checkpoint.adapters import adapters_of
from storelab.checkpoint.families.native import config_to_json
from storelab.checkpoint.shards import INDEX, SINGLE
from storelab.checkpoint.table import ours_to_load
from storelab.outputs import atomic_path, atomic_write, check_folder

__all__ = ["save", "FILES"]

FILES = ("config.json", SINGLE, "model-*-of-*.safetensors", INDEX)  # what a save folder holds

DTYPE_LABELS = {"torch.float32": "float32", "torch.bfloat16": "bfloat16", "torch.float16": "float16",
                "torch.float64": "float64"}


def save(model, path: str | Path, *, max_shard_bytes: int = 5 * 2**30, force: bool = False) -> list[Path]:
    """Write the model to the folder ``path`` (created); return the files written."""
    import storelab

    path = Path(path)
    if any(p.device.type == "meta" for p in model.parameters()):
        raise ValueError("model: its weights are on the meta device (nothing to save)")
    if isinstance(max_shard_bytes, bool) or not isinstance(max_shard_bytes, int) or max_shard_bytes <= 0:
        raise ValueError(f"max_shard_bytes: must be a positive integer, got {max_shard_bytes!r}")
    check_folder(path, "save", FILES, force=force, option="out")
    path.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in ours_to_load(model).items()}
    dtype = next((v.dtype for v in tensors.values() if v.dtype.is_floating_point), None)
    config = {"model_type": "storelab", "storelab_version": storelab.__version__,
              "dtype": DTYPE_LABELS.get(str(dtype), "float32"), "model": config_to_json(model.cfg),
              "adapters": adapters_of(model.cfg)}
    shards: list[dict] = [{}]
    size = 0
    for k, v in tensors.items():
        nb = v.numel() * v.element_size()
        if shards[-1] and size + nb > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][k] = v
        size += nb
    stale = set(path.glob("model*.safetensors")) | {path / INDEX}  # a previous save's, unless rewritten
    written = []
    meta = {"format": "pt", "written_by": "storelab"}
    if len(shards) == 1:
        _save_shard(shards[0], path / SINGLE, meta)
        written.append(path / SINGLE)
    else:
        n = len(shards)
        weight_map = {}
        for j, part in enumerate(shards, 1):
            fname = f"model-{j:05d}-of-{n:05d}.safetensors"
            _save_shard(part, path / fname, meta)
            weight_map.update({k: fname for k in part})
            written.append(path / fname)
        total = sum(v.numel() * v.element_size() for v in tensors.values())
        atomic_write(path / INDEX, json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
        written.append(path / INDEX)
    atomic_write(path / "config.json", json.dumps(config, indent=2) + "\n")
    written.append(path / "config.json")
    for old in stale - set(written):
        old.unlink(missing_ok=True)  # would not match the new index
    return written


def _save_shard(tensors: dict, path: Path, meta: dict) -> None:
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=meta)
