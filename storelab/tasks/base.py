"""What every synthetic task shares: the batch, seeded generators, the registry, accuracy.

A task is a keyword-only config dataclass with ``vocab_size`` and
``sample(n, seed) -> Batch``. The same ``(config, n, seed)`` always gives the same
batch, on any machine: every random draw goes through one ``torch.Generator``.
A training run asks for the batch of step s with ``seed = batch_seed(run_seed, split, s)``,
so resuming at step s (or splitting a global batch across processes) needs no data state.

Language-model framing: ``inputs`` [N, T] token ids, ``targets`` [N, T] the token the
model should predict at each position, ``IGNORE`` (-100) where nothing is scored.
Shorter sequences in a mixed batch are padded on the right (causal models never see
the padding from the scored positions).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor

from storelab.models.fileformat import check_types

IGNORE = -100
TASKS: dict[str, type] = {}


def register_task(name: str):
    """Class decorator: make a task config findable by name (``storelab train --task NAME``)."""

    def deco(cls):
        cls.NAME = name
        TASKS[name] = cls
        return cls

    return deco


def make_task(name: str, preset: str | None = None, **options: Any):
    """A task config by name, from a size ``preset`` (see each task's ``PRESETS``) and options;
    unknown names, presets or options raise a ValueError naming them."""
    if name not in TASKS:
        raise ValueError(f"task: unknown task {name!r} (known: {', '.join(sorted(TASKS))})")
    cls = TASKS[name]
    if preset is not None:
        if preset not in cls.PRESETS:
            raise ValueError(f"preset: unknown size {preset!r} for task {name!r} (known: {', '.join(cls.PRESETS)})")
        options = {**cls.PRESETS[preset], **options}
    known = {f.name for f in dataclasses.fields(cls)}
    bad = sorted(set(options) - known)
    if bad:
        raise ValueError(f"{bad[0]}: unknown option for task {name!r} (known: {', '.join(sorted(known))})")
    kw = {}
    for f in dataclasses.fields(cls):
        if f.name in options:
            v = options[f.name]
            default = getattr(cls, f.name, None) if f.default is dataclasses.MISSING else f.default
            if isinstance(v, list) or isinstance(default, tuple):
                v = tuple(tuple(x) if isinstance(x, list) else x for x in v)
            kw[f.name] = v
    check_types(kw, cls)  # a field of the wrong type is named here, not deep inside the task
    return cls(**kw)


def task_dict(task) -> dict[str, Any]:
    """The resolved config of a task as plain data (``make_task(d["name"], **rest)`` inverts it)."""
    out = {"name": task.NAME}
    for f in dataclasses.fields(task):
        v = getattr(task, f.name)
        out[f.name] = [list(x) if isinstance(x, tuple) else x for x in v] if isinstance(v, tuple) else v
    return out


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed) % (2**63))


SPLITS = {"train": 0, "eval": 1, "test": 2}


def batch_seed(run_seed: int, split: str, step: int) -> int:
    """A distinct, reproducible seed for each (run seed, split, step)."""
    return (int(run_seed) * 1_000_003 + SPLITS[split] * 7_919_000_017 + int(step) * 2_654_435_761) % (2**62)


@dataclass
class Batch:
    """Token ids and next-token targets (``IGNORE`` where unscored), plus task facts in ``meta``."""

    inputs: Tensor   # [N, T] long
    targets: Tensor  # [N, T] long
    meta: dict[str, Tensor] = field(default_factory=dict)

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def slice(self, start: int, stop: int) -> "Batch":
        """Examples start..stop-1 (the meta tensors sliced on their first axis)."""
        return Batch(self.inputs[start:stop], self.targets[start:stop],
                     {k: v[start:stop] for k, v in self.meta.items()})

    @property
    def n_scored(self) -> int:
        return int((self.targets != IGNORE).sum())


def pad_cat(parts: list[Batch]) -> Batch:
    """Stack batches of different lengths, padding inputs with 0 and targets with IGNORE."""
    T = max(p.inputs.shape[1] for p in parts)

    def pad(x: Tensor, value: int) -> Tensor:
        return torch.nn.functional.pad(x, (0, T - x.shape[1]), value=value)

    meta = {}
    for k in parts[0].meta:
        vals = [p.meta[k] for p in parts]
        if vals[0].dim() >= 2 and any(v.shape[1:] != vals[0].shape[1:] for v in vals):
            W = max(v.shape[1] for v in vals)
            vals = [torch.nn.functional.pad(v, (0, W - v.shape[1]), value=IGNORE) for v in vals]
        meta[k] = torch.cat(vals)
    return Batch(torch.cat([pad(p.inputs, 0) for p in parts]), torch.cat([pad(p.targets, IGNORE) for p in parts]),
                 meta)


def accuracy(logits_BTV: Tensor, targets_BT: Tensor) -> float:
    """Fraction of scored positions whose argmax is the target (nan when nothing is scored)."""
    m = targets_BT != IGNORE
    if not m.any():
        return float("nan")
    return (logits_BTV.argmax(-1)[m] == targets_BT[m]).float().mean().item()


class Task:
    """Mixin for task configs: ``sample`` plus the facts the trainer and probes ask for."""

    NAME: ClassVar[str] = ""
    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {"full": {}}  # size presets: option overrides
    vocab_size: int

    HAS_TEST_SPLIT: ClassVar[bool] = False  # a held-out test distribution (``sample_test``) beside the eval one

    def sample(self, n: int, seed: int) -> Batch:  # pragma: no cover - each task says
        raise NotImplementedError

    def sample_test(self, n: int, seed: int) -> Batch:
        """The held-out test examples (tasks with ``HAS_TEST_SPLIT``); by default the training distribution."""
        return self.sample(n, seed)

    def score(self, logits_BTV, batch: Batch) -> dict[str, float]:
        """Task-specific scores of a batch beside loss and accuracy, as means over its examples (none by default)."""
        return {}

    def chance(self) -> float:
        """Accuracy of a uniform guess over the possible answers."""
        return 1.0 / self.vocab_size

    @staticmethod
    def check(ok: bool, name: str, msg: str) -> None:
        if not ok:
            raise ValueError(f"{name}: {msg}")
