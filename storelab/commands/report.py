"""``storelab report``: build the HTML/Markdown/JSON report.

``--checkpoint`` takes a model folder (with its tokenizer.json) as before, or a Hugging Face repo id
``org/name[@revision]`` whose weights are in the local cache (``storelab.checkpoint.source``; the report
reads only the cache: a repo not there is an error saying ``hf download org/name``)."""

from __future__ import annotations

from pathlib import Path

import typer

from storelab import options as opt
from storelab.console import console, emit_json


def register(app: typer.Typer) -> None:
    @app.command()
    def report(out: Path = typer.Option(Path("report"), "--out", help="Folder for report.html, .md, .json and figures."),
               quick: bool = typer.Option(False, "--quick", help="Small sizes (about a minute)."),
               full: bool = typer.Option(False, "--full", help="Section 9's probes of the real language models at "
                                         "their large sizes (more prompts, distances and contexts; tens of minutes)."),
               force: bool = opt.force(),
               checkpoint: Path = typer.Option(None, "--checkpoint", help="A model folder (Hugging Face or storelab "
                                               "save, with tokenizer.json), or a Hugging Face repo id "
                                               "org/name (or org/name@REV) in the local cache: a section with its "
                                               "measurements."),
               stream: bool = typer.Option(False, "--stream", help="With --checkpoint: read each layer's weights "
                                           "during its call (checkpoints larger than memory)."),
               device: str = opt.device(),
               dtype: str = opt.dtype(),
               retrain: bool = typer.Option(False, "--retrain", help="Train the subjects of sections 7 and 8 afresh "
                                            "by their recipes into OUT/subjects (about 95 minutes on 2 cores) and probe "
                                            "those instead of the shipped ones."),
               subjects: Path = typer.Option(None, "--subjects", help="A folder of trained subjects (`storelab "
                                             "subjects train --all --out DIR`) for sections 7 and 8."),
               offline: bool = typer.Option(False, "--offline", help="A Hub repo from the local cache only (the "
                                            "report reads weights from the cache alone in any case)."),
               json_: bool = typer.Option(False, "--json", help="Print one JSON document.")) -> None:
        """The essay's claims beside what the code measures, as a self-contained HTML page."""
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        from storelab.checkpoint.source import checkpoint_weights
        from storelab.outputs import check_folder
        from storelab.report import build_report
        from storelab.report.build import FILES, check_checkpoint, check_subjects, default_sections
        from storelab.report.core import ledger

        with opt.user_errors():
            if full and quick:
                raise ValueError("--full: the large sizes; --quick the small ones: give at most one")
            check_folder(out, "report", FILES, force=force)  # before the sections run
            check_subjects(out, subjects, retrain, force=force)
            if checkpoint is not None:   # a repo id: its snapshot in the Hugging Face cache
                checkpoint = check_checkpoint(checkpoint_weights(checkpoint, offline=offline))
            elif stream:
                raise ValueError("stream: --stream reads the model folder given as --checkpoint DIR")
            elif device != "cpu" or dtype is not None:
                raise ValueError(f"{'--device' if device != 'cpu' else '--dtype'}: places the model of --checkpoint "
                                 f"DIR (the report's own sections run small models on the CPU); give --checkpoint")
        sections = default_sections(checkpoint)
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TimeElapsedColumn(), console=console, disable=json_, transient=False) as prog:
            task = prog.add_task("report", total=len(sections))
            paths, outcomes = build_report(
                out, quick=quick, sections=sections,
                on_start=lambda s: prog.update(task, description=f"section: {s.title}"),
                on_end=lambda oc: prog.update(task, advance=1, description=f"{'done' if oc.ok else 'FAILED'}: {oc.section.title}"),
                force=force, checkpoint=checkpoint, stream=stream, device=device, dtype=dtype,
                subjects=subjects, retrain=retrain, full=full,
                on_retrain=lambda m: prog.update(task, description=f"retrained {m['name']} seed {m['seed']} "
                                                 f"({m['seconds']:.0f} s, {m['verdict']})"))
        failed = [oc.section.key for oc in outcomes if not oc.ok]
        placed = next((oc.result.data for oc in outcomes if oc.section.key == "checkpoint" and oc.ok), None)
        if json_:
            claims: dict[str, int] = {}   # the ledger's statuses ("not measured": a model that did not learn)
            for c in ledger(outcomes):
                claims[c.status] = claims.get(c.status, 0) + 1
            emit_json({"report": str(paths["html"]), "markdown": str(paths["md"]), "json": str(paths["json"]),
                       "sections": [{"key": oc.section.key, "ok": oc.ok, "seconds": round(oc.seconds, 2)} for oc in outcomes],
                       "failed": failed, "claims": claims,
                       **{k: placed[k] for k in ("device", "dtype") if placed}})
        else:
            for oc in outcomes:
                if not oc.ok:
                    console.print(f"[red]section {oc.section.key} failed[/red]: {oc.error.strip().splitlines()[-1]}")
            console.print(f"report: {paths['html'].resolve()}")
        if failed:
            raise typer.Exit(code=1)
