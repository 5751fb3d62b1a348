"""The report's sections, in the order the issue lists them.

Each section computes everything it shows; the only hand-typed numbers are the
essay's own values (passed to ``Claim(essay=...)``) and the claims' wording.
"""

from __future__ import annotations

from storelab.report.core import Claim, Context, Section, SectionResult, Table


def stores_section(ctx: Context) -> SectionResult:
    from storelab.commands.stores import store_cards

    cards = store_cards()
    rows = [[c["name"], c["written_by"], c["holds"], c["reading_costs"], c["forgets"], c["source"]] for c in cards]
    return SectionResult(
        text=("The table of section 5, generated from the cards that the store classes carry. "
              f"{len(cards)} stores are implemented; each answers the essay's questions: what writes it, "
              "what it holds, what reading it costs, and how it forgets."),
        tables=[Table("The stores (from the code)", ["Store", "Written by", "Holds", "Reading costs", "Forgets", "Source"], rows)],
        data=cards,
    )


SECTIONS: list[Section] = [
    Section("stores", "1. The stores", stores_section),
]
