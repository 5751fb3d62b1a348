"""Checkpoints: one safetensors file per run directory, written atomically.

``DIR/checkpoint.safetensors`` holds

* ``model/<name>``          - every tensor of the model's state dict;
* ``optim/<i>/<key>``       - AdamW's per-parameter state (``exp_avg``, ``exp_avg_sq``,
                              ``step``), ``i`` the parameter's index in the optimizer;
* ``rng/torch``             - the CPU random state;

and, in the file's string metadata, ``train_config`` (the resolved training config),
``model_config`` (the model file as JSON, ``ModelConfig.to_dict``), ``task`` (the
resolved task), ``step``, ``optim_groups`` (hyper-parameters of the parameter groups)
and ``history`` (the logged losses and evaluations). Everything needed to rebuild the
model and continue training is in the one file.

Atomic: the file is written to ``checkpoint.safetensors.tmp`` in the same directory,
flushed to disk, then renamed over the old one (``os.replace`` is atomic on POSIX), so
a kill at any moment leaves either the previous checkpoint or the new one, never
half a file. ``config.json`` beside it repeats the resolved config for people.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import save_file

CHECKPOINT = "checkpoint.safetensors"
RUN_FILES = (CHECKPOINT, "config.json")  # what a run folder holds (storelab.outputs checks --out against them)
FORMAT = "storelab-checkpoint-1"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def save_checkpoint(out_dir: str | Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
                    step: int, meta: dict[str, Any]) -> Path:
    """Write the model, optimizer and RNG state plus ``meta`` (JSON-able) atomically."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tensors: dict[str, torch.Tensor] = {}
    for k, v in model.state_dict().items():
        tensors[f"model/{k}"] = v.detach().cpu().contiguous().clone()  # clone: tied weights share storage
    groups = []
    if optimizer is not None:
        sd = optimizer.state_dict()
        for i, st in sd["state"].items():
            for key, v in st.items():
                t = v if torch.is_tensor(v) else torch.tensor(v)
                tensors[f"optim/{i}/{key}"] = t.detach().cpu().contiguous().clone()
        groups = [{k: v for k, v in g.items()} for g in sd["param_groups"]]
    tensors["rng/torch"] = torch.get_rng_state()
    metadata = {"format": FORMAT, "step": str(step), "optim_groups": json.dumps(groups)}
    metadata.update({k: json.dumps(v) for k, v in meta.items()})
    path = out / CHECKPOINT
    tmp = path.with_name(path.name + ".tmp")
    save_file(tensors, str(tmp), metadata=metadata)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(out)
    atomic_write_bytes(out / "config.json", (json.dumps({"step": step, **{k: meta[k] for k in meta
                                                         if k != "history"}}, indent=2) + "\n").encode())
    return path


def read_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors, metadata with JSON values decoded) of a checkpoint file or run directory."""
    p = Path(path)
    if p.is_dir():
        p = p / CHECKPOINT
    if not p.exists():
        from storelab.outputs import KINDS, folder_kind

        kind = folder_kind(path)
        what = f": {path} is {KINDS[kind]}, not a run folder written by storelab train --out" if kind in KINDS else ""
        raise ValueError(f"checkpoint: no {CHECKPOINT} at {path}{what}")
    with safe_open(str(p), framework="pt") as f:
        raw = f.metadata() or {}
        tensors = {k: f.get_tensor(k) for k in f.keys()}
    if raw.get("format") != FORMAT:
        raise ValueError(f"checkpoint: {p} is not a storelab checkpoint (format {raw.get('format')!r})")
    meta: dict[str, Any] = {"step": int(raw["step"])}
    for k, v in raw.items():
        if k not in ("format", "step"):
            meta[k] = json.loads(v)
    return tensors, meta


def restore(tensors: dict[str, torch.Tensor], meta: dict[str, Any], *, model: torch.nn.Module,
            optimizer: torch.optim.Optimizer | None = None, rng: bool = True) -> None:
    """Load the model (strictly), the optimizer's state and the RNG state from a checkpoint."""
    model.load_state_dict({k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")}, strict=True)
    if optimizer is not None:
        state: dict[int, dict[str, torch.Tensor]] = {}
        for k, v in tensors.items():
            if k.startswith("optim/"):
                _, i, key = k.split("/", 2)
                state.setdefault(int(i), {})[key] = v
        groups = meta["optim_groups"]
        optimizer.load_state_dict({"state": state, "param_groups": groups})
    if rng and "rng/torch" in tensors:
        torch.set_rng_state(tensors["rng/torch"])
