"""``storelab probe forgetting --checkpoint DIR --weights-only``: the forgetting probe's weights-only
part, read from the gate tensors alone (``storelab.probes.gate_weights``): per layer and head the
gate's log retention at x = 0 and its half-life, per key channel for KDA layers, and the fraction
of KDA heads that mix fast and slow channels. ``--out DIR`` writes probe.json and the half-lives'
histogram (``forgetting_weights.png``) into a folder of the probe kind, checked before any read.
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


def weights_only(name: str, checkpoint: Path | None, *, json_: bool, out: Path | None, force: bool = False) -> None:
    """Run the weights-only estimate and print it (a ValueError for a wrong probe or folder)."""
    from storelab.commands._finite import invalid_fields
    from storelab.commands._probe_text import OUT_FILES
    from storelab.outputs import atomic_write, check_folder
    from storelab.probes.gate_weights import gate_spectra

    if name != "forgetting":
        raise ValueError(f"weights-only: only the forgetting probe has a weights-only part, not {name!r}")
    if checkpoint is None:
        raise ValueError("checkpoint: --weights-only reads a model folder's gate tensors: give --checkpoint DIR")
    if out is not None:
        check_folder(out, "probe", OUT_FILES, force=force, inputs=(checkpoint,))   # before any read
    r = gate_spectra(checkpoint)
    bad = invalid_fields(r)
    if bad:  # a gate tensor with NaN or inf
        raise ValueError(f"weights: the gate tensors of {checkpoint} give non-finite half-lives "
                         f"({', '.join(bad[:4])}): no figure")
    if out is not None:
        from storelab.report.gate_plot import plot_half_lives

        out.mkdir(parents=True, exist_ok=True)
        png = plot_half_lives(r, out / "forgetting_weights.png")
        atomic_write(out / "probe.json", json.dumps({"command": "probe forgetting --weights-only",
                                                     "results": {"forgetting": clean(r)},
                                                     "figures": [png.name]}, indent=1))
        (err_console if json_ else console).print(f"wrote probe.json, {png.name} into {out}", highlight=False,
                                                  soft_wrap=True)
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
