"""The report's sections, in the order the issue lists them.

Each section computes everything it shows; the only hand-typed numbers are the
essay's own values (passed to ``Claim(essay=...)``) and the claims' wording.
"""

from __future__ import annotations

from storelab.report.core import Claim, Context, Section, SectionResult, Table


def stores_section(ctx: Context) -> SectionResult:
    from storelab.stores import store_cards

    cards = store_cards()
    rows = [[c["name"], c["written_by"], c["holds"], c["reading_costs"], c["forgets"], c["source"]] for c in cards]
    return SectionResult(
        text=("The table of section 5, generated from the cards that the store classes carry. "
              f"{len(cards)} stores are implemented; each answers the essay's questions: what writes it, "
              "what it holds, what reading it costs, and how it forgets."),
        tables=[Table("The stores (from the code)", ["Store", "Written by", "Holds", "Reading costs", "Forgets", "Source"], rows)],
        data=cards,
    )


def _lazy(module: str, name: str):
    def run(ctx: Context) -> SectionResult:
        import importlib

        return getattr(importlib.import_module(module), name)(ctx)

    return run


SECTIONS: list[Section] = [
    Section("stores", "1. The stores", stores_section),
    Section("models", "2. The seven models", _lazy("storelab.report.memory", "models_section")),
    Section("memory", "3. Where a million-token prompt goes", _lazy("storelab.report.memory", "memory_section")),
    Section("capacity", "4. Capacity", _lazy("storelab.report.capacity_section", "capacity_section")),
    Section("examples", "5. The worked examples", _lazy("storelab.report.examples", "worked_examples_section")),
    Section("depth", "6. Depth and parallel evaluation", _lazy("storelab.report.depth_section", "depth_section")),
    Section("trained", "7. What a trained hybrid keeps where", _lazy("storelab.report.trained_section", "trained_section")),
    Section("sweep", "8. Where the stored value goes as the dictionary grows",
            _lazy("storelab.report.sweep_section", "sweep_section")),
    Section("real", "9. On language models that learned", _lazy("storelab.report.real_section", "real_section")),
]
