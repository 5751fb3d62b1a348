"""``storelab probe forgetting --checkpoint DIR --weights-only``: the forgetting probe's weights-only
part, read from the gate tensors alone (``storelab.probes.gate_weights``): per layer and head the
gate's log retention at x = 0 and its half-life, per key channel for KDA layers, and the fraction
of KDA heads that mix fast and slow channels. ``--plot`` draws the half-lives' histogram into
``--out`` (a PNG, with a JSON of the figures beside it).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from storelab.console import clean, console, emit_json, err_console, table


def _life(x: float) -> str:
    return "inf" if not math.isfinite(x) else f"{x:.3g}"


def _layer_rows(r: dict) -> list[list]:
    rows = []
    for lay in r["layers"]:
        lives = [h["half_life"] for h in lay["heads"]]
        mixing = [h["mixes"] for h in lay["heads"] if "mixes" in h]
        rows.append([lay["layer"], lay["store"], lay["decay"], len(lives), " ".join(_life(x) for x in lives),
                     f"{sum(mixing)} of {len(mixing)}" if mixing else ""])
    return rows


def weights_only(name: str, checkpoint: Path | None, *, json_: bool, plot: bool, out: Path) -> None:
    """Run the weights-only estimate and print it (a ValueError for a wrong probe or folder)."""
    from storelab.probes.gate_weights import gate_spectra

    if name != "forgetting":
        raise ValueError(f"weights-only: only the forgetting probe has a weights-only part, not {name!r}")
    if checkpoint is None:
        raise ValueError("checkpoint: --weights-only reads a model folder's gate tensors: give --checkpoint DIR")
    png = None
    if plot:
        from storelab.report.gate_plot import plot_path

        png = plot_path(out)               # a suffix matplotlib cannot write is refused before any read
    r = gate_spectra(checkpoint)
    if png is not None:
        from storelab.outputs import atomic_write
        from storelab.report.gate_plot import plot_half_lives

        try:
            plot_half_lives(r, png)
            side = atomic_write(png.with_suffix(".json"), json.dumps({"command": "probe forgetting --weights-only",
                                                                       "result": clean(r)}, indent=2))
        except OSError as e:
            raise ValueError(f"out: cannot write {png}: {e}") from None
        (err_console if json_ else console).print(f"wrote {png} and {side}", highlight=False, soft_wrap=True)
    if json_:
        emit_json(r)
        return
    rd, e = r["read"], r["essay"]
    console.print(table(f"probe forgetting, weights only: {r['model']} (essay: {e['source']})",
                        ["figure", "ours", "essay (large models)"],
                        [["median half-life at x = 0 (tokens)", r["median_half_life"], ""],
                         ["KDA heads mixing fast and slow channels", r["kda_mixing_fraction"],
                          e["kda_mixing_fraction"]],
                         ["bytes read (headers + gates)", rd["bytes_read"], ""],
                         ["checkpoint bytes", rd["checkpoint_bytes"], ""]]))
    console.print(table("half-life at x = 0 per head (tokens; KDA: of the mean over its channels)",
                        ["layer", "store", "decay", "heads", "half-lives", "mixing heads"], _layer_rows(r)))
