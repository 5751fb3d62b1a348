"""The training loop: AdamW, linear warm-up then cosine decay, gradient clipping, seeded.

``train(cfg, out=DIR)`` trains ``cfg.model`` on ``cfg.task`` and returns a ``TrainResult``.

* Seeded: the model is initialised after ``torch.manual_seed(cfg.seed)`` and the batch of
  step s is ``task.sample(batch_size, batch_seed(seed, "train", s))``: a function of
  (seed, step), so nothing about the data needs saving.
* AdamW (Loshchilov and Hutter, arXiv 1711.05101) with weight decay on matrices only;
  learning rate ``lr * s / warmup`` for the first ``warmup`` steps, then a cosine from
  ``lr`` down to ``lr * min_lr_ratio`` at the last step; the global gradient norm is
  clipped to ``grad_clip``.
* Loss: the token cross-entropy summed over the scored positions of the global batch,
  divided by their number (the same in one process or split over several; see
  ``distributed``).
* Every ``eval_every`` steps (and at the end) the model is scored on ``eval_examples``
  held-out examples (split "eval"); every ``checkpoint_every`` steps (and at the end)
  the run directory gets an atomic checkpoint. ``train`` on a directory that holds one
  resumes from it: a run killed at any moment ends exactly where an uninterrupted run
  with the same config ends (the test kills one with SIGKILL).
* What the stores hand to training (``storelab.stores.base.training_signals``) joins the step:
  the indexers' imitation losses (``"indexer"``: DSA / IndexShare, hierarchical, MSA and CSA
  layers, whose hard top-k passes no gradient; each the KL from the main attention's weights,
  detached, to the indexer's softmax, on the indexer's input detached, so it trains the indexer
  alone; their mean times ``indexer_weight``, 0 = off), the experts' balancing losses
  (``"balance"``, weighted by each MoE config), and after the optimiser step the updates made
  outside the gradient (DeepSeek-V3's routing bias), from the load summed over processes.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from storelab.models.config import ModelConfig, check_fits
from storelab.models.fileformat import check_types
from storelab.models.model import Model
from storelab.stores.base import training_signals
from storelab.tasks import IGNORE, Batch, batch_seed, make_task, task_dict
from storelab.outputs import check_folder
from storelab.train.checkpoint import CHECKPOINT, RUN_FILES, read_checkpoint, restore, save_checkpoint
from storelab.train.distributed import Dist
from storelab.train.models import resolve_model

# fields a resumed run may change without breaking the equality with an uninterrupted run
_RESUMABLE_CHANGES = ("eval_every", "eval_examples", "checkpoint_every", "log_every", "threads")


@dataclass(kw_only=True)
class TrainConfig:
    model: str = "tiny-kimi-k3"
    model_options: dict[str, Any] = field(default_factory=dict)
    task: str = "mqar"
    task_preset: str = "tiny"     # a size preset of the task ("tiny", "small", "full")
    task_options: dict[str, Any] = field(default_factory=dict)
    steps: int = 1000
    batch_size: int = 32          # the global batch
    lr: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup: int = 50
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.98
    grad_clip: float = 1.0
    seed: int = 0
    eval_every: int = 100
    eval_examples: int = 128
    checkpoint_every: int = 100
    log_every: int = 10
    threads: int = 0              # torch threads per process (0: leave as is)
    indexer_weight: float = 1.0   # weight of the indexers' imitation loss (0: off; see the module docstring)

    def __post_init__(self):
        check_types({f.name: getattr(self, f.name) for f in dataclasses.fields(self)}, TrainConfig)
        for n in ("steps", "batch_size", "eval_every", "eval_examples", "checkpoint_every", "log_every"):
            if getattr(self, n) <= 0:
                raise ValueError(f"{n}: must be > 0, got {getattr(self, n)}")
        for n in ("lr", "grad_clip"):
            if getattr(self, n) <= 0:
                raise ValueError(f"{n}: must be > 0, got {getattr(self, n)}")
        if self.warmup < 0:
            raise ValueError(f"warmup: must be >= 0, got {self.warmup}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ValueError(f"min_lr_ratio: must be in [0, 1], got {self.min_lr_ratio}")
        if self.indexer_weight < 0:
            raise ValueError(f"indexer_weight: must be >= 0, got {self.indexer_weight}")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay: must be >= 0, got {self.weight_decay}")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def lr_at(cfg: TrainConfig, step: int) -> float:
    """Learning rate of step ``step`` (0-based): linear warm-up, then cosine to lr * min_lr_ratio."""
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    span = max(1, cfg.steps - cfg.warmup - 1)
    t = min(1.0, (step - cfg.warmup) / span)
    lo = cfg.lr * cfg.min_lr_ratio
    return lo + (cfg.lr - lo) * 0.5 * (1 + math.cos(math.pi * t))


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.AdamW:
    """AdamW; matrices (dim >= 2, embeddings included) decay, vectors and scalars do not."""
    decay, keep = [], []
    for p in unique_params(model):
        (decay if p.dim() >= 2 else keep).append(p)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": keep, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), foreach=False)


def unique_params(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def build(cfg: TrainConfig) -> tuple[Any, ModelConfig, Model]:
    """(task, model config, freshly initialised model) of a training config, seeded."""
    task = make_task(cfg.task, cfg.task_preset, **cfg.task_options)
    mcfg = resolve_model(cfg.model, task.vocab_size, **cfg.model_options)
    check_fits(mcfg, what="model", instead="write a smaller model file" if cfg.model.endswith((".toml", ".json"))
               else f"train its tiny version (--model tiny-{cfg.model}) or a built-in stack")
    torch.manual_seed(cfg.seed)
    return task, mcfg, Model(mcfg)


def auxiliary_losses(sig, cfg: TrainConfig) -> dict[str, torch.Tensor]:
    """The weighted auxiliary losses of a step: ``indexer_kl`` (the indexers' mean imitation loss times
    ``indexer_weight``, when > 0) and ``balance`` (the experts' mean balancing loss, weighted by its configs)."""
    out = {}
    kl, balance = sig.mean("indexer"), sig.mean("balance")
    if kl is not None and cfg.indexer_weight > 0:
        out["indexer_kl"] = cfg.indexer_weight * kl
    if balance is not None:
        out["balance"] = balance
    return out


def token_loss(model: Model, batch: Batch, n_scored: int) -> tuple[torch.Tensor, int, torch.Tensor]:
    """(summed cross-entropy / n_scored, correct predictions, logits) over the batch's scored positions."""
    logits, _ = model(batch.inputs)
    flat_t = batch.targets.reshape(-1)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), flat_t, ignore_index=IGNORE,
                           reduction="sum") / max(n_scored, 1)
    m = flat_t != IGNORE
    correct = int((logits.reshape(-1, logits.shape[-1]).argmax(-1)[m] == flat_t[m]).sum())
    return loss, correct, logits


@torch.no_grad()
def evaluate(model: Model, task, seed: int, n: int, *, split: str = "eval", dist: Dist | None = None,
             chunk: int = 0) -> dict[str, float]:
    """Loss and accuracy on n held-out examples (plus the task's own scores, when it has any).

    ``split="test"`` uses the task's length-generalisation split (``sample_test``) where it has one.
    """
    dist = dist or Dist()
    was = model.training
    model.eval()
    sampler = task.sample_test if split == "test" else task.sample
    batch = sampler(n, batch_seed(seed, split, 0))
    chunk = chunk or max(1, 2**24 // (batch.inputs.shape[1] * task.vocab_size))  # logits of ~64 MB at a time
    split_up = n % dist.world == 0  # otherwise every process scores all n (and nothing is summed)
    lo, hi = dist.shard(n) if split_up else (0, n)
    reduce = dist.sum if split_up else float
    total, correct, extra = 0.0, 0, {}
    for s in range(lo, hi, chunk):
        part = batch.slice(s, min(hi, s + chunk))
        loss, c, logits = token_loss(model, part, 1)
        total, correct = total + loss.item(), correct + c
        for k, v in task.score(logits, part).items():
            extra[k] = extra.get(k, 0.0) + v * len(part)
    model.train(was)
    N = batch.n_scored
    out = {"loss": reduce(total) / N, "acc": reduce(correct) / N}
    for k, v in extra.items():
        out[k] = reduce(v) / n
    return out


@dataclass
class TrainResult:
    model: Model
    model_config: ModelConfig
    task: Any
    step: int
    final_loss: float                 # training loss of the last step
    eval: dict[str, float]            # the last evaluation
    test: dict[str, float]            # the length-generalisation split at the end ({} if the task has none)
    history: list[dict[str, Any]]
    seconds: float
    resumed_from: int = 0


def _check_resume(saved: dict[str, Any], cfg: TrainConfig, path: Path) -> None:
    now = cfg.to_dict()
    for k in sorted(set(saved) | set(now)):
        if k not in _RESUMABLE_CHANGES and saved.get(k) != now.get(k):
            raise ValueError(f"{k}: the checkpoint in {path} was trained with {saved.get(k)!r}, this run asks for "
                             f"{now.get(k)!r} (use another --out, or the same settings to resume)")


def train(cfg: TrainConfig, out: str | Path | None = None, *, resume: bool = True, progress: bool = False,
          dist: Dist | None = None, on_step: Callable[[int, dict[str, float]], None] | None = None,
          max_seconds: float | None = None, force: bool = False) -> TrainResult:
    """Train (or resume) a run; write checkpoints to ``out`` when given.

    ``out`` is checked before any work (``storelab.outputs``): a run folder of its own, an empty or new
    folder, or (``force``) any folder; a storelab save, a Hugging Face folder or a file is refused."""
    dist = dist or Dist()
    if out is not None:
        check_folder(out, "run", RUN_FILES, force=force)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    task, mcfg, model = build(cfg)
    opt = make_optimizer(model, cfg)
    params = unique_params(model)
    start, history = 0, []
    out = Path(out) if out is not None else None
    if out is not None and resume and (out / CHECKPOINT).exists():
        tensors, meta = read_checkpoint(out)
        _check_resume(meta["train_config"], cfg, out)
        restore(tensors, meta, model=model, optimizer=opt)
        start, history = meta["step"], meta.get("history", [])
    resumed_from = start
    meta_static = {"train_config": cfg.to_dict(), "model_config": mcfg.to_dict(), "task": task_dict(task)}

    def checkpoint(step: int) -> None:
        if out is not None and dist.main:
            save_checkpoint(out, model=model, optimizer=opt, step=step, meta={**meta_static, "history": history})
        dist.barrier()

    bar = _Bar(cfg.steps, start, enabled=progress and dist.main)
    t0 = time.time()
    last_loss, last_eval = float("nan"), {}
    model.train()
    step = start
    for step in range(start, cfg.steps):
        lr = lr_at(cfg, step)
        for g in opt.param_groups:
            g["lr"] = lr
        batch = task.sample(cfg.batch_size, batch_seed(cfg.seed, "train", step))
        local = batch.slice(*dist.shard(cfg.batch_size))
        n = batch.n_scored
        with training_signals(ignore=() if cfg.indexer_weight > 0 else ("indexer",)) as sig:
            loss, correct, _ = token_loss(model, local, n)
        aux, total = auxiliary_losses(sig, cfg), loss
        for v in aux.values():  # weighted by this process's share of the global batch
            total = total + v * len(local) / cfg.batch_size
        opt.zero_grad(set_to_none=True)
        total.backward()
        dist.all_reduce_grads(params)
        gnorm = torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], cfg.grad_clip)
        opt.step()
        sig.apply_updates(reduce=dist.sum_tensor)
        last_loss = dist.sum(loss.item())
        acc = dist.sum(correct) / max(n, 1)
        done = step + 1
        row = {"step": done, "loss": last_loss, "acc": acc, "lr": lr, "grad_norm": float(gnorm)}
        for k, v in aux.items():
            row[k] = dist.sum(v.item() * len(local) / cfg.batch_size)
        if done % cfg.log_every == 0 or done == cfg.steps:
            history.append(row)
        if on_step is not None:
            on_step(done, row)
        over_time = max_seconds is not None and dist.sum(float(time.time() - t0 > max_seconds)) > 0  # all agree
        if done % cfg.eval_every == 0 or done == cfg.steps or over_time:
            last_eval = evaluate(model, task, cfg.seed, cfg.eval_examples, dist=dist)
            history.append({"step": done, **{f"eval_{k}": v for k, v in last_eval.items()}})
        bar.update(done, last_loss, acc, last_eval)
        if done % cfg.checkpoint_every == 0 or done == cfg.steps or over_time:
            checkpoint(done)
        if over_time:
            break
    else:
        step = cfg.steps - 1
        if start >= cfg.steps:  # nothing left to do: report the saved state
            last_eval = evaluate(model, task, cfg.seed, cfg.eval_examples, dist=dist)
            last_loss = next((h["loss"] for h in reversed(history) if "loss" in h), float("nan"))
    bar.close()
    test = evaluate(model, task, cfg.seed, cfg.eval_examples, split="test", dist=dist) \
        if task.HAS_TEST_SPLIT else {}
    return TrainResult(model=model, model_config=mcfg, task=task, step=min(step + 1, cfg.steps), final_loss=last_loss,
                       eval=last_eval, test=test, history=history, seconds=time.time() - t0,
                       resumed_from=resumed_from)


def load_trained(path: str | Path) -> tuple[Model, Any, dict[str, Any]]:
    """(model, task, metadata) of a run directory's checkpoint, the model in eval mode."""
    from storelab.tasks import make_task as _make

    tensors, meta = read_checkpoint(path)
    mcfg = ModelConfig.from_dict(meta["model_config"], source=str(path))
    model = Model(mcfg)
    restore(tensors, meta, model=model, rng=False)
    t = dict(meta["task"])
    task = _make(t.pop("name"), **t)
    return model.eval(), task, meta


class _Bar:
    """A rich progress bar on stderr with the loss and accuracy (off when not wanted)."""

    def __init__(self, total: int, start: int, enabled: bool):
        self.p = None
        if not enabled:
            return
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        from storelab.console import err_console

        self.p = Progress(TextColumn("train"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                          TextColumn("{task.fields[info]}"), console=err_console, transient=False)
        self.p.start()
        self.t = self.p.add_task("train", total=total, completed=start, info="")

    def update(self, done: int, loss: float, acc: float, ev: dict[str, float]) -> None:
        if self.p is None:
            return
        info = f"loss {loss:.3f} acc {acc:.3f}"
        if ev:
            info += f" | eval acc {ev.get('acc', float('nan')):.3f}"
        self.p.update(self.t, completed=done, info=info)

    def close(self) -> None:
        if self.p is not None:
            self.p.stop()
