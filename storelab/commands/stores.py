"""``storelab stores``: the essay's section-5 table, generated from the store cards."""

from __future__ import annotations

import typer

from storelab.console import console, emit_json, table
from storelab.stores import store_cards


def register(app: typer.Typer) -> None:
    @app.command()
    def stores(json_: bool = typer.Option(False, "--json", help="Print one JSON document.")) -> None:
        """Print every store's card: written by, holds, reading costs, forgets, source."""
        cards = store_cards()
        if json_:
            emit_json([{k: c[k] for k in ("name", "written_by", "holds", "reading_costs", "forgets", "source")} for c in cards])
            return
        console.print(
            table(
                "Every layer a store (essay section 5)",
                ["Store", "Written by", "Holds", "Reading costs", "Forgets", "Source"],
                [[c["name"], c["written_by"], c["holds"], c["reading_costs"], c["forgets"], c["source"]] for c in cards],
            )
        )
