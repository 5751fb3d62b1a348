"""``storelab capacity``: the essay's capacity figures, measured, beside theory and the essay's number."""

from __future__ import annotations

from typing import List, Optional

import typer
from rich.markup import escape

from storelab import options as opt
from storelab.console import console, emit_json, table

COLUMNS = ["experiment", "d (or N)", "criterion", "theory", "essay", "measured", "ratio"]  # ratio: measured/essay


def register(app: typer.Typer) -> None:
    @app.command()
    def capacity(
        experiments: Optional[List[str]] = typer.Argument(None, help="Names or numbers 1-11; default all."),
        quick: bool = typer.Option(False, "--quick", help="Smaller sizes, same code (under 30 s)."),
        plot: Optional[str] = typer.Option(None, "--plot", help="Write PNG curves and capacity.json to this folder."),
        force: bool = opt.force(),
        json_: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """Measure every capacity figure of the essay; print theory, essay and measured side by side."""
        from storelab.capacity import run

        with opt.user_errors():
            rows = run(experiments, quick=quick, plot_dir=plot, progress=not json_, force=force)
        if json_:
            emit_json(rows)
            return
        console.print(table("Capacity lab (essay sections 2, 3, 6)" + (" - quick sizes" if quick else ""), COLUMNS,
                            [[escape(r["experiment"]), r["d"], escape(r["criterion"]), r["theory"], r["essay"],
                              r["measured"], r["ratio"]] for r in rows]))
        for i, r in enumerate(rows, 1):
            if r["note"]:
                console.print(f"[dim]{i:>2}. {escape(r['experiment'])}: {escape(r['note'])}[/dim]")
        if plot:
            console.print(f"curves and capacity.json written to {plot}")
