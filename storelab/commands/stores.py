"""``storelab stores``: the essay's section-5 table, generated from the store cards."""

from __future__ import annotations

import typer

from storelab.commands._output import console, emit_json, table


# The rows of the essay's section-5 table, in its order; kinds not listed follow by name.
ESSAY_ORDER = ["ffn", "moe", "engram", "attention", "mla", "window", "dsa", "hierarchical", "msa", "csa", "hca",
               "linear_attention", "deltanet", "gated_deltanet", "kda", "residual", "mhc", "attnres"]


def store_cards() -> list[dict[str, str]]:
    """Every registered store's card, in the order of the essay's section-5 table."""
    from storelab.stores import REGISTRY

    seen, out = set(), []
    order = [k for k in ESSAY_ORDER if k in REGISTRY] + sorted(k for k in REGISTRY if k not in ESSAY_ORDER)
    for kind in order:
        card = REGISTRY[kind].CARD
        if card.name in seen:
            continue
        seen.add(card.name)
        out.append({"kind": kind, **card.as_dict()})
    return out


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
