"""Training within a time budget, and a dictionary hybrid trained that way (quick probe experiments).

``train_for(cfg, seconds)`` times a few steps of the configured model first, then sets
``steps`` so the whole run (its cosine schedule included) fits the budget; the run also
stops at the budget should the machine slow down.

``train_dictionary_hybrid(seconds_budget, seed, *, pairs=None) -> (model, metrics)`` trains, within a
time budget, a tiny 3:1 KDA:attention hybrid (the layout of Kimi K3 and Qwen3.8, 4 layers, width 64, 217,574
parameters on the "small" preset) on the dictionary-and-language task, the task that separates
content from settings, for quick experiments with the probes ``state_swap`` and ``keep_one``. The
report's sections 7 and 8 no longer train: they probe the shipped subjects (``storelab.subjects``),
trained by fixed recipes until they do the task. ``pairs``
sets the entries per prompt (``dictionary_task_options``), so the same hybrid can read longer
dictionaries: ``REPORT_PAIRS`` (24 to 73 entries) is four times the preset's 41-token prompts.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import torch

from storelab.allocator import keep_freed_memory
from storelab.tasks import batch_seed, make_task, task_dict
from storelab.train.loop import TrainConfig, TrainResult, build, make_optimizer, token_loss, train


def step_seconds(cfg: TrainConfig, trials: int = 3) -> float:
    """Seconds of one training step of this config (median of a few, after a warm-up step), under the
    allocator setting ``train`` runs with (without it the steps would be timed with their page faults)."""
    keep_freed_memory()
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


# The report's run (issue 16, item 6): 24 to 73 entries a prompt, 163-token prompts, four times the
# "small" preset's 41 (6 to 12 entries), in the same time budget, now that the chunked ops train. More
# entries than the recurrent state's per-head d (32) is the large models' regime, where a stored value
# cannot all sit in the state; ten times the parameters on 12-entry prompts would not change that.
REPORT_PAIRS = (24, 73)


def dictionary_task_options(pairs: tuple[int, int] | None = None, n_symbols: int | None = None) -> dict[str, int]:
    """Task options for prompts of ``pairs`` = (fewest, most) entries (None: the preset's own).

    ``n_symbols`` keys and as many values (default: the most entries + 8, at least the preset's 32):
    the swap probe needs a value the dictionary does not hold, and a sweep keeps one vocabulary for
    all its points by passing the same ``n_symbols``."""
    if pairs is None:
        return {}
    lo, hi = pairs
    if not 1 <= lo <= hi:
        raise ValueError(f"pairs: expected 1 <= fewest <= most, got {pairs}")
    n = max(32, hi + 8) if n_symbols is None else n_symbols
    if n <= hi:
        raise ValueError(f"n_symbols: {n} keys and values cannot hold {hi} entries and a spare value")
    return dict(pairs_min=lo, pairs_max=hi, n_keys=n, n_values=n)


def dictionary_config(seed: int = 0, *, pairs: tuple[int, int] | None = None, n_symbols: int | None = None,
                      **overrides: Any) -> TrainConfig:
    """The dictionary hybrid's training config (steps set by the budget); ``pairs`` and ``n_symbols``
    as in ``dictionary_task_options``."""
    base = dict(model="hybrid", model_options=dict(d_model=64, n_layers=4, n_heads=2, head_dim=32, d_ff=128),
                task="dictionary", task_preset="small", batch_size=32, lr=3e-3, warmup=30, seed=seed,
                eval_examples=128, task_options=dictionary_task_options(pairs, n_symbols))
    return TrainConfig(**{**base, **overrides})


def train_dictionary_hybrid(seconds_budget: float = 180.0, seed: int = 0, *, out: str | Path | None = None,
                            pairs: tuple[int, int] | None = None, n_symbols: int | None = None,
                            **overrides: Any) -> tuple[torch.nn.Module, dict[str, Any]]:
    """A tiny 3:1 KDA:attention hybrid trained on the dictionary-and-language task within the budget.

    Returns the model (eval mode) and its metrics: steps, seconds, final training loss, and on
    held-out prompts the answer accuracy, retrieval (right value) and compliance (right language);
    the prompt length, the entries a prompt holds, and the recurrent state's per-head key width.
    """
    r = train_for(dictionary_config(seed, pairs=pairs, n_symbols=n_symbols, **overrides), seconds_budget, out)
    metrics = {"model": r.model_config.name, "mix": r.model_config.mix(), "task": r.task.NAME,
               "steps": r.step, "seconds": r.seconds, "final_loss": r.final_loss,
               "eval_loss": r.eval.get("loss"), "eval_acc": r.eval.get("acc"),
               "retrieval": r.eval.get("retrieval"), "compliance": r.eval.get("compliance"),
               "chance": {"retrieval": 1 / r.task.n_values, "compliance": 1 / r.task.n_languages},
               "params": sum(p.numel() for p in r.model.parameters()), "seed": seed,
               "prompt_tokens": r.task.sample(1, 0).inputs.shape[1], "pairs": [r.task.pairs_min, r.task.pairs_max],
               "state_head_dims": sorted({lay.token.head_k_dim for lay in r.model_config.layers if lay.token.RECURRENT})}
    metrics["task_config"] = task_dict(r.task)  # make_task(**...) rebuilds it for the probes
    return r.model.eval(), metrics


def dictionary_task(preset: str = "small"):
    """The task ``train_dictionary_hybrid`` trains on (for the probes)."""
    return make_task("dictionary", preset)
