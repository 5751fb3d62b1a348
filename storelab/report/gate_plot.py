"""The weights-only forgetting figure: a histogram of the gates' half-lives at x = 0.

``plot_half_lives(result, path)`` draws ``storelab.probes.gate_weights.gate_spectra``'s result:
per-head half-lives of the layers with a decay per head (Gated DeltaNet) and per-channel ones
of the layers with a decay per key channel (KDA), on log-spaced bins, with the 64-token line of
the channel-fade estimate (a half-life of 64 ln 2 / ln 1000, 6.4 tokens).
"""

from __future__ import annotations

import math
from pathlib import Path

from storelab.outputs import atomic_path
from storelab.probes.forgetting import FADE, WITHIN
from storelab.report.memory_plot import plot_path

__all__ = ["plot_half_lives", "plot_path"]


def plot_half_lives(result: dict, path: Path) -> Path:
    """Draw the histogram into ``plot_path(path)``; return the file written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = plot_path(path)
    series: dict[str, list[float]] = {}
    for lay in result["layers"]:
        for h in lay["heads"]:
            if "channel_half_lives" in h:
                series.setdefault("per key channel", []).extend(h["channel_half_lives"])
            else:
                series.setdefault("per head", []).append(h["half_life"])
    finite = [x for xs in series.values() for x in xs if math.isfinite(x) and x > 0]
    lo, hi = (min(finite), max(finite)) if finite else (1.0, 10.0)
    lo, hi = math.floor(math.log10(lo)), max(math.ceil(math.log10(hi)), math.floor(math.log10(lo)) + 1)
    bins = [10 ** (lo + (hi - lo) * k / 40) for k in range(41)]
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for label, xs in series.items():
        ax.hist([x for x in xs if math.isfinite(x) and x > 0], bins=bins, alpha=0.6, label=f"{label} ({len(xs)})")
    fade = WITHIN * math.log(2.0) / -math.log(FADE)   # the channel-fade estimate's line: gone within 64 tokens
    ax.axvline(fade, color="k", lw=0.8, ls="--", label=f"fades to {FADE:g} within {WITHIN} tokens")
    ax.set_xscale("log")
    ax.set(title=f"Half-lives at x = 0 from the weights: {result['model']}", xlabel="half-life (tokens)",
           ylabel="count")
    ax.legend(fontsize=8)
    fig.tight_layout()
    try:
        with atomic_path(path) as tmp:     # a kill leaves the old figure or the new one
            fig.savefig(tmp, dpi=120, format=path.suffix[1:].lower())
    finally:
        plt.close(fig)
    return path
