"""``storelab train``: train a small model on a synthetic task; ``storelab recall``: the recall benchmark.

``storelab train --model tiny-kimi-k3 --task mqar --steps 500 --out runs/k3`` trains with
AdamW, warm-up and cosine decay, clipping and a progress bar; it checkpoints to ``--out``
and resumes from there when run again. Under ``torchrun --nproc-per-node 2 -m storelab
train ...`` the processes split each global batch (gloo, on the CPU).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from storelab.console import console, emit_json, err_console, table


def parse_options(items: list[str] | None, what: str) -> dict:
    """``key=value`` pairs; values are read as JSON when they parse (numbers, lists), else strings."""
    out = {}
    for it in items or []:
        if "=" not in it:
            raise ValueError(f"{what}: expected key=value, got {it!r}")
        k, v = it.split("=", 1)
        try:
            out[k.strip()] = json.loads(v)
        except json.JSONDecodeError:
            out[k.strip()] = v
    return out


def register(app: typer.Typer) -> None:
    @app.command()
    def train(
        model: str = typer.Option("tiny-kimi-k3", "--model", help="tiny-<zoo name>, a model file, or a built-in "
                                  "stack: attention, window, gated_deltanet, kda, hybrid, pattern:KKKA."),
        task: str = typer.Option("mqar", "--task", help="mqar, dictionary, parity, selective_copy."),
        size: str = typer.Option("tiny", "--size", help="Task size preset: tiny (seconds to minutes on a CPU), "
                                 "small, full (Zoology's)."),
        steps: int = typer.Option(1000, "--steps"),
        out: Path = typer.Option(None, "--out", help="Run directory: checkpoints, resumed from when present."),
        batch_size: int = typer.Option(32, "--batch-size", help="Global batch (split over torchrun processes)."),
        lr: float = typer.Option(3e-3, "--lr"),
        warmup: int = typer.Option(50, "--warmup"),
        seed: int = typer.Option(0, "--seed"),
        eval_every: int = typer.Option(100, "--eval-every"),
        checkpoint_every: int = typer.Option(100, "--checkpoint-every"),
        threads: int = typer.Option(0, "--threads", help="Torch threads per process (0: torch's default)."),
        indexer_weight: float = typer.Option(1.0, "--indexer-weight", help="Weight of the indexers' imitation "
                                             "of the main attention (DSA, hierarchical, MSA, CSA; 0: off)."),
        task_opt: list[str] = typer.Option(None, "--task-opt", help="Task option key=value (repeatable)."),
        model_opt: list[str] = typer.Option(None, "--model-opt", help="Built-in stack option key=value."),
        fresh: bool = typer.Option(False, "--fresh", help="Ignore a checkpoint in --out and start over."),
        json_: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """Train a model on a synthetic task (AdamW, warm-up + cosine, clipping, checkpoints, resume)."""
        from storelab.train.distributed import Dist
        from storelab.train.loop import TrainConfig, train as run

        try:
            cfg = TrainConfig(model=model, task=task, task_preset=size, steps=steps, batch_size=batch_size, lr=lr,
                              warmup=warmup, seed=seed, eval_every=eval_every, checkpoint_every=checkpoint_every,
                              threads=threads, indexer_weight=indexer_weight, task_options=parse_options(task_opt, "--task-opt"),
                              model_options=parse_options(model_opt, "--model-opt"))
            dist = Dist.from_env()
            res = run(cfg, out, resume=not fresh, progress=not json_, dist=dist)
        except ValueError as e:
            err_console.print(f"[red]error:[/red] {e}")
            raise typer.Exit(2)
        if not dist.main:
            dist.close()
            return
        rec = {"model": res.model_config.name, "mix": res.model_config.mix(), "task": res.task.NAME,
               "steps": res.step, "resumed_from": res.resumed_from, "final_loss": res.final_loss,
               "eval": res.eval, "test": res.test, "chance": res.task.chance(), "seconds": res.seconds,
               "processes": dist.world, "out": str(out) if out else None,
               "params": sum(p.numel() for p in res.model.parameters())}
        dist.close()
        if json_:
            emit_json(rec)
            return
        rows = [["model", f"{rec['model']} ({rec['mix']}, {rec['params']:,} parameters)"],
                ["task", f"{rec['task']} ({size})"], ["steps", f"{res.step} (resumed from {res.resumed_from})"],
                ["final training loss", res.final_loss], ["processes", dist.world], ["seconds", res.seconds],
                ["chance accuracy", rec["chance"]]]
        rows += [[f"eval {k}", v] for k, v in res.eval.items()]
        rows += [[f"test (longer) {k}", v] for k, v in res.test.items()]
        if out:
            rows.append(["checkpoint", str(Path(out) / "checkpoint.safetensors")])
        console.print(table("storelab train", ["", "value"], rows))

    @app.command()
    def recall(
        widths: str = typer.Option("16,32,64", "--widths", help="Model widths (d_model), comma separated."),
        pairs: str = typer.Option("4,8,16", "--pairs", help="Key-value pairs per sequence, comma separated."),
        models: str = typer.Option("attention,window,gated_deltanet,kda,hybrid", "--models"),
        steps: int = typer.Option(300, "--steps"),
        seq_len: int = typer.Option(64, "--seq-len"),
        vocab: int = typer.Option(128, "--vocab"),
        seed: int = typer.Option(0, "--seed"),
        out: Path = typer.Option(Path("runs/recall"), "--out", help="Directory for the table (JSON) and PNG."),
        json_: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """Recall benchmark (after Zoology's figure): MQAR accuracy against state size per store."""
        from storelab.train.recall import RecallBench, plot_recall, run_recall

        try:
            bench = RecallBench(models=tuple(models.split(",")), widths=tuple(int(w) for w in widths.split(",")),
                                pairs=tuple(int(p) for p in pairs.split(",")), steps=steps, seq_len=seq_len,
                                vocab_size=vocab, seed=seed)
            rows = run_recall(bench, progress=not json_)
        except ValueError as e:
            err_console.print(f"[red]error:[/red] {e}")
            raise typer.Exit(2)
        out.mkdir(parents=True, exist_ok=True)
        (out / "recall.json").write_text(json.dumps({"bench": bench.to_dict(), "rows": rows}, indent=2) + "\n")
        png = plot_recall(rows, out / "recall.png")
        if json_:
            emit_json({"rows": rows, "png": str(png)})
            return
        console.print(table("MQAR accuracy against state size", ["model", "d_model", "pairs", "state bytes",
                                                                  "accuracy", "seconds"],
                            [[r["model"], r["d_model"], r["pairs"], r["state_bytes"], r["acc"], r["seconds"]]
                             for r in rows]))
        console.print(f"plot: {png}")
