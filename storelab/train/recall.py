"""The recall benchmark: MQAR accuracy against state size (after Zoology's figure, arXiv 2312.04927).

For each store (full attention, sliding window, Gated DeltaNet, KDA, and a 3:1 KDA:attention
hybrid), each model width and each number of key-value pairs, train a small model on MQAR
sequences of ``seq_len`` tokens and score it on held-out ones. The state size is measured,
not estimated: the bytes of the model's cache after reading one ``seq_len``-token sequence
(fp32), summed over layers -- for attention it grows with the context, for a recurrent layer
it is one matrix per head. Zoology's finding: at equal state size attention recalls best, and
recurrent models need a larger state for the same accuracy as the number of pairs grows.

``run_recall(bench) -> rows`` (one dict per run) and ``plot_recall(rows, path)`` (one panel per
number of pairs, accuracy against state bytes on a log axis, one line per store).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from storelab.models.model import prefill
from storelab.outputs import atomic_path
from storelab.train.loop import TrainConfig, train

STORES = ("attention", "window", "gated_deltanet", "kda", "hybrid")
FILES = ("recall.json", "recall.png")  # what the benchmark's folder holds (storelab.outputs)


@dataclass(kw_only=True)
class RecallBench:
    models: tuple[str, ...] = STORES
    widths: tuple[int, ...] = (16, 32, 64)
    pairs: tuple[int, ...] = (4, 8, 16)
    seq_len: int = 64
    vocab_size: int = 128
    n_layers: int = 4                 # the hybrid's 3:1 needs four
    window: int = 16
    steps: int = 300
    batch_size: int = 32
    lr: float = 3e-3
    seed: int = 0
    eval_examples: int = 128

    def __post_init__(self):
        from storelab.train.models import BUILTIN

        for m in self.models:
            if m not in BUILTIN and not m.startswith("pattern:"):
                raise ValueError(f"models: unknown stack {m!r} (known: {', '.join(BUILTIN)}, pattern:KKKA)")
        for n in ("models", "widths", "pairs"):
            if not getattr(self, n):
                raise ValueError(f"{n}: give at least one")
        for n in ("seq_len", "vocab_size", "n_layers", "window", "steps", "batch_size", "eval_examples"):
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{n}: must be a positive integer, got {v!r}")
        for p in self.pairs:
            if 4 * p > self.seq_len:
                raise ValueError(f"pairs: {p} pairs need seq_len >= {4 * p}, got {self.seq_len}")
            if p >= self.vocab_size // 2:
                raise ValueError(f"pairs: {p} pairs need more than {2 * p} tokens of vocabulary")
        for w in self.widths:
            if w % 2:
                raise ValueError(f"widths: {w} is odd (two heads of width d_model / 2)")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def config(self, model: str, width: int, pairs: int) -> TrainConfig:
        opts = dict(d_model=width, n_layers=self.n_layers, n_heads=2, head_dim=width // 2, d_ff=2 * width)
        if model == "window":
            opts["window"] = self.window
        return TrainConfig(model=model, model_options=opts, task="mqar", task_preset="full",
                           task_options={"vocab_size": self.vocab_size, "mix": [[self.seq_len, pairs]],
                                         "test_mix": [[2 * self.seq_len, pairs]]},
                           steps=self.steps, batch_size=self.batch_size, lr=self.lr, warmup=max(1, self.steps // 10),
                           seed=self.seed, eval_every=self.steps, eval_examples=self.eval_examples)


def state_bytes(model, seq_len: int) -> int:
    """Bytes of the cache after one sequence of ``seq_len`` tokens (batch 1, fp32)."""
    ids = torch.zeros(1, seq_len, dtype=torch.long)
    _, cache = prefill(model, ids)
    return sum(st.nbytes() for st in cache)


def run_recall(bench: RecallBench, *, progress: bool = False) -> list[dict]:
    rows = []
    for model in bench.models:
        for pairs in bench.pairs:
            for width in bench.widths:
                r = train(bench.config(model, width, pairs))
                rows.append({"model": model, "d_model": width, "pairs": pairs,
                             "state_bytes": state_bytes(r.model, bench.seq_len), "acc": r.eval["acc"],
                             "acc_twice_longer": r.test.get("acc"),
                             "loss": r.eval["loss"], "seconds": r.seconds,
                             "params": sum(p.numel() for p in r.model.parameters())})
                if progress:
                    from storelab.console import err_console

                    x = rows[-1]
                    took = f"{x['seconds']:,.1f} s" if x["seconds"] >= 1 else f"{x['seconds'] * 1000:,.0f} ms"
                    err_console.print(f"recall {model:>15} d={width:<4} pairs={pairs:<3} state={x['state_bytes']:>8} "
                                      f"acc={x['acc']:.3f} ({took})")
    return rows


def plot_recall(rows: list[dict], path: str | Path) -> Path:
    """One panel per number of pairs: accuracy against state bytes, one line per store."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    pairs = sorted({r["pairs"] for r in rows})
    fig, axes = plt.subplots(1, len(pairs), figsize=(4 * len(pairs), 3.4), sharey=True, squeeze=False)
    for ax, p in zip(axes[0], pairs):
        for model in dict.fromkeys(r["model"] for r in rows):
            pts = sorted((r["state_bytes"], r["acc"]) for r in rows if r["pairs"] == p and r["model"] == model)
            if pts:
                ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=model)
        ax.set_xscale("log")
        ax.set_title(f"{p} key-value pairs")
        ax.set_xlabel("state bytes after the sequence")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("MQAR accuracy")
    axes[0][-1].legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120)
    plt.close(fig)
    return path
