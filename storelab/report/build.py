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


def default_sections(checkpoint: str | Path | None = None) -> list[Section]:
    """The report's sections; with a model folder, the checkpoint section last."""
    from storelab.report import sections as S

    if checkpoint is None:
        return list(S.SECTIONS)
    return [*S.SECTIONS, checkpoint_section_of(checkpoint)]


def checkpoint_section_of(checkpoint: str | Path) -> Section:
    from storelab.report import sections as S
    from storelab.report.checkpoint_section import checkpoint_section

    n = len(S.SECTIONS) + 1
    return Section("checkpoint", f"{n}. The essay's measurements on {Path(checkpoint).name}", checkpoint_section)


def check_checkpoint(checkpoint: str | Path) -> Path:
    """A model folder with its tokenizer (the checkpoint section reads text), checked before any section runs."""
    from storelab.outputs import KINDS, folder_kind
    from storelab.text import TOKENIZER

    p = Path(checkpoint)
    kind = folder_kind(p)
    if kind is None:
        raise ValueError(f"checkpoint: {p} does not exist")
    if kind not in ("hf", "save"):
        raise ValueError(f"checkpoint: {p} is {KINDS.get(kind, kind)}; the report's checkpoint section probes a "
                         f"model folder (config.json, *.safetensors, tokenizer.json)")
    if not (p / TOKENIZER).is_file():
        raise ValueError(f"checkpoint: {p / TOKENIZER}: missing; the probes read text through the folder's tokenizer")
    return p


def build_report(out: str | Path = "report", *, quick: bool = False, sections: list[Section] | None = None,
                 on_start: Callable[[Section], None] | None = None,
                 on_end: Callable[[SectionOutcome], None] | None = None,
                 force: bool = False, checkpoint: str | Path | None = None,
                 stream: bool = False, device: str = "cpu",
                 dtype: str | None = None) -> tuple[dict[str, Path], list[SectionOutcome]]:
    """Run the sections, then write the report into ``out``. The folder is checked first
    (``storelab.outputs``): a report folder is rewritten, a new or empty one filled; any other
    kind, or a folder holding a file of the report's names, is refused unless ``force``.
    ``checkpoint``: a model folder (with tokenizer.json) adds the checkpoint section, the probes run on
    it (``stream``: its layers' weights read during their calls) on ``device`` in ``dtype`` (None: its own)."""
    out = Path(out)
    check_folder(out, "report", FILES, force=force)
    ckpt = None if checkpoint is None else check_checkpoint(checkpoint)
    out.mkdir(parents=True, exist_ok=True)
    ctx = Context(out=out, quick=quick, checkpoint=ckpt, stream=stream, device=device, dtype=dtype)
    outcomes = run_sections(sections if sections is not None else default_sections(ckpt), ctx, on_start, on_end)
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
