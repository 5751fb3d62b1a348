"""``storelab probe --out DIR``: ``write_out(folder, doc, results)`` writes ``probe.json`` and one figure
per probe (``storelab.report.probe_figures``) into a folder checked by ``storelab.outputs.check_folder``
(kind ``probe``, ``OUT_FILES``) before the work starts. What runs on a model folder's text is
``storelab.probes.on_folder``."""

from __future__ import annotations

import json
from pathlib import Path

OUT_FILES = ("probe.json", "*.png")


def write_out(folder: Path, doc: dict, results: dict) -> list[str]:
    """``probe.json`` (the document) and the figures, atomically; the file names written."""
    from storelab.outputs import atomic_write
    from storelab.report.probe_figures import write_figures

    folder.mkdir(parents=True, exist_ok=True)
    figures = write_figures(results, folder)
    atomic_write(folder / "probe.json", json.dumps({**doc, "figures": figures}, indent=1, default=str))
    return ["probe.json", *figures]
