"""One figure per probe result (``storelab probe --out DIR``), each written atomically.

* state_swap: the swap effect of each layer alone (bars coloured by store: recurrent or cache),
  and, for text prompts, recall against context (the clean answer's accuracy by prompt length);
* keep_one: retrieval and compliance with both stores, the cache only and the state only;
* forgetting: the histogram of the recurrent heads' half-lives (log scale);
* selection (the sweep on documents): per selecting layer, recall of the exact top-k and the
  attention mass missed against context length, dashed for top-k multipliers above the first;
* mhc: the perplexity change of each condition (the mix replaced by the identity or its average).

``write_figures(results, folder) -> list of file names`` draws what each result holds (a probe
without the data for its figure gets none) with matplotlib's Agg canvas, no global state. A result
whose check failed (``valid`` false: the model did not learn, or the swap moved nothing;
``storelab.probes.validity``) gets no figure: its fractions are not measurements.
"""

from __future__ import annotations

import math
from pathlib import Path

from storelab.outputs import atomic_path

__all__ = ["write_figures", "FIGURES"]

COLOURS = {"recurrent": "#c0504d", "cache": "#4f81bd"}


def _figure(ncols: int):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5.5 * ncols, 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, [fig.add_subplot(1, ncols, i + 1) for i in range(ncols)]


def _state_swap(r: dict, fig_axes):
    layers = r.get("per_layer") or []
    if not layers:
        return False
    fig, axes = fig_axes(2 if r.get("per_example") else 1)
    ax = axes[0]
    xs = [x["layer"] for x in layers]
    ys = [x["fraction"] if x["fraction"] is not None else 0.0 for x in layers]
    ax.bar(xs, ys, color=[COLOURS[x["store"]] for x in layers])
    from matplotlib.patches import Patch

    ax.axhline(0, color="k", lw=0.5)
    ax.set(xlabel="layer", ylabel="fraction of the shift moved", title="swap effect per layer (one layer alone)")
    ax.legend(handles=[Patch(color=c, label=store) for store, c in COLOURS.items()])
    if len(axes) > 1:
        by_len: dict[int, list[bool]] = {}
        for e in r["per_example"]:
            by_len.setdefault(e["tokens"], []).append(e["correct"])
        ls = sorted(by_len)
        axes[1].plot(ls, [sum(by_len[k]) / len(by_len[k]) for k in ls], "o-")
        axes[1].set(xlabel="prompt tokens", ylabel="answer accuracy (prompt A)", ylim=(-0.05, 1.05),
                    title="recall against context")
    return fig


def _keep_one(r: dict, fig_axes):
    conds = ("full", "cache_only", "state_only")
    rows = [("retrieval", [r[c]["retrieval"] for c in conds]), ("compliance", [r[c]["compliance"] for c in conds])]
    if r.get("persona"):
        rows.append(("persona", [r["persona"][c] for c in conds]))
    fig, (ax,) = fig_axes(1)
    w = 0.8 / len(rows)
    for k, (label, vals) in enumerate(rows):
        ax.bar([i + k * w for i in range(3)], [v if v is not None else 0.0 for v in vals], w, label=label)
    ax.set_xticks([i + w * (len(rows) - 1) / 2 for i in range(3)], ["both stores", "cache only", "state only"])
    ax.set(ylabel="rate", ylim=(0, 1.05), title="keep one store")
    ax.legend()
    return fig


def _forgetting(r: dict, fig_axes):
    hl = [h["half_life"] for h in r.get("heads", []) if math.isfinite(h["half_life"])]
    if not hl:
        return False
    fig, (ax,) = fig_axes(1)
    lo, hi = math.log10(max(min(hl), 1e-3)), math.log10(max(max(hl), 1e-3))
    bins = [10 ** (lo + (hi - lo + 1e-9) * i / 20) for i in range(21)]
    ax.hist(hl, bins=bins)
    ax.set_xscale("log")
    med = r.get("median_half_life")
    if med:
        ax.axvline(med, color="k", ls="--", label=f"median {med:.3g}")
        ax.legend()
    ax.set(xlabel="half-life (tokens)", ylabel="recurrent heads", title="how fast the recurrent heads forget")
    return fig


def _selection(r: dict, fig_axes):
    layers = [x for x in r.get("layers", []) if "points" in x]     # the sweep's result, not the task probe's
    if not layers:
        return False
    fig, (a1, a2) = fig_axes(2)
    colours = [f"C{j % 10}" for j in range(len(layers))]
    for j, lay in enumerate(layers):
        for n, m in enumerate(r["topk"]):
            pts = [p for p in lay["points"] if p["topk_multiplier"] == m and p["recall"] is not None]
            if not pts:
                continue
            xs = [p["context"] for p in pts]
            style = dict(color=colours[j], ls="-" if n == 0 else "--", marker="o", ms=3)
            label = f"layer {lay['layer']} ({lay['kind']}{'' if lay['own_indexer'] else ', shared'})"
            a1.plot(xs, [p["recall"] for p in pts], label=label if n == 0 else None, **style)
            a2.plot(xs, [p["mass_missed"] for p in pts], **style)
    for ax, what in ((a1, "recall of the exact top-k"), (a2, "attention mass missed")):
        ax.set_xscale("log", base=2)
        ax.set(xlabel="context length (tokens)", ylabel=what, ylim=(-0.02, 1.02))
    a1.set_title(f"top-k x {', '.join(map(str, r['topk']))} (dashed: larger multipliers)", fontsize=9)
    a1.legend(fontsize=6)
    return fig


def _mhc(r: dict, fig_axes):
    conditions = r.get("conditions") or {}
    if not conditions or any("perplexity_change" not in v for v in conditions.values()):
        return False
    fig, (ax,) = fig_axes(1)
    names = list(conditions)
    ax.bar(range(len(names)), [100 * conditions[k]["perplexity_change"] for k in names])
    ax.set_xticks(range(len(names)), [k.replace("_", " ") for k in names], fontsize=7)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set(ylabel="perplexity change (%)",
           title=f"mHC mix replaced (baseline perplexity {r.get('base_perplexity', float('nan')):.3g})")
    return fig


FIGURES = {"state_swap": _state_swap, "keep_one": _keep_one, "forgetting": _forgetting, "selection": _selection,
           "mhc": _mhc}


def write_figures(results: dict[str, dict], folder: Path) -> list[str]:
    """``<probe>.png`` in ``folder`` for each result that has a figure; the names written."""
    out = []
    for name, r in results.items():
        draw = FIGURES.get(name)
        fig = draw(r, _figure) if draw is not None and r.get("valid", True) else False
        if fig is False:
            continue
        path = Path(folder) / f"{name}.png"
        with atomic_path(path) as tmp:
            fig.savefig(tmp, dpi=110)
        out.append(path.name)
    return out
