"""Run every section, then write HTML, Markdown and JSON into one folder."""

from __future__ import annotations

import datetime as _dt
import platform
from pathlib import Path
from typing import Callable

import torch

from storelab.outputs import check_folder
from storelab.report import render
from storelab.report.core import Context, Section, SectionOutcome, ledger, run_sections


FILES = ("report.html", "report.md", "report.json", "*.png", "capacity", "depth")  # what a report folder holds


def default_sections() -> list[Section]:
    from storelab.report import sections as S

    return S.SECTIONS


def build_report(out: str | Path = "report", *, quick: bool = False, sections: list[Section] | None = None,
                 on_start: Callable[[Section], None] | None = None,
                 on_end: Callable[[SectionOutcome], None] | None = None,
                 force: bool = False) -> tuple[dict[str, Path], list[SectionOutcome]]:
    """Run the sections, then write the report into ``out``. The folder is checked first
    (``storelab.outputs``): a report folder is rewritten, a new or empty one filled; any other
    kind, or a folder holding a file of the report's names, is refused unless ``force``."""
    out = Path(out)
    check_folder(out, "report", FILES, force=force)
    out.mkdir(parents=True, exist_ok=True)
    ctx = Context(out=out, quick=quick)
    outcomes = run_sections(sections if sections is not None else default_sections(), ctx, on_start, on_end)
    claims = ledger(outcomes)
    meta = {
        "subtitle": ("Every Layer a Store, recomputed: the essay's numbers beside storelab's. "
                     f"{'Quick sizes. ' if quick else ''}Generated {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC "
                     f"on {platform.machine()} with torch {torch.__version__}, {torch.get_num_threads()} threads."),
        "quick": quick,
        "failed_sections": [oc.section.key for oc in outcomes if not oc.ok],
    }
    paths = render.write(out, outcomes, claims, meta)
    return paths, outcomes
