"""``storelab stores``: the essay's section-5 table, generated from the store cards.

The first column is the ``kind`` a model file's ``[stores.<name>]`` table names (``kind = "kda"``)."""

from __future__ import annotations

import typer
from rich.markup import escape

from storelab.console import console, emit_json, table
from storelab.stores import store_cards

NARROW = 140  # below this width the cards print as blocks, not a table
LABELS = {"written_by": "written by", "holds": "holds", "reading_costs": "reading costs", "forgets": "forgets",
          "source": "source"}
FIELDS = ("kind", "name", "written_by", "holds", "reading_costs", "forgets", "source")


def register(app: typer.Typer) -> None:
    @app.command()
    def stores(json_: bool = typer.Option(False, "--json", help="Print one JSON document.")) -> None:
        """Print every store's card: its kind (for model files), written by, holds, reading costs, forgets, source."""
        cards = store_cards()
        if json_:
            emit_json([{k: c[k] for k in FIELDS} for c in cards])
            return
        if console.width < NARROW:  # seven columns of prose do not fit: one block per store instead
            for c in cards:
                console.print(f"[bold]{escape(c['kind'])}[/bold]: {escape(c['name'])}")
                for k, label in LABELS.items():
                    console.print(f"  {label}: {escape(c[k])}", soft_wrap=False)
            return
        console.print(
            table(
                "Every layer a store (essay section 5); kind: what a model file's store table names",
                ["Kind", "Store", "Written by", "Holds", "Reading costs", "Forgets", "Source"],
                [[c[k] for k in FIELDS] for c in cards],
            )
        )
