"""PNG curves of the capacity lab: measured points (markers) beside their theory lines."""

from __future__ import annotations

import re
from pathlib import Path

from storelab.capacity.common import Curve, Result
from storelab.outputs import atomic_path


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")[:60]


def draw(curve: Curve, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    seen = {"measured": 0, "theory": 0}          # the i-th measured series pairs with the i-th theory line
    for s in curve.series:
        color = colors[seen[s["kind"]] % len(colors)]
        seen[s["kind"]] += 1
        if s["kind"] == "measured":
            ax.plot(s["x"], s["y"], "o", ms=4, label=s["label"], color=color)
        else:
            ax.plot(s["x"], s["y"], "-", lw=1.2, label=s["label"], color=color, alpha=0.7)
    if curve.hline is not None:
        ax.axhline(curve.hline, color="grey", lw=0.8, ls=":")
    if curve.logx:
        ax.set_xscale("log")
    if curve.logy:
        ax.set_yscale("log")
    ax.set_xlabel(curve.xlabel)
    ax.set_ylabel(curve.ylabel)
    ax.set_title(curve.title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)


def write_plots(results: dict[str, Result], out: Path) -> list[Path]:
    paths = []
    for name, res in results.items():
        for i, curve in enumerate(res.curves):
            p = out / f"{name}_{i}_{_slug(curve.title)}.png"
            draw(curve, p)
            paths.append(p)
    return paths
