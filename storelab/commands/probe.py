"""``storelab probe NAME --checkpoint DIR``: what a trained model keeps in each store.

Probes: state_swap, keep_one, forgetting, mhc, selection (see ``storelab.probes``), or
``all`` for every probe that applies to the model. The essay's figures for the large
models are printed beside ours, as context: tiny models on synthetic tasks need not match.
"""

from __future__ import annotations

from pathlib import Path

import typer

from storelab import options as opt
from storelab.console import console, emit_json, table


def _rows(name: str, r: dict) -> list[list]:
    """(figure, ours, essay) rows for one probe's result."""
    e = r.get("essay", {})
    if name == "state_swap":
        lo_r, hi_r = e["recurrent_fraction"]
        lo_c, hi_c = e["cache_fraction"]
        return [["answer accuracy (prompt A)", r["answer_accuracy"], ""],
                ["shift moved by all recurrent states", r["recurrent_fraction"], f"{lo_r:.1%} to {hi_r:.1%}"],
                ["shift moved by all attention caches", r["cache_fraction"], f"{lo_c:.0%} to {hi_c:.0%}"],
                ["answers flipped by the states", r["answers_flipped"]["recurrent"], ""],
                ["answers flipped by the caches", r["answers_flipped"]["cache"], ""]]
    if name == "keep_one":
        p = r["paired"]
        return [["retrieval, both stores", r["full"]["retrieval"], ""],
                ["retrieval, cache only", r["cache_only"]["retrieval"], e["retrieval"]["cache_only"]],
                ["retrieval, state only", r["state_only"]["retrieval"], e["retrieval"]["state_only"]],
                ["compliance, both stores", r["full"]["compliance"], ""],
                ["compliance, cache only", r["cache_only"]["compliance"], e["compliance"]["cache_only"]],
                ["compliance, state only", r["state_only"]["compliance"], e["compliance"]["state_only"]],
                ["paired: content from the cache's prompt", p["content_from_cache"], "most"],
                ["paired: content from the state's prompt", p["content_from_state"], ""],
                ["paired: language from the cache's prompt", p["language_from_cache"], ""],
                ["paired: language from the state's prompt", p["language_from_state"], "most"]]
    if name == "forgetting":
        return [["median half-life (tokens)", r["median_half_life"], e["median_half_life_tokens"]],
                ["ranking stability (mean Spearman)", r["ranking_stability"], e["ranking"]],
                ["KDA heads mixing fast and slow channels", r["kda_mixing_fraction"], e["kda_mixing_fraction"]]]
    if name == "mhc":
        ess = {"identity_first_half": e["identity_first_half"], "identity_second_half": e["identity_second_half"],
               "average_first_half": e["average"], "average_second_half": e["average"]}
        return [[f"perplexity change, {k.replace('_', ' ')}", v["perplexity_change"], ess.get(k, "")]
                for k, v in r["conditions"].items()]
    if name == "selection":
        rows = [["miss rate (top-budget entries not selected)", r["miss_rate"], "-"],
                ["top-1 entry missed", r["top1_miss"], "-"],
                ["attention mass missed", r["mass_missed"], "-"],
                ["selects the first block", r["first_block_rate"], "learned (sink)"]]
        for x in r["layers"]:  # ours in the ours column; the essay gives no per-layer figure
            rows += [[f"layer {x['layer']} ({x['kind']}) miss rate", x.get("miss_rate"), "-"],
                     [f"layer {x['layer']} ({x['kind']}) selects the first block", x.get("first_block_rate"), "-"]]
        return rows
    return []


def register(app: typer.Typer) -> None:
    @app.command()
    def probe(
        name: str = typer.Argument(..., help="state_swap, keep_one, forgetting, mhc, selection, or all."),
        checkpoint: Path = typer.Option(None, "--checkpoint", help="A run folder written by storelab train --out, "
                                        "or a model folder (config.json + safetensors; probed on --task)."),
        model: str = typer.Option(None, "--model", help="Instead of a checkpoint: an untrained model "
                                  "(tiny-<zoo name> or a built-in stack), for a look at the machinery."),
        task: str = typer.Option(None, "--task", help="Probe on this task instead of the checkpoint's."),
        size: str = typer.Option("tiny", "--size", help="Size preset of --task."),
        n: int = opt.count(64, "--n", help="Examples (documents) per probe."),
        seed: int = opt.seed(1234),
        json_: bool = typer.Option(False, "--json", help="Print one JSON document."),
        stream: bool = typer.Option(False, "--stream", help="With a model folder (config.json + safetensors): "
                                    "read each layer's weights from the shards during its call, then let them go "
                                    "(checkpoints larger than memory; the same results)."),
        weights_only: bool = typer.Option(False, "--weights-only", help="forgetting only: the gates' half-lives "
                                          "at x = 0 and the KDA channel-fade estimate, from the gate tensors of a "
                                          "model folder alone (megabytes read, no model built)."),
        plot: bool = typer.Option(False, "--plot", help="With --weights-only: draw the half-lives' histogram."),
        out: Path = typer.Option(Path("forgetting.png"), "--out", help="Where --plot writes its PNG (and a JSON "
                                 "beside it)."),
    ) -> None:
        """Run a probe on a trained model; print its figures beside the essay's."""
        import torch

        from storelab.models.model import Model
        from storelab.probes import PROBES
        from storelab.probes.source import is_model_folder, open_model
        from storelab.tasks import make_task
        from storelab.train.loop import load_trained
        from storelab.train.models import resolve_model

        from storelab.models.config import check_fits

        with opt.user_errors():
            if weights_only:
                from storelab.commands._probe_weights import weights_only as run_weights_only

                return run_weights_only(name, checkpoint, json_=json_, plot=plot, out=out)
            names = list(PROBES) if name == "all" else [name]
            for nm in names:
                if nm not in PROBES:
                    raise ValueError(f"name: unknown probe {nm!r} (known: {', '.join(PROBES)}, all)")
            if (checkpoint is None) == (model is None):
                raise ValueError("checkpoint: give exactly one of --checkpoint DIR or --model NAME")
            if checkpoint is not None and is_model_folder(checkpoint):  # a model folder: no task of its own
                net = open_model(checkpoint, stream=stream)
                t = make_task(task or "dictionary", size)
                if t.vocab_size > net.cfg.vocab_size:
                    raise ValueError(f"task: {t.NAME} ({size}) has vocabulary {t.vocab_size}, more than the "
                                     f"model's {net.cfg.vocab_size}")
            elif stream:
                raise ValueError("stream: --stream reads a model folder (config.json + safetensors) given as "
                                 "--checkpoint DIR")
            elif checkpoint is not None:
                net, t, _ = load_trained(checkpoint)
                if task is not None:
                    t = make_task(task, size)
                    if t.vocab_size != net.cfg.vocab_size:
                        raise ValueError(f"task: {task} ({size}) has vocabulary {t.vocab_size}, the model "
                                         f"{net.cfg.vocab_size}")
            else:
                t = make_task(task or "dictionary", size)
                mcfg = resolve_model(model, t.vocab_size)
                check_fits(mcfg, what="--model", instead=f"probe its tiny version (--model tiny-{model})")
                torch.manual_seed(seed)
                net = Model(mcfg).eval()
        results, skipped = {}, {}
        for nm in names:
            try:
                results[nm] = PROBES[nm](net, t, n=n, seed=seed)
            except ValueError as e:
                if name != "all":
                    opt.fail(str(e))
                skipped[nm] = str(e)
        if json_:
            emit_json({"model": net.cfg.name, "task": t.NAME, "results": results, "skipped": skipped})
            return
        for nm, r in results.items():
            console.print(table(f"probe {nm}: {net.cfg.name} on {t.NAME} (essay: {r['essay']['source']})",
                                ["figure", "ours", "essay (large models)"], _rows(nm, r)))
        for nm, why in skipped.items():
            console.print(f"probe {nm}: skipped ({why})")
