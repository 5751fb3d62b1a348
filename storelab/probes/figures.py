"""``storelab probe --out DIR``: the results as probe.json, one PNG per probe, written safely.

The folder is checked before any work (``check_folder(out, "probe", ...)``) and every file is
written atomically (``storelab.outputs``). Figures: ``selection_sweep.png`` (per selecting layer,
recall of the exact top-k and attention mass missed against context length, one line per layer,
dashed for top-k multipliers above the first) and ``mhc.png`` (perplexity change per condition);
the other probes write their figures into probe.json only.
"""

from __future__ import annotations

import json
from pathlib import Path

from storelab.outputs import atomic_path, atomic_write, check_folder

FILES = ("probe.json", "selection_sweep.png", "mhc.png")


def check_out(out: str | Path, *, force: bool = False) -> Path:
    return check_folder(out, "probe", FILES, force=force)


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def draw_selection(r: dict, path: Path) -> None:
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 4))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for j, lay in enumerate(r["layers"]):
        for n, m in enumerate(r["topk"]):
            pts = [p for p in lay["points"] if p["topk_multiplier"] == m and p["recall"] is not None]
            if not pts:
                continue
            xs = [p["context"] for p in pts]
            style = dict(color=colors[j % len(colors)], ls="-" if n == 0 else "--", marker="o", ms=3)
            label = f"layer {lay['layer']} ({lay['kind']}{'' if lay['own_indexer'] else ', shared'})"
            a1.plot(xs, [p["recall"] for p in pts], label=label if n == 0 else None, **style)
            a2.plot(xs, [p["mass_missed"] for p in pts], **style)
    for ax, what in ((a1, "recall of the exact top-k"), (a2, "attention mass missed")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel(what)
        ax.set_ylim(-0.02, 1.02)
    a1.set_title(f"top-k x {', '.join(map(str, r['topk']))} (dashed: larger multipliers)", fontsize=9)
    a1.legend(fontsize=6)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)


def draw_mhc(r: dict, path: Path) -> None:
    plt = _plt()
    names = list(r["conditions"])
    fig, ax = plt.subplots(figsize=(6.4, 4))
    ax.bar(range(len(names)), [100 * r["conditions"][k]["perplexity_change"] for k in names])
    ax.set_xticks(range(len(names)), [k.replace("_", " ") for k in names], fontsize=7)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_ylabel("perplexity change (%)")
    ax.set_title(f"mHC mix replaced (baseline perplexity {r.get('base_perplexity', float('nan')):.3g})", fontsize=9)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)


DRAW = {"selection_sweep": draw_selection, "mhc": draw_mhc}


def write_outputs(out: Path, doc: dict) -> list[Path]:
    """probe.json and the figure of each result that has one (``doc["results"]``: name -> result)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [atomic_write(out / "probe.json", json.dumps(doc, indent=1, default=str))]
    for name, r in doc["results"].items():
        key = r.get("probe", name)
        if key in DRAW:
            paths.append(out / f"{key}.png")
            DRAW[key](r, paths[-1])
    return paths
