"""The capacity lab: every capacity figure of the essay's section 2 (and sections 3 and 6) as a rerunnable
experiment that prints theory, the essay's figure and the measured value side by side.

    from storelab.capacity import run
    rows = run(["outer", "attention"], quick=True, plot_dir="out/")

Each experiment family lives in its own module; ``EXPERIMENTS`` maps a name (or its number in the
issue's list) to the function. Every row is a dict with keys experiment, d, criterion, theory, essay,
measured, ratio (measured/essay) and note.

| #  | name           | module      | essay figure                                              |
|----|----------------|-------------|-----------------------------------------------------------|
| 1  | outer          | linear      | clean recall up to d                                      |
| 2  | lstsq          | linear      | exact up to d, ISR = 1 at about 2d                        |
| 3  | delta          | linear      | Widrow-Hoff writes approach least squares                 |
| 4  | discrimination | linear      | n ln n = d^2/8 (about 350), d^2/2 (1,160; 1,800 finite)   |
| 5  | feedforward    | feedforward | ReLU x2, ReLU^2 2d^2/3 (2,700 at d=64), order d^p         |
| 6  | attention      | attention   | exp(2 beta (1 - beta/d)): 1.2 million at d=64, beta=8     |
| 7  | logn           | attention   | LogN beta nearly perfect to two million entries           |
| 8  | hopfield       | hopfield    | 0.138 N, 1.5 % wrong bits, N/(2 ln N), N/(4 ln N), 2N, N^(n-1), 2^(N/2) |
| 9  | sdm            | sdm         | 1-5 % of the locations; attention approximates the read   |
| 10 | compression    | compression | pooled facts cannot be separated; a spread fact can be read |
| 11 | recurrence     | recurrence  | affine scan in ceil(log2 L) rounds; beta = 2 tracks parity |
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path
from typing import Callable, Iterable

import torch

from storelab.capacity import attention, compression, feedforward, hopfield, linear, recurrence, sdm
from storelab.capacity.common import Result
from storelab.capacity.linear import worked_example_1

__all__ = ["EXPERIMENTS", "run", "resolve", "worked_example_1"]

EXPERIMENTS: dict[str, Callable[[bool], Result]] = {
    "outer": linear.exp_outer,
    "lstsq": linear.exp_lstsq,
    "delta": linear.exp_delta,
    "discrimination": linear.exp_discrimination,
    "feedforward": feedforward.exp_feedforward,
    "attention": attention.exp_attention,
    "logn": attention.exp_logn,
    "hopfield": hopfield.exp_hopfield,
    "sdm": sdm.exp_sdm,
    "compression": compression.exp_compression,
    "recurrence": recurrence.exp_recurrence,
}
NUMBERS = {str(i + 1): name for i, name in enumerate(EXPERIMENTS)}


def resolve(names: Iterable[str] | None) -> list[str]:
    """Experiment names from names or numbers (1-11), in the issue's order; None or empty means all."""
    if not names:
        return list(EXPERIMENTS)
    chosen = set()
    for n in names:
        key = NUMBERS.get(str(n), str(n))
        if key not in EXPERIMENTS:
            raise ValueError(f"experiment: unknown {n!r}; choose from {', '.join(EXPERIMENTS)} or 1-{len(EXPERIMENTS)}")
        chosen.add(key)
    return [k for k in EXPERIMENTS if k in chosen]


@contextlib.contextmanager
def _single_thread():
    # the experiments are many small tensor ops; on a shared 2-core machine a second thread mostly waits
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def run(names: Iterable[str] | None = None, quick: bool = False, plot_dir: str | Path | None = None,
        progress: bool = True, force: bool = False) -> list[dict]:
    """Run the named experiments (all by default) and return their table rows.

    quick: smaller sizes, same code (for the tests). plot_dir: write one PNG per curve there, plus
    ``capacity.json`` with the run's settings and rows; the folder is checked before the experiments
    run (``storelab.outputs``: a capacity folder, a new or empty one, or ``force``). progress: a
    progress bar on stderr.
    """
    todo = resolve(names)
    if plot_dir is not None:
        from storelab.outputs import check_folder

        check_folder(plot_dir, "capacity", ("capacity.json", "*.png"), force=force, option="--plot")
    rows: list[dict] = []
    results: dict[str, Result] = {}
    timings: dict[str, dict[str, float]] = {}
    bar = _progress(progress)
    with bar, _single_thread():
        task = bar.add_task("capacity", total=len(todo)) if bar else None
        for name in todo:
            if bar:
                bar.update(task, description=f"capacity: {name}")
            t0, c0 = time.perf_counter(), time.process_time()
            res = EXPERIMENTS[name](quick)
            timings[name] = {"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0}
            results[name] = res
            rows += res.rows
            if bar:
                bar.advance(task)
    if plot_dir is not None:
        from storelab.capacity.plots import write_plots
        from storelab.outputs import atomic_write

        out = Path(plot_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_plots(results, out)
        atomic_write(out / "capacity.json", json.dumps({"experiments": todo, "quick": quick, "seconds": timings,
                                                        "rows": rows}, indent=2))
    return rows


class _NoBar(contextlib.nullcontext):
    def __bool__(self) -> bool:
        return False


def _progress(enabled: bool):
    if not enabled:
        return _NoBar()
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                    TimeElapsedColumn(), console=Console(stderr=True), transient=True)
