"""Checkpoints of a run folder, through ``torch.distributed.checkpoint`` (DCP): sharded, resharded on load.

A run folder ``DIR`` holds

* ``DIR/step-<8 digits>/`` - a DCP checkpoint: ``.metadata`` plus one ``__<rank>_0.distcp`` per process
  writing. Its state dict is ``{"model": ..., "optim": ..., "rng": ...}``: the model's and AdamW's
  state from ``torch.distributed.checkpoint.state_dict.get_state_dict`` (keys are parameter names,
  ``optim.state.<name>.exp_avg``; under FSDP2 each process writes its own shards), and rank 0's
  CPU random state;
* ``DIR/checkpoint.json`` - the pointer, written last: ``format``, ``step``, ``folder`` (the step
  folder above), ``world`` and ``parallel`` of the writer, the resolved ``train_config``,
  ``model_config`` (``ModelConfig.to_dict``), ``task`` and ``history`` (the logged losses and
  evaluations);
* ``DIR/config.json`` - the same without the history, for people.

Any world size reads any checkpoint: ``load_state`` asks DCP for the tensors of *this* process's
layout (plain tensors in one process or under DDP, DTensor shards under FSDP2) and DCP reads the
pieces it needs from whatever shards were written. A single process needs no process group
(``no_dist``).

Atomic: the step folder is written as ``step-<n>.tmp`` and renamed when every process has finished
writing; then ``checkpoint.json`` is replaced atomically (``os.replace``) to name it; only then are
older step folders removed. A kill at any moment leaves the previous pointer to a whole folder, or
the new one. ``Checkpointer(asynchronous=True)`` (``storelab train --async-checkpoint``) writes with
``dcp.async_save``: the state is copied to CPU memory at the checkpoint's step and written in the
background; the rename and the pointer follow when the write is done (see ``Checkpointer``).

Run folders of storelab before DCP (one ``checkpoint.safetensors``) are read by ``load_trained`` and
``storelab export``; resuming one is refused with a message (their AdamW state is keyed by position).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from storelab.outputs import atomic_write, is_step_folder

CHECKPOINT = "checkpoint.json"
LEGACY = "checkpoint.safetensors"
RUN_FILES = (CHECKPOINT, "config.json", "step-*", LEGACY)  # what a run folder holds (storelab.outputs checks --out)
FORMAT = "storelab-checkpoint-2"
LEGACY_FORMAT = "storelab-checkpoint-1"


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextmanager
def _quiet():
    """DCP warns that it saves or loads in a single process when no group is up: that is the intent here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _state(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    if optimizer is None:
        return {"model": get_model_state_dict(model)}
    msd, osd = get_state_dict(model, optimizer)
    return {"model": msd, "optim": osd}


class Checkpointer:
    """Writes a run folder's checkpoints; every process makes one and calls ``save`` (a collective).

    ``asynchronous``: ``dcp.async_save`` copies the state to CPU memory ("staging") and writes it in a
    background thread while training goes on, over a gloo group of its own (the training group may
    be nccl, and the main thread keeps using it). The write is finished -- the step folder renamed
    and ``checkpoint.json`` pointed at it -- by rank 0 as soon as its future is done (``poll``, each
    step; DCP's coordinator writes ``.metadata`` only after every process has written its shard), or
    at the next ``save`` / ``close`` at the latest. Until then the previous checkpoint is the run's."""

    def __init__(self, out: str | Path, *, rank: int = 0, barrier=lambda: None, asynchronous: bool = False):
        import torch.distributed as dist

        self.out, self.rank, self.barrier, self.asynchronous = Path(out), rank, barrier, asynchronous
        self.group = dist.new_group(backend="gloo") if asynchronous and dist.is_initialized() else None
        if asynchronous and not dist.is_initialized():  # the background thread's save warns outside _quiet
            warnings.filterwarnings("ignore", message="torch.distributed is disabled.*save in a single process")
        self.pending = None  # (future, step, meta) of an asynchronous save not yet finished

    def save(self, step: int, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None,
             meta: dict[str, Any]) -> None:
        """Write the model, optimizer and RNG state plus ``meta`` (JSON-able, copied now) atomically."""
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        self.close()
        meta = json.loads(json.dumps(meta))  # the history goes on growing while a write is in flight
        tmp = self.out / (f"step-{step:08d}" + ".tmp")
        if self.rank == 0:
            self.out.mkdir(parents=True, exist_ok=True)
            _remove_step_folder(tmp)  # a kill's leftover
            tmp.mkdir()
        self.barrier()
        state = {**_state(model, optimizer), "rng": torch.get_rng_state()}
        with _quiet():
            if self.asynchronous:
                fut = dcp.async_save(state, checkpoint_id=str(tmp), process_group=self.group,
                                     no_dist=not dist.is_initialized())
                self.pending = (fut, step, meta)
                return
            dcp.save(state, checkpoint_id=str(tmp), no_dist=not dist.is_initialized())
        self.barrier()  # every shard written
        self._finish(step, meta)
        self.barrier()

    def poll(self) -> None:
        """Finish an asynchronous save whose write is done (local: no collective)."""
        if self.pending is not None and self.pending[0].done():
            self.close()

    def close(self) -> None:
        """Wait for an asynchronous save in flight and finish it."""
        if self.pending is None:
            return
        fut, step, meta = self.pending
        self.pending = None
        fut.result()
        self._finish(step, meta)

    def _finish(self, step: int, meta: dict[str, Any]) -> None:
        if self.rank != 0:
            return
        out, folder = self.out, f"step-{step:08d}"
        final, tmp = out / folder, out / (folder + ".tmp")
        _fsync_dir(tmp)
        _remove_step_folder(final)  # the same step written again (an extended run's last)
        os.replace(tmp, final)
        _fsync_dir(out)
        pointer = {"format": FORMAT, "step": step, "folder": folder, **meta}
        atomic_write(out / CHECKPOINT, json.dumps(pointer) + "\n")  # listed in the run's manifest: its own
        atomic_write(out / "config.json", (json.dumps({"step": step, **{k: meta[k] for k in meta
                                                             if k != "history"}}, indent=2) + "\n"))
        for old in out.glob("step-*"):
            if old.name != folder and is_step_folder(old):  # a folder holding a user's file is left alone
                shutil.rmtree(old, ignore_errors=True)


def _remove_step_folder(path: Path) -> None:
    """Remove a step folder this run wrote; one that holds anything else is the user's (``storelab.outputs``
    refuses such a run folder before training unless ``--force``, which says to lose it)."""
    if path.is_symlink() or path.is_file():
        path.unlink()  # a link is removed, never followed out of the run
    elif path.is_dir():
        shutil.rmtree(path)


def read_meta(path: str | Path) -> dict[str, Any]:
    """The pointer of a run folder (``checkpoint.json``) or, for an old one, its file's metadata; checked
    whole (``check_pointer``) before anything follows it."""
    p = Path(path)
    if (p / CHECKPOINT).is_file():
        file = p / CHECKPOINT
        try:
            meta = json.loads(file.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"checkpoint: {file} cannot be read as JSON ({e})") from None
        if not isinstance(meta, dict):
            raise ValueError(f"checkpoint: {file} holds {type(meta).__name__}, not a JSON object")
        if meta.get("format") != FORMAT:
            raise ValueError(f"checkpoint: {file} is not a storelab checkpoint (format {meta.get('format')!r})")
        check_pointer(meta, file)
        return meta
    if (p / LEGACY).is_file():
        meta = _read_legacy(p / LEGACY, tensors=False)[1]
        check_pointer(meta, p / LEGACY)
        return meta
    from storelab.outputs import KINDS, folder_kind

    kind = folder_kind(path)
    what = f": {path} is {KINDS[kind]}, not a run folder written by storelab train --out" if kind in KINDS else ""
    raise ValueError(f"checkpoint: no {CHECKPOINT} at {path}{what}")


# the pointer's fields: (type, required); a field of another type is refused, naming the file and the field
POINTER_FIELDS: dict[str, tuple[type, bool]] = {
    "format": (str, True), "step": (int, True), "folder": (str, True), "train_config": (dict, True),
    "model_config": (dict, True), "task": (dict, True), "world": (int, False), "parallel": (str, False),
    "schedule": (list, False), "history": (list, False)}


def check_pointer(meta: dict[str, Any], file: Path) -> None:
    """Refuse a damaged pointer before anything follows it: a ValueError naming ``file`` and the field.

    Each field has its type; ``folder`` is exactly the step folder of ``step`` (``step-<8 digits>``, no
    path: a pointer is never followed out of the run) and holds DCP's ``.metadata``; ``train_config``,
    ``model_config`` and ``task`` are what ``TrainConfig``, ``ModelConfig.from_dict`` and ``make_task``
    accept; ``schedule`` and ``history`` are lists of objects."""
    from storelab.models.config import ModelConfig
    from storelab.tasks import make_task
    from storelab.train.loop import TrainConfig

    legacy = meta.get("format") == LEGACY_FORMAT
    for k, (kind, required) in POINTER_FIELDS.items():
        if k not in meta:
            if required and not (legacy and k == "folder"):
                raise ValueError(f"checkpoint: {file} has no field {k!r}")
            continue
        v = meta[k]
        if not isinstance(v, kind) or isinstance(v, bool):
            raise ValueError(f"checkpoint: {file}: field {k!r} must be {kind.__name__}, got {json.dumps(v)[:60]}")
    if meta["step"] < 0:
        raise ValueError(f"checkpoint: {file}: field 'step' must be >= 0, got {meta['step']}")
    if meta.get("world", 1) < 1:
        raise ValueError(f"checkpoint: {file}: field 'world' must be >= 1, got {meta['world']}")
    if not legacy:
        want = f"step-{meta['step']:08d}"
        if meta["folder"] != want:
            raise ValueError(f"checkpoint: {file}: field 'folder' must be {want!r} (the step folder of step "
                             f"{meta['step']}, inside the run), got {meta['folder']!r}")
        step = file.parent / want
        if step.is_symlink() or not step.is_dir():
            raise ValueError(f"checkpoint: {step}, the step folder {file} points to, is missing, a link or not a "
                             f"folder")
        if not (step / ".metadata").is_file():
            raise ValueError(f"checkpoint: {step / '.metadata'} is missing: the step folder {file} points to "
                             f"is incomplete")
    for k in ("schedule", "history"):
        for i, item in enumerate(meta.get(k, [])):
            if not isinstance(item, dict):
                raise ValueError(f"checkpoint: {file}: field {k!r}[{i}] must be an object, got {json.dumps(item)[:60]}")
    schedule = meta.get("schedule")
    if schedule is not None:
        if not schedule:
            raise ValueError(f"checkpoint: {file}: field 'schedule' is empty")
        for i, item in enumerate(schedule):
            for key in ("from", "steps"):
                v = item.get(key)
                if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                    raise ValueError(f"checkpoint: {file}: field 'schedule'[{i}].{key} must be an integer >= 0, "
                                     f"got {json.dumps(v)}")
    unknown = sorted(set(meta["train_config"]) - {f.name for f in dataclasses.fields(TrainConfig)})
    if unknown:
        raise ValueError(f"checkpoint: {file}: field 'train_config' has an unknown key {unknown[0]!r}")
    checks = {"train_config": lambda: TrainConfig(**meta["train_config"]),
              "model_config": lambda: ModelConfig.from_dict(meta["model_config"], source=str(file)),
              "task": lambda: _task(make_task, meta["task"])}
    for what, check in checks.items():  # each as its own config accepts it, the message naming the file
        try:
            check()
        except (ValueError, TypeError) as e:
            msg = str(e)
            raise ValueError(msg if str(file) in msg else f"checkpoint: {file}: field {what!r}: {msg}") from None


def _task(make_task, d: dict[str, Any]):
    if not isinstance(d.get("name"), str):
        raise ValueError(f"name: must be a task name, got {json.dumps(d.get('name'))}")
    return make_task(d["name"], **{k: v for k, v in d.items() if k != "name"})


def _dcp_error() -> type[BaseException]:
    """DCP's error for a failed read (a BaseException, not an Exception: ``except Exception`` misses it)."""
    from torch.distributed.checkpoint.api import CheckpointException

    return CheckpointException


def _unreadable(where: Path, e: Exception) -> ValueError:
    """A step folder or file DCP or safetensors could not read (a shard truncated, a tensor of another shape)."""
    failures = getattr(e, "failures", None)  # DCP's CheckpointException wraps each rank's error
    if isinstance(failures, dict) and failures:
        e = next(iter(failures.values()))[0]
    first = (str(e).strip().splitlines() or [""])[0][:300]
    why = f"{type(e).__name__}: {first}" if first else ("a file ends early (truncated)" if isinstance(e, EOFError)
                                                         else type(e).__name__)
    return ValueError(f"checkpoint: {where} cannot be read ({why})")


def has_checkpoint(path: str | Path) -> bool:
    return (Path(path) / CHECKPOINT).is_file() or (Path(path) / LEGACY).is_file()


def load_state(path: str | Path, *, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None,
               rng: bool = True, collective: bool = True) -> dict[str, Any]:
    """Load the model (strictly) and the optimizer's state, in this process's layout; return the metadata.
    A collective when a process group is up and ``collective`` (every process calls it)."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

    p = Path(path)
    meta = read_meta(p)
    if meta.get("format") == LEGACY_FORMAT:
        if optimizer is not None:
            raise ValueError(f"checkpoint: {p / LEGACY} was written by an earlier storelab (one safetensors file): "
                             "it cannot be resumed; storelab export or load_trained still read it (or use --fresh)")
        tensors, _ = _read_legacy(p / LEGACY)
        try:
            model.load_state_dict({k[len("model/"):]: v for k, v in tensors.items() if k.startswith("model/")})
        except RuntimeError as e:
            raise _unreadable(p / LEGACY, e) from None
        return meta
    folder = str(p / meta["folder"])
    state = _state(model, optimizer)
    try:
        if optimizer is not None:  # a parameter that never had a gradient (a cache reader's) has no AdamW state
            saved = dcp.FileSystemReader(folder).read_metadata().state_dict_metadata
            state["optim"]["state"] = {name: st for name, st in state["optim"]["state"].items()
                                       if any(f"optim.state.{name}.{key}" in saved for key in st)}
        if rng:
            state["rng"] = torch.get_rng_state()
        with _quiet():
            dcp.load(state, checkpoint_id=folder, no_dist=not (collective and dist.is_initialized()))
        if optimizer is None:
            model.load_state_dict(state["model"], strict=True)
        else:
            set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                           options=StateDictOptions(strict=False))  # DCP's load already required every key asked
        if rng:
            torch.set_rng_state(state["rng"])
    except (Exception, _dcp_error()) as e:  # noqa: BLE001 - whatever DCP raises for a damaged folder
        raise _unreadable(Path(folder), e) from None
    return meta


def read_checkpoint(path: str | Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors, metadata) of a run folder, in one process: ``model/<name>``, ``optim/<name>/<key>``
    (AdamW's ``exp_avg``, ``exp_avg_sq``, ``step``) and ``rng/torch``, whatever world size wrote them."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    p = Path(path)
    meta = read_meta(p)
    if meta.get("format") == LEGACY_FORMAT:
        return _read_legacy(p / LEGACY)
    folder = str(p / meta["folder"])
    try:
        md = dcp.FileSystemReader(folder).read_metadata()
        flat = {k: torch.empty(v.size, dtype=v.properties.dtype) for k, v in md.state_dict_metadata.items()
                if isinstance(v, TensorStorageMetadata)}
        with _quiet():
            dcp.load(flat, checkpoint_id=folder, no_dist=True)
    except (Exception, _dcp_error()) as e:  # noqa: BLE001 - as in load_state
        raise _unreadable(Path(folder), e) from None
    tensors = {}
    for k, v in flat.items():
        if k.startswith("model."):
            tensors["model/" + k[len("model."):]] = v
        elif k.startswith("optim.state."):
            name, key = k[len("optim.state."):].rsplit(".", 1)
            tensors[f"optim/{name}/{key}"] = v
        elif k == "rng":
            tensors["rng/torch"] = v
    return tensors, meta


def _read_legacy(p: Path, *, tensors: bool = True) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    from safetensors import safe_open

    try:
        with safe_open(str(p), framework="pt") as f:
            raw = f.metadata() or {}
            out = {k: f.get_tensor(k) for k in f.keys()} if tensors else {}
    except Exception as e:  # noqa: BLE001 - a truncated or foreign file
        raise _unreadable(p, e) from None
    if raw.get("format") != LEGACY_FORMAT:
        raise ValueError(f"checkpoint: {p} is not a storelab checkpoint (format {raw.get('format')!r})")
    meta: dict[str, Any] = {"format": LEGACY_FORMAT}
    for k, v in raw.items():
        if k == "format":
            continue
        try:
            meta[k] = int(v) if k == "step" else json.loads(v)
        except ValueError:
            raise ValueError(f"checkpoint: {p}: metadata field {k!r} cannot be read, got {v[:60]!r}") from None
    return out, meta
