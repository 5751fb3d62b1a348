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


FILES = ("report.html", "report.md", "report.json", "*.png", "capacity", "depth", "subjects")  # what a report folder holds


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
    from storelab.outputs import KINDS
    from storelab.text import TOKENIZER

    from storelab.probes.source import checkpoint_kind

    p = Path(checkpoint)
    kind = checkpoint_kind(p)
    if kind is None:
        raise ValueError(f"checkpoint: {p} does not exist")
    if kind == "gguf":   # weights, tokenizer and chat template in one file
        return p
    if kind not in ("hf", "save"):
        raise ValueError(f"checkpoint: {p} is {KINDS.get(kind, kind)}; the report's checkpoint section probes a "
                         f"model folder (config.json, *.safetensors, tokenizer.json) or a GGUF file")
    if not (p / TOKENIZER).is_file():
        raise ValueError(f"checkpoint: {p / TOKENIZER}: missing; the probes read text through the folder's tokenizer")
    return p


def check_subjects(out: Path, subjects: str | Path | None, retrain: bool, *, force: bool = False) -> Path | None:
    """The subjects folder sections 7 and 8 read, checked before any work: ``--subjects DIR`` must hold every
    subject and seed; ``--retrain`` writes into ``out/subjects`` (a subjects folder, or new)."""
    from storelab.outputs import check_folder as _check
    from storelab.subjects import FILES as SUBJECT_FILES, every, shipped

    if retrain:
        if subjects is not None:
            raise ValueError("--retrain: trains the subjects into the report's folder; give it or --subjects, not both")
        return _check(out / "subjects", "subjects", SUBJECT_FILES, force=force, option="--retrain")
    if subjects is None:
        return None
    p = Path(subjects)
    if not p.is_dir():
        raise ValueError(f"--subjects: {p} is not a folder")
    have = set(shipped(p))
    missing = [f"{n} seed {s}" for n, s in every() if (n, s) not in have]
    if missing:
        raise ValueError(f"--subjects: {p} lacks {missing[0]}"
                         f"{f' and {len(missing) - 1} more' if len(missing) > 1 else ''} "
                         f"(`storelab subjects train --all --out {p}` trains them)")
    return p


def retrain_subjects(folder: Path, on_each: Callable[[dict], None] | None = None) -> dict:
    """Every subject and seed trained by its recipe into ``folder``; how long it took."""
    import os
    import time

    from storelab.subjects import every, train_many

    t0 = time.time()
    done = train_many(every(), folder, workers=min(2, os.cpu_count() or 1),
                      say=on_each)
    return {"seconds": time.time() - t0, "trained": done}


def build_report(out: str | Path = "report", *, quick: bool = False, sections: list[Section] | None = None,
                 on_start: Callable[[Section], None] | None = None,
                 on_end: Callable[[SectionOutcome], None] | None = None,
                 force: bool = False, checkpoint: str | Path | None = None,
                 stream: bool = False, device: str = "cpu",
                 dtype: str | None = None, subjects: str | Path | None = None,
                 retrain: bool = False, on_retrain: Callable[[dict], None] | None = None,
                 full: bool = False) -> tuple[dict[str, Path], list[SectionOutcome]]:
    """Run the sections, then write the report into ``out``. The folder is checked first
    (``storelab.outputs``): a report folder is rewritten, a new or empty one filled; any other
    kind, or a folder holding a file of the report's names, is refused unless ``force``.
    ``checkpoint``: a model folder (with tokenizer.json) adds the checkpoint section, the probes run on
    it (``stream``: its layers' weights read during their calls) on ``device`` in ``dtype`` (None: its own).
    ``subjects``: a folder of trained subjects for sections 7 and 8 (None: the shipped ones); ``retrain``:
    train every subject afresh by its recipe into ``out/subjects`` first (``on_retrain`` after each) and
    probe those. ``full``: section 9's probes of the real language models at their large sizes."""
    out = Path(out)
    if full and quick:
        raise ValueError("--full: the large sizes; --quick the small ones: give at most one")
    check_folder(out, "report", FILES, force=force)
    ckpt = None if checkpoint is None else check_checkpoint(checkpoint)
    subjects = check_subjects(out, subjects, retrain, force=force)
    out.mkdir(parents=True, exist_ok=True)
    retrained = retrain_subjects(subjects, on_retrain) if retrain else None
    ctx = Context(out=out, quick=quick, checkpoint=ckpt, stream=stream, device=device, dtype=dtype,
                  subjects=subjects, full=full)
    outcomes = run_sections(sections if sections is not None else default_sections(ckpt), ctx, on_start, on_end)
    claims = ledger(outcomes)
    meta = {
        "subtitle": ("Every Layer a Store, recomputed: the essay's numbers beside storelab's. "
                     f"{'Quick sizes. ' if quick else ''}Generated {_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d %H:%M} UTC "
                     f"on {platform.machine()} with torch {torch.__version__}, {torch.get_num_threads()} threads."),
        "quick": quick,
        "full": full,
        "failed_sections": [oc.section.key for oc in outcomes if not oc.ok],
        "subjects": "shipped" if subjects is None else str(subjects),
    }
    if retrained is not None:
        meta["retrain_seconds"] = retrained["seconds"]
        meta["subtitle"] += (f" The trained subjects were retrained into {subjects} in "
                             f"{retrained['seconds'] / 60:.0f} min.")
    paths = render.write(out, outcomes, claims, meta)
    return paths, outcomes
