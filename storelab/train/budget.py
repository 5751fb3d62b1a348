"""Training within a time budget, and the dictionary hybrid the report's probes run on.

``train_for(cfg, seconds)`` times a few steps of the configured model first, then sets
``steps`` so the whole run (its cosine schedule included) fits the budget; the run also
stops at the budget should the machine slow down.

``train_dictionary_hybrid(seconds_budget, seed) -> (model, metrics)`` trains a tiny 3:1
KDA:attention hybrid (the layout of Kimi K3 and Qwen3.8, 4 layers, width 64) on the
dictionary-and-language task, the task that separates content from settings; the probes
``state_swap`` and ``keep_one`` are then run on it.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import torch

from storelab.tasks import batch_seed, make_task, task_dict
from storelab.train.loop import TrainConfig, TrainResult, build, make_optimizer, token_loss, train


def step_seconds(cfg: TrainConfig, trials: int = 3) -> float:
    """Seconds of one training step of this config (median of a few, after a warm-up step)."""
    task, _, model = build(cfg)
    opt = make_optimizer(model, cfg)
    times = []
    for s in range(trials + 1):
        t0 = time.perf_counter()
        b = task.sample(cfg.batch_size, batch_seed(cfg.seed, "train", s))
        loss, _, _ = token_loss(model, b, b.n_scored)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return sorted(times[1:])[len(times[1:]) // 2]


def train_for(cfg: TrainConfig, seconds: float, out: str | Path | None = None, *, min_steps: int = 20,
              progress: bool = False) -> TrainResult:
    """Train with as many steps as fit in ``seconds`` (evaluations included); never past the budget."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    t0 = time.perf_counter()
    per = step_seconds(cfg)
    left = seconds - (time.perf_counter() - t0)
    steps = max(min_steps, int(0.8 * left / per))  # 20 % for evaluations and a slower machine
    cfg = dataclasses.replace(cfg, steps=steps, eval_every=max(1, steps // 4), checkpoint_every=steps,
                              warmup=min(cfg.warmup, max(1, steps // 10)))
    return train(cfg, out, resume=False, progress=progress,
                 max_seconds=max(1.0, seconds - (time.perf_counter() - t0)))


def dictionary_config(seed: int = 0, **overrides: Any) -> TrainConfig:
    """The dictionary hybrid's training config (steps set by the budget)."""
    base = dict(model="hybrid", model_options=dict(d_model=64, n_layers=4, n_heads=2, head_dim=32, d_ff=128),
                task="dictionary", task_preset="small", batch_size=32, lr=3e-3, warmup=30, seed=seed,
                eval_examples=128)
    return TrainConfig(**{**base, **overrides})


def train_dictionary_hybrid(seconds_budget: float = 180.0, seed: int = 0, *, out: str | Path | None = None,
                            **overrides: Any) -> tuple[torch.nn.Module, dict[str, Any]]:
    """A tiny 3:1 KDA:attention hybrid trained on the dictionary-and-language task within the budget.

    Returns the model (eval mode) and its metrics: steps, seconds, final training loss, and on
    held-out prompts the answer accuracy, retrieval (right value) and compliance (right language).
    """
    r = train_for(dictionary_config(seed, **overrides), seconds_budget, out)
    metrics = {"model": r.model_config.name, "mix": r.model_config.mix(), "task": r.task.NAME,
               "steps": r.step, "seconds": r.seconds, "final_loss": r.final_loss,
               "eval_loss": r.eval.get("loss"), "eval_acc": r.eval.get("acc"),
               "retrieval": r.eval.get("retrieval"), "compliance": r.eval.get("compliance"),
               "chance": {"retrieval": 1 / r.task.n_values, "compliance": 1 / r.task.n_languages},
               "params": sum(p.numel() for p in r.model.parameters()), "seed": seed}
    metrics["task_config"] = task_dict(r.task)  # make_task(**...) rebuilds it for the probes
    return r.model.eval(), metrics


def dictionary_task(preset: str = "small"):
    """The task ``train_dictionary_hybrid`` trains on (for the probes)."""
    return make_task("dictionary", preset)
