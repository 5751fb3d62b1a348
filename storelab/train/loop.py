"""The training loop: AdamW, linear warm-up then cosine decay, gradient clipping, seeded; one process or many.

``train(cfg, out=DIR)`` trains ``cfg.model`` on ``cfg.task`` and returns a ``TrainResult``.

* Seeded: the model is initialised after ``torch.manual_seed(cfg.seed)`` and the batch of
  step s is ``task.sample(batch_size, batch_seed(seed, "train", s))``: a function of
  (seed, step), so nothing about the data needs saving.
* AdamW (Loshchilov and Hutter, arXiv 1711.05101) with weight decay on matrices only;
  learning rate ``lr * s / warmup`` for the first ``warmup`` steps, then a cosine from
  ``lr`` down to ``lr * min_lr_ratio`` at the last step; the global gradient norm is
  clipped to ``grad_clip``.
* ``batch_size`` is the *global* batch of one optimiser step: it is split over the processes
  (``Dist.shard``) and each process's slice into ``accumulate`` micro-batches, so neither the
  number of processes nor ``accumulate`` changes what is learnt (beyond rounding). The loss of a
  micro-batch is its summed token cross-entropy over the scored positions divided by the number
  of scored positions of the *global* batch, so the gradients summed over micro-batches and
  processes are those of the global batch's mean.
* Several processes (torchrun): ``parallel`` picks torch's engine (``storelab.train.distributed``):
  ``ddp`` (DistributedDataParallel; the default for more than one process), ``fsdp`` (FSDP2,
  parameters, gradients and AdamW state sharded), ``none`` for one process. ``precision="bf16"``:
  bf16 compute with fp32 master weights and fp32 gradient reduction.
* The step's objective is a module (``Objective``): the model's forward, the token loss and the
  auxiliary losses, so DDP sees, among its outputs, every loss the backward pass runs through.
* Every ``eval_every`` steps (and at the end) the model is scored on ``eval_examples``
  held-out examples (split "eval"); every ``checkpoint_every`` steps (and at the end)
  the run directory gets an atomic DCP checkpoint (``storelab.train.checkpoint``). ``train`` on
  a directory that holds one resumes from it, on any number of processes: a run killed at any
  moment ends where an uninterrupted run with the same config ends (the tests kill one with SIGKILL).
* Extending a run: ``steps`` may grow on resume (a finished run continues). The schedule is
  always the current config's: from the resume step on, the learning rate is ``lr_at(cfg, s)``
  with the new total, so the cosine is stretched to the new end and the learning rate jumps at
  the resume step from the old schedule's value to the new one's. An extended run therefore
  differs from a run started with the larger ``steps``; the checkpoint's ``schedule`` lists each
  segment (first step, total steps).
* What the stores hand to training (``storelab.stores.base.training_signals``) joins the step:
  the indexers' imitation losses (``"indexer"``: DSA / IndexShare, hierarchical, MSA and CSA
  layers, whose hard top-k passes no gradient; each the KL from the main attention's weights,
  detached, to the indexer's softmax, on the indexer's input detached, so it trains the indexer
  alone; their mean times ``indexer_weight``, 0 = off), the experts' balancing losses
  (``"balance"``, weighted by each MoE config), each weighted by its micro-batch's share of the
  global batch, and after the optimiser step the updates made outside the gradient (DeepSeek-V3's
  routing bias), from the load summed over processes -- one per micro-batch, so with
  ``accumulate`` > 1 the bias takes that many steps per optimiser step (and the balancing loss,
  a function of a whole batch, is that of each micro-batch): MoE runs are equal across world
  sizes and accumulation only where their routing statistics are per micro-batch.
"""

from __future__ import annotations

import dataclasses
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from storelab.allocator import keep_freed_memory
from storelab.models.config import ModelConfig, check_fits
from storelab.models.fileformat import check_types
from storelab.models.model import Model
from storelab.stores.base import TrainingSignals, training_signals
from storelab.tasks import IGNORE, Batch, batch_seed, make_task, task_dict
from storelab.outputs import check_folder
from storelab.train.checkpoint import RUN_FILES, Checkpointer, has_checkpoint, load_state, read_meta
from storelab.train.distributed import PARALLEL, PRECISIONS, Dist, default_parallel, engine
from storelab.train.models import resolve_model

# fields a resumed run may change without breaking the equality with an uninterrupted run (``steps``:
# only upwards, see the module docstring; ``parallel`` and ``accumulate``: equal up to rounding)
_RESUMABLE_CHANGES = ("eval_every", "eval_examples", "checkpoint_every", "log_every", "threads", "steps",
                      "parallel", "accumulate")


@dataclass(kw_only=True)
class TrainConfig:
    model: str = "tiny-kimi-k3"
    model_options: dict[str, Any] = field(default_factory=dict)
    task: str = "mqar"
    task_preset: str = "tiny"     # a size preset of the task ("tiny", "small", "full")
    task_options: dict[str, Any] = field(default_factory=dict)
    steps: int = 1000
    batch_size: int = 32          # the global batch of one optimiser step (all processes, all micro-batches)
    accumulate: int = 1           # micro-batches per process and step (gradient accumulation)
    parallel: str = "auto"        # auto (ddp for several processes, none for one), none, ddp, fsdp
    precision: str = "fp32"       # fp32, or bf16 (bf16 compute, fp32 master weights and reduction)
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
        for n in ("steps", "batch_size", "accumulate", "eval_every", "eval_examples", "checkpoint_every",
                  "log_every"):
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
        if self.parallel not in ("auto",) + PARALLEL:
            raise ValueError(f"parallel: one of auto, {', '.join(PARALLEL)}, got {self.parallel!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision: one of {', '.join(PRECISIONS)}, got {self.precision!r}")

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


def _to(batch: Batch, device: torch.device) -> Batch:
    if device.type == "cpu":
        return batch
    return Batch(batch.inputs.to(device), batch.targets.to(device), {k: v.to(device) for k, v in batch.meta.items()})


def _scored(logits: torch.Tensor, targets: torch.Tensor, n_scored: int) -> tuple[torch.Tensor, torch.Tensor]:
    flat_t = targets.reshape(-1)
    flat = logits.reshape(-1, logits.shape[-1])
    loss = F.cross_entropy(flat.float(), flat_t, ignore_index=IGNORE, reduction="sum") / max(n_scored, 1)
    m = flat_t != IGNORE
    return loss, (flat.argmax(-1)[m] == flat_t[m]).sum()


def token_loss(model: Model, batch: Batch, n_scored: int) -> tuple[torch.Tensor, int, torch.Tensor]:
    """(summed cross-entropy / n_scored, correct predictions, logits) over the batch's scored positions."""
    logits, _ = model(batch.inputs)
    loss, correct = _scored(logits, batch.targets, n_scored)
    return loss, int(correct), logits


class Objective(torch.nn.Module):
    """One micro-batch's objective as a module: ``forward(inputs, targets, n_scored, share)`` returns
    (total, token loss, correct, weighted auxiliary losses, the signals). ``share`` is the micro-batch's
    share of the global batch (it weights the auxiliary losses); the total is what ``backward`` runs on."""

    def __init__(self, model: Model, cfg: TrainConfig):
        super().__init__()
        self.model, self.cfg = model, cfg

    def forward(self, inputs: torch.Tensor, targets: torch.Tensor, n_scored: int, share: float):
        with training_signals(ignore=() if self.cfg.indexer_weight > 0 else ("indexer",)) as sig:
            logits, _ = self.model(inputs)
        loss, correct = _scored(logits, targets, n_scored)
        aux = {k: v * share for k, v in auxiliary_losses(sig, self.cfg).items()}
        total = loss
        for v in aux.values():
            total = total + v
        return total, loss, correct, aux, sig


@torch.no_grad()
def evaluate(model: Model, task, seed: int, n: int, *, split: str = "eval", dist: Dist | None = None,
             chunk: int = 0) -> dict[str, float]:
    """Loss and accuracy on n held-out examples (plus the task's own scores, when it has any).

    ``split="test"`` uses the task's length-generalisation split (``sample_test``) where it has one.
    Under FSDP2 every process must call it (each forward all-gathers the weights)."""
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
        part = _to(batch.slice(s, min(hi, s + chunk)), dist.device)
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
    parallel: str = "none"            # the engine the run used
    optimizer: Any = None             # its AdamW (under FSDP2 stepping the local shards)


def _check_resume(saved: dict[str, Any], cfg: TrainConfig, path: Path, step: int) -> None:
    now = cfg.to_dict()
    for k in sorted(set(saved) | set(now)):
        if k not in _RESUMABLE_CHANGES and saved.get(k, TrainConfig().to_dict().get(k)) != now.get(k):
            raise ValueError(f"{k}: the checkpoint in {path} was trained with {saved.get(k)!r}, this run asks for "
                             f"{now.get(k)!r} (use another --out, or the same settings to resume)")
    if cfg.steps < step:
        raise ValueError(f"steps: the checkpoint in {path} is at step {step}, this run asks for {cfg.steps} steps "
                         "(a run can be extended, not shortened: use another --out)")


def train(cfg: TrainConfig, out: str | Path | None = None, *, resume: bool = True, progress: bool = False,
          dist: Dist | None = None, on_step: Callable[[int, dict[str, float]], None] | None = None,
          max_seconds: float | None = None, force: bool = False, async_checkpoint: bool = False) -> TrainResult:
    """Train (or resume) a run; write checkpoints to ``out`` when given (``async_checkpoint``: in the
    background, ``storelab.train.checkpoint.Checkpointer``). A collective under torchrun: every process
    calls it with the same config.

    ``out`` is checked before any work (``storelab.outputs``): a run folder of its own, an empty or new
    folder, or (``force``) any folder; a storelab save, a Hugging Face folder or a file is refused."""
    dist = dist or Dist()
    if out is not None:
        check_folder(out, "run", RUN_FILES, force=force)
    if cfg.batch_size % (dist.world * cfg.accumulate):
        raise ValueError(f"batch_size: the global batch {cfg.batch_size} does not split into {dist.world} "
                         f"process(es) x {cfg.accumulate} micro-batch(es)")
    if cfg.threads:
        cores = os.cpu_count() or 1
        if cfg.threads > cores:  # checked here, not in TrainConfig: a run resumed on a smaller machine still reads
            raise ValueError(f"threads: {cfg.threads} torch threads per process, more than this machine's {cores} "
                             f"cores (--threads at most {cores}, or 0 for torch's default)")
        torch.set_num_threads(cfg.threads)
    keep_freed_memory()  # each step's activations reuse the last step's pages (``storelab.allocator``)
    eng = engine(default_parallel(dist.world) if cfg.parallel == "auto" else cfg.parallel, dist, cfg.precision)
    task, mcfg, model = build(cfg)
    model = eng.prepare(model.to(dist.device))
    opt = make_optimizer(model, cfg)  # after sharding: under FSDP2 it steps the local shards
    step_fn = eng.wrap(Objective(model, cfg))
    params = unique_params(model)
    start, history, schedule = 0, [], [{"from": 0, "steps": cfg.steps}]
    out = Path(out) if out is not None else None
    if out is not None and resume and has_checkpoint(out):
        saved = read_meta(out)
        _check_resume(saved["train_config"], cfg, out, saved["step"])
        meta = load_state(out, model=model, optimizer=opt)
        start, history = meta["step"], meta.get("history", [])
        schedule = meta.get("schedule", [{"from": 0, "steps": meta["train_config"]["steps"]}])
        if schedule[-1]["steps"] != cfg.steps:
            schedule.append({"from": start, "steps": cfg.steps})
    resumed_from = start
    meta_static = {"train_config": cfg.to_dict(), "model_config": mcfg.to_dict(), "task": task_dict(task),
                   "world": dist.world, "parallel": eng.name, "schedule": schedule}

    ckpt = Checkpointer(out, rank=dist.rank, barrier=dist.barrier, asynchronous=async_checkpoint) \
        if out is not None else None

    def checkpoint(step: int) -> None:
        if ckpt is not None:
            ckpt.save(step, model=model, optimizer=opt, meta={**meta_static, "history": history})

    bar = _Bar(cfg.steps, start, enabled=progress and dist.main)
    t0 = time.time()
    last_loss, last_eval = float("nan"), {}
    model.train()
    step = start
    lo, hi = dist.shard(cfg.batch_size)
    micro = (hi - lo) // cfg.accumulate
    for step in range(start, cfg.steps):
        if ckpt is not None:
            ckpt.poll()
        lr = lr_at(cfg, step)
        for g in opt.param_groups:
            g["lr"] = lr
        batch = task.sample(cfg.batch_size, batch_seed(cfg.seed, "train", step))
        n = batch.n_scored
        opt.zero_grad(set_to_none=True)
        loss_sum, correct_sum, aux_sum, signals = 0.0, 0, {}, []
        for j in range(cfg.accumulate):
            part = _to(batch.slice(lo + j * micro, lo + (j + 1) * micro), dist.device)
            with eng.sync(step_fn, j == cfg.accumulate - 1):
                with eng.autocast():
                    total, loss, correct, aux, sig = step_fn(part.inputs, part.targets, n, len(part) / cfg.batch_size)
                (total * eng.loss_scale).backward()
            loss_sum, correct_sum = loss_sum + loss.item(), correct_sum + int(correct)
            for k, v in aux.items():
                aux_sum[k] = aux_sum.get(k, 0.0) + v.item()
            signals.append(sig)
        gnorm = torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], cfg.grad_clip)
        opt.step()
        TrainingSignals.merged(signals).apply_updates(reduce=dist.sum_tensor)  # once, as for the whole batch
        last_loss = dist.sum(loss_sum)
        acc = dist.sum(correct_sum) / max(n, 1)
        done = step + 1
        row = {"step": done, "loss": last_loss, "acc": acc, "lr": lr, "grad_norm": float(eng.full(gnorm))}
        for k, v in aux_sum.items():
            row[k] = dist.sum(v)
        if done % cfg.log_every == 0 or done == cfg.steps:
            history.append(row)
        if on_step is not None:
            on_step(done, row)
        over_time = max_seconds is not None and dist.sum(float(time.time() - t0 > max_seconds)) > 0  # all agree
        if done % cfg.eval_every == 0 or done == cfg.steps or over_time:
            with eng.autocast():
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
            with eng.autocast():
                last_eval = evaluate(model, task, cfg.seed, cfg.eval_examples, dist=dist)
            last_loss = next((h["loss"] for h in reversed(history) if "loss" in h), float("nan"))
    bar.close()
    if ckpt is not None:
        ckpt.close()  # the last checkpoint is whole when train returns
    with eng.autocast():
        test = evaluate(model, task, cfg.seed, cfg.eval_examples, split="test", dist=dist) \
            if task.HAS_TEST_SPLIT else {}
    return TrainResult(model=model, model_config=mcfg, task=task, step=min(step + 1, cfg.steps), final_loss=last_loss,
                       eval=last_eval, test=test, history=history, seconds=time.time() - t0,
                       resumed_from=resumed_from, parallel=eng.name, optimizer=opt)


def load_trained(path: str | Path, *, device: str | torch.device = "cpu",
                 dtype: str | torch.dtype | None = None) -> tuple[Model, Any, dict[str, Any]]:
    """(model, task, metadata) of a run directory's checkpoint (any world size wrote it), in eval mode,
    in this process alone; read on the CPU in fp32 (its master weights), then moved to ``device`` in
    ``dtype`` (a name of ``storelab.checkpoint.loader.DTYPE_NAMES``; None: fp32)."""
    from storelab.checkpoint.loader import resolve_dtype
    from storelab.tasks import make_task as _make

    meta = read_meta(path)
    mcfg = ModelConfig.from_dict(meta["model_config"], source=str(path))
    model = Model(mcfg)
    load_state(path, model=model, rng=False, collective=False)
    t = dict(meta["task"])
    task = _make(t.pop("name"), **t)
    return model.to(device=device, dtype=resolve_dtype(dtype or "fp32", {})).eval(), task, meta


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
