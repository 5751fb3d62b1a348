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


def _sweep_rows(r: dict) -> list[list]:
    """Per selecting layer and top-k multiplier: recall and mass missed at each context (short to long)."""
    rows = [["contexts (last %d queries each)" % r["queries"], " / ".join(map(str, r["contexts"])), ""]]
    for x in r["layers"]:
        shares = "" if x["own_indexer"] else f", shares layer {x['owner']}"
        name = f"layer {x['layer']} ({x['kind']}{shares})"
        for m in r["topk"]:
            pts = [p for p in x["points"] if p["topk_multiplier"] == m]
            fmt = lambda k: " / ".join("-" if p[k] is None else f"{p[k]:.3f}" for p in pts)  # noqa: E731
            rows += [[f"{name} recall, top {m * x['k']}", fmt("recall"), "-"],
                     [f"{name} mass missed, top {m * x['k']}", fmt("mass_missed"), "-"]]
    return rows


def _rows(name: str, r: dict) -> list[list]:
    """(figure, ours, essay) rows for one probe's result."""
    e = r.get("essay", {})
    if r.get("probe") == "selection_sweep":
        return _sweep_rows(r)
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
        base = [["perplexity, as trained", r["base_perplexity"], ""]] if "base_perplexity" in r else []
        return base + [[f"perplexity change, {k.replace('_', ' ')}", v["perplexity_change"], ess.get(k, "")]
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
        checkpoint: Path = typer.Option(None, "--checkpoint", help="A run folder written by storelab train --out "
                                        "(not a model folder: generate --checkpoint takes those)."),
        model: str = typer.Option(None, "--model", help="Instead of a checkpoint: an untrained model "
                                  "(tiny-<zoo name> or a built-in stack), for a look at the machinery."),
        task: str = typer.Option(None, "--task", help="Probe on this task instead of the checkpoint's."),
        size: str = typer.Option("tiny", "--size", help="Size preset of --task."),
        n: int = opt.count(64, "--n", help="Examples (documents) per probe."),
        seed: int = opt.seed(1234),
        contexts: str = opt.int_list(None, "--contexts", help="Probe on documents at these context lengths "
                                     "(e.g. 512,1024,4096): selection sweeps them, mhc uses the first."),
        topk: str = opt.int_list("1", "--topk", help="selection: top-k multipliers (the layer reads m * k)."),
        queries: int = opt.count(64, "--queries", help="selection: query positions measured (the last ones)."),
        out: Path = typer.Option(None, "--out", help="Write probe.json and a figure per probe into this folder."),
        force: bool = opt.force(),
        json_: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """Run a probe on a trained model; print its figures beside the essay's."""
        import torch

        from storelab.models.model import Model
        from storelab.probes import DOCUMENT_PROBES, PROBES
        from storelab.probes.figures import check_out, write_outputs
        from storelab.tasks import make_task
        from storelab.train.loop import load_trained
        from storelab.train.models import resolve_model

        from storelab.models.config import check_fits

        with opt.user_errors():
            names = list(PROBES) if name == "all" else [name]
            for nm in names:
                if nm not in PROBES:
                    raise ValueError(f"name: unknown probe {nm!r} (known: {', '.join(PROBES)}, all)")
            if (checkpoint is None) == (model is None):
                raise ValueError("checkpoint: give exactly one of --checkpoint DIR or --model NAME")
            if checkpoint is not None:
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
            if out is not None:
                check_out(out, force=force)
        docs = None if contexts is None else [row.tolist() for row in t.sample(n, seed).inputs]
        results, skipped = {}, {}
        for nm in names:
            try:
                if docs is not None and nm in DOCUMENT_PROBES:
                    results[nm] = DOCUMENT_PROBES[nm](net, docs, contexts=contexts, topk=topk, queries=queries, n=n)
                else:
                    results[nm] = PROBES[nm](net, t, n=n, seed=seed)
            except ValueError as e:
                if name != "all":
                    opt.fail(str(e))
                skipped[nm] = str(e)
        doc = {"model": net.cfg.name, "task": t.NAME, "results": results, "skipped": skipped}
        if out is not None:
            with opt.user_errors():
                write_outputs(out, doc)
        if json_:
            emit_json(doc)
            return
        for nm, r in results.items():
            console.print(table(f"probe {nm}: {net.cfg.name} on {t.NAME} (essay: {r['essay']['source']})",
                                ["figure", "ours", "essay (large models)"], _rows(nm, r)))
        for nm, why in skipped.items():
            console.print(f"probe {nm}: skipped ({why})")
