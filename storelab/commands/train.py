"""``storelab train``: train a small model on a synthetic task; ``storelab recall``: the recall benchmark.

``storelab train --model tiny-kimi-k3 --task mqar --steps 500 --out runs/k3`` trains with
AdamW, warm-up and cosine decay, clipping and a progress bar; it checkpoints to ``--out``
and resumes from there when run again, on any number of processes, also with a larger
``--steps`` (the run is extended; ``storelab.train.loop`` gives the schedule's rule). Under
``torchrun --nproc-per-node N -m storelab train ...`` the processes split each global batch,
with torch's DDP (``--parallel ddp``, the default) or FSDP2 (``--parallel fsdp``); nccl on GPUs,
gloo on the CPU (``storelab.train.distributed``). ``--precision bf16`` computes in bf16 with fp32
master weights; ``--accumulate N`` splits each process's share of the batch into N micro-batches.
``storelab export RUN OUT`` turns a run folder into a model folder (``storelab.load``).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from storelab import options as opt
from storelab.console import console, emit_json, table


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
        steps: int = opt.count(1000, "--steps"),
        out: Path = typer.Option(None, "--out", help="Run directory: checkpoints, resumed from when present."),
        batch_size: int = opt.count(32, "--batch-size", help="Global batch of one optimiser step (split over "
                                    "torchrun processes and --accumulate micro-batches)."),
        accumulate: int = opt.count(1, "--accumulate", help="Micro-batches per process and step (gradient "
                                    "accumulation: the same step in 1/N of the memory)."),
        parallel: str = typer.Option("auto", "--parallel", help="auto (ddp under torchrun with several "
                                     "processes, else none), none, ddp, fsdp (FSDP2: parameters and optimizer "
                                     "state sharded)."),
        precision: str = typer.Option("fp32", "--precision", help="fp32, or bf16 (bf16 compute, fp32 master "
                                      "weights and gradient reduction)."),
        lr: float = opt.number(3e-3, "--lr", min=0, min_open=True),
        warmup: int = opt.count(50, "--warmup", zero=True),
        seed: int = opt.seed(),
        eval_every: int = opt.count(100, "--eval-every"),
        checkpoint_every: int = opt.count(100, "--checkpoint-every"),
        threads: int = opt.cores(0, "--threads", help="Torch threads per process (0: torch's default; at most the "
                                 "machine's cores)."),
        indexer_weight: float = opt.number(1.0, "--indexer-weight", min=0, help="Weight of the indexers' imitation "
                                           "of the main attention (DSA, hierarchical, MSA, CSA; 0: off)."),
        task_opt: list[str] = typer.Option(None, "--task-opt", help="Task option key=value (repeatable)."),
        model_opt: list[str] = typer.Option(None, "--model-opt", help="Built-in stack option key=value."),
        device: str = typer.Option("cpu", "--device", help="cpu (gloo between processes), cuda (one GPU per "
                                   "process, nccl), auto (cuda when there is one)."),
        async_checkpoint: bool = typer.Option(False, "--async-checkpoint", help="Write checkpoints in the "
                                              "background (dcp.async_save) while training goes on."),
        fresh: bool = typer.Option(False, "--fresh", help="Ignore a checkpoint in --out and start over."),
        force: bool = opt.force(),
        json_: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """Train a model on a synthetic task (AdamW, warm-up + cosine, clipping, checkpoints, resume)."""
        from storelab.models.accounting import count_params
        from storelab.train.checkpoint import CHECKPOINT
        from storelab.train.distributed import Dist
        from storelab.train.loop import TrainConfig, train as run

        with opt.user_errors():
            cfg = TrainConfig(model=model, task=task, task_preset=size, steps=steps, batch_size=batch_size, lr=lr,
                              warmup=warmup, seed=seed, eval_every=eval_every, checkpoint_every=checkpoint_every,
                              threads=threads, indexer_weight=indexer_weight, accumulate=accumulate,
                              parallel=parallel, precision=precision, task_options=parse_options(task_opt, "--task-opt"),
                              model_options=parse_options(model_opt, "--model-opt"))
            dist = Dist.from_env(device)
            res = run(cfg, out, resume=not fresh, progress=not json_, dist=dist, force=force,
                      async_checkpoint=async_checkpoint)
        if not dist.main:
            dist.close()
            dist.exit()
            return
        rec = {"model": res.model_config.name, "mix": res.model_config.mix(), "task": res.task.NAME,
               "steps": res.step, "resumed_from": res.resumed_from, "final_loss": res.final_loss,
               "eval": res.eval, "test": res.test, "chance": res.task.chance(), "seconds": res.seconds,
               "processes": dist.world, "parallel": res.parallel, "out": str(out) if out else None,
               "params": count_params(res.model_config).stored, "vocab_size": res.model_config.vocab_size}
        dist.close()
        if json_:
            emit_json(rec)
            dist.exit()
            return
        rows = [["model", f"{rec['model']} ({rec['mix']}, {rec['params']:,} parameters at the task's vocabulary "
                          f"of {rec['vocab_size']:,})"],
                ["task", f"{rec['task']} ({size})"], ["steps", f"{res.step} (resumed from {res.resumed_from})"],
                ["final training loss", res.final_loss], ["processes", f"{dist.world} ({res.parallel})"], ["seconds", res.seconds],
                ["chance accuracy", rec["chance"]]]
        rows += [[f"eval {k}", v] for k, v in res.eval.items()]
        rows += [[f"test (longer) {k}", v] for k, v in res.test.items()]
        if out:
            rows.append(["checkpoint", str(Path(out) / CHECKPOINT)])
        console.print(table("storelab train", ["", "value"], rows))
        dist.exit()

    @app.command()
    def recall(
        widths: str = opt.int_list("16,32,64", "--widths", min=2, help="Model widths (d_model), comma separated."),
        pairs: str = opt.int_list("4,8,16", "--pairs", help="Key-value pairs per sequence, comma separated."),
        models: str = typer.Option("attention,window,gated_deltanet,kda,hybrid", "--models"),
        steps: int = opt.count(300, "--steps"),
        seq_len: int = opt.count(64, "--seq-len"),
        vocab: int = opt.count(128, "--vocab"),
        seed: int = opt.seed(),
        out: Path = typer.Option(Path("runs/recall"), "--out", help="Directory for the table (JSON) and PNG."),
        force: bool = opt.force(),
        json_: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """Recall benchmark (after Zoology's figure): MQAR accuracy against state size per store."""
        from storelab.models.memory_terms import check_run_fits
        from storelab.outputs import atomic_write, check_folder
        from storelab.train.models import resolve_model
        from storelab.train.recall import FILES, RecallBench, plot_recall, run_recall

        with opt.user_errors():
            bench = RecallBench(models=tuple(m.strip() for m in models.split(",")), widths=widths, pairs=pairs,
                                steps=steps, seq_len=seq_len, vocab_size=vocab, seed=seed)
            check_folder(out, "recall", FILES, force=force)  # before the benchmark, not after it
            for m in bench.models:  # the sizes given, held against the machine before any training
                for w in bench.widths:
                    tc = bench.config(m, w, max(bench.pairs))
                    check_run_fits(resolve_model(tc.model, bench.vocab_size, **tc.model_options),
                                   tokens=2 * bench.seq_len, batch=bench.batch_size, training=True,
                                   option="--seq-len, --widths, --vocab", instead="give smaller sizes")
            rows = run_recall(bench, progress=not json_)
        atomic_write(out / "recall.json", json.dumps({"bench": bench.to_dict(), "rows": rows}, indent=2) + "\n")
        png = plot_recall(rows, out / "recall.png")
        if json_:
            emit_json({"rows": rows, "png": str(png)})
            return
        console.print(table("MQAR accuracy against state size", ["model", "d_model", "pairs", "state bytes",
                                                                  "accuracy", "seconds"],
                            [[r["model"], r["d_model"], r["pairs"], r["state_bytes"], r["acc"], r["seconds"]]
                             for r in rows]))
        console.print(f"plot: {png}")
