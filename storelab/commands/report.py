"""``storelab report``: build the HTML/Markdown/JSON report."""

from __future__ import annotations

from pathlib import Path

import typer

from storelab import options as opt
from storelab.console import console, emit_json


def register(app: typer.Typer) -> None:
    @app.command()
    def report(out: Path = typer.Option(Path("report"), "--out", help="Folder for report.html, .md, .json and figures."),
               quick: bool = typer.Option(False, "--quick", help="Small sizes (about a minute)."),
               force: bool = opt.force(),
               json_: bool = typer.Option(False, "--json", help="Print one JSON document.")) -> None:
        """The essay's claims beside what the code measures, as a self-contained HTML page."""
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        from storelab.outputs import check_folder
        from storelab.report import build_report
        from storelab.report.build import FILES, default_sections

        with opt.user_errors():
            check_folder(out, "report", FILES, force=force)  # before the sections run
        sections = default_sections()
        with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                      TimeElapsedColumn(), console=console, disable=json_, transient=False) as prog:
            task = prog.add_task("report", total=len(sections))
            paths, outcomes = build_report(
                out, quick=quick, sections=sections,
                on_start=lambda s: prog.update(task, description=f"section: {s.title}"),
                on_end=lambda oc: prog.update(task, advance=1, description=f"{'done' if oc.ok else 'FAILED'}: {oc.section.title}"),
                force=force)
        failed = [oc.section.key for oc in outcomes if not oc.ok]
        if json_:
            emit_json({"report": str(paths["html"]), "markdown": str(paths["md"]), "json": str(paths["json"]),
                       "sections": [{"key": oc.section.key, "ok": oc.ok, "seconds": round(oc.seconds, 2)} for oc in outcomes],
                       "failed": failed})
        else:
            for oc in outcomes:
                if not oc.ok:
                    console.print(f"[red]section {oc.section.key} failed[/red]: {oc.error.strip().splitlines()[-1]}")
            console.print(f"report: {paths['html'].resolve()}")
        if failed:
            raise typer.Exit(code=1)
