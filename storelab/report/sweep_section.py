"""Section 8 of the report: where the stored value goes as the dictionary grows, and whether that is learned.

Three measurements on the trained subjects (``storelab.subjects``), three seeds each:

1. **The curve.** The two 3:1 hybrids (KDA and Gated DeltaNet, recurrent heads of d = 8) probed by the
   state swap (Lee et al., arXiv 2609.33093) at every size from d/8 to 4 d entries (``SIZES``): the share
   of the answer's shift that the recurrent states and the caches move, mean and spread over the seeds
   whose check passed, as a table and a figure. A point where no seed learned or the swap moved nothing
   is marked and left out of the figure. A delta-rule state of d x d holds about d associations (arXiv
   2102.11174); the subjects trained on a mixture of sizes, 60 % of prompts at 2 d to 4 d.
2. **The division is learned** (the essay, section 3: "Capacity is compatible with this division but does
   not explain it. [...] The division is learned."). At the small sizes (1, 2 and 4 entries, at most d/2,
   where a state could hold every entry), compare the hybrid trained on the mixture with the same hybrid
   trained on small dictionaries only (``kda-small``). If the mixture's hybrid reads small dictionaries
   through its caches while the small-only one reads them through its states, which store carries the
   value follows what training asked of the model, not what the state could hold at that size.
3. **Forgetting** (GateSight's probe, ``storelab.probes.forgetting``): each recurrent head's half-life on
   the task's prompts and how stable the heads' ranking from fast to slow is across prompts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from storelab.outputs import atomic_path
from storelab.report.core import Claim, Context, SectionResult, Table, checked_claim
from storelab.report.subject_probes import Subjects, combined, show, spread
from storelab.report.trained_section import HYBRIDS, subjects_of

S = "trained hybrid"
SMALL_SIZES = (1, 2, 4)
ESSAY_LEARNED = ("Capacity is compatible with this division but does not explain it. [...] recall through the state "
                 "fails even in minimal versions of their tasks. The division is learned.")


def curve(subs: Subjects, name: str, sizes: tuple[int, ...], examples: int) -> list[dict[str, Any]]:
    """Per size, the state swap on every seed of ``name`` and its summary."""
    from storelab.probes.swap import state_swap

    rows = []
    for n in sizes:
        swaps = subs.at(name, n, state_swap, n=examples, seed=1)
        rows.append({"entries": n, "check": combined([s["validity"] for s in swaps]),
                     "recurrent_fraction": spread([s["recurrent_fraction"] for s in swaps]),
                     "cache_fraction": spread([s["cache_fraction"] for s in swaps]),
                     "answer_accuracy": spread([s["answer_accuracy"] for s in swaps]),
                     "chance": swaps[0]["chance"] if swaps else None,
                     "per_seed": [{k: s[k] for k in ("recurrent_fraction", "cache_fraction", "answer_accuracy",
                                                     "valid", "reason")} for s in swaps]})
    return rows


def lead(row: dict[str, Any]) -> str | None:
    r, c = row["recurrent_fraction"], row["cache_fraction"]
    if r is None or c is None:
        return None
    return "states" if r["mean"] > c["mean"] else "caches"


def crossing(rows: list[dict[str, Any]], d: int) -> str:
    """One sentence on which store leads at each size, from the measured points only."""
    left_out = [r["entries"] for r in rows if lead(r) is None]
    measured = [r for r in rows if lead(r) is not None]
    gone = f" Left out (no seed measured anything): {', '.join(map(str, left_out))} entries." if left_out else ""
    if not measured:
        return "No size measured anything: no share is printed and nothing is concluded." + gone
    leads = [lead(r) for r in measured]
    if len(set(leads)) == 1:
        return f"At every measured size, {measured[0]['entries']} to {measured[-1]['entries']} entries, the larger share " \
               f"of the answer's shift went through the {leads[0]}.{gone}"
    parts = [f"{r['entries']} ({r['entries'] / d:.2g} d): {lead(r)}" for r in measured]
    return "The store carrying the larger share, by entries: " + "; ".join(parts) + "." + gone


def division(subs: Subjects, examples: int) -> dict[str, Any]:
    """Item 4: at the small sizes, the mixture-trained hybrid against the small-only one."""
    out: dict[str, Any] = {"sizes": list(SMALL_SIZES)}
    for name in ("kda-hybrid", "kda-small"):
        out[name] = curve(subs, name, SMALL_SIZES, examples)
    mix = [lead(r) for r in out["kda-hybrid"]]
    small = [lead(r) for r in out["kda-small"]]
    if any(x is None for x in mix + small):
        answer = ("not measured: at some small size a model did not learn or the swap moved nothing, so the two "
                  "cannot be compared there")
    elif all(x == "caches" for x in mix) and all(x == "states" for x in small):
        answer = ("learned: at 1 to 4 entries, where a state holds every entry, the hybrid trained mostly on large "
                  "dictionaries reads the value through its caches, and the same hybrid trained on small ones only "
                  "reads it through its states")
    elif mix == small:
        answer = (f"capacity, not training: both read small dictionaries through their {mix[0]}, whatever they "
                  "were trained on")
    else:
        answer = ("mixed: by size, the mixture's hybrid leads with " + ", ".join(mix) + " and the small-only one with "
                  + ", ".join(small))
    def seeds(name: str, where: str) -> str:
        pts = [p for r in out[name] for p in r["per_seed"] if p["valid"]]
        said = sum((p["recurrent_fraction"] > p["cache_fraction"]) == (where == "states") for p in pts)
        return f"{said} of {len(pts)} measured (size, seed) points lead with the {where}"

    if not answer.startswith("not measured"):
        answer += (f" (by seed: kda-hybrid {seeds('kda-hybrid', 'caches')}; kda-small "
                   f"{seeds('kda-small', 'states')})")
    out["answer"] = answer
    return out


def forgetting_rows(subs: Subjects, n: int) -> tuple[list[list], dict[str, Any], list[dict]]:
    """Half-lives and the ranking's stability per recurrent subject and seed, on the task's prompts."""
    from storelab.probes.forgetting import forgetting

    rows, data, checks = [], {}, []
    for name in (*HYBRIDS, "recurrent"):
        rs = subs.at(name, n, forgetting, n=16, seed=3)
        med = spread([r["median_half_life"] for r in rs])
        rank = spread([r["ranking_stability"] for r in rs])
        low = spread([r.get("ranking_stability_min") for r in rs])
        chk = combined([r["validity"] for r in rs])
        checks.append(chk)
        data[name] = {"median_half_life": med, "ranking_stability": rank, "ranking_stability_min": low,
                      "check": chk, "per_seed": [{k: r.get(k) for k in ("median_half_life", "ranking_stability",
                                                                        "ranking_stability_min", "valid", "reason")}
                                                 for r in rs]}
        v = chk["verdict"]
        rows.append([name, show(med, v, pct=False) if chk["valid"] else v,
                     show(rank, v, pct=False) if chk["valid"] else v,
                     show(low, v, pct=False) if chk["valid"] else v])
    return rows, data, checks


def figure(out: Path, curves: dict[str, list[dict]], d: int) -> Path:
    """Shares moved by the states and by the caches against n / d, one panel per hybrid, seeds' spread as bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 3.6), sharey=True)
    for ax, (name, rows) in zip(axes if len(curves) > 1 else [axes], curves.items()):
        for key, label, color in (("recurrent_fraction", "recurrent states", "tab:orange"),
                                  ("cache_fraction", "attention caches", "tab:blue")):
            pts = [(r["entries"] / d, r[key]) for r in rows if r[key] is not None]
            if not pts:
                ax.text(0.5, 0.5 if key == "cache_fraction" else 0.6, f"{label}: nothing measured",
                        transform=ax.transAxes, ha="center", fontsize=8)
                continue
            x = [p[0] for p in pts]
            m = [p[1]["mean"] for p in pts]
            err = [[max(0.0, p[1]["mean"] - p[1]["min"]) for p in pts], [max(0.0, p[1]["max"] - p[1]["mean"]) for p in pts]]
            ax.errorbar(x, m, yerr=err, marker="o", capsize=3, label=label, color=color)
        ax.axvline(1.0, color="grey", lw=0.8, ls="--")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("entries n / d (d = %d)" % d)
        ax.set_title(name)
        ax.grid(alpha=0.3)
    (axes[0] if len(curves) > 1 else axes).set_ylabel("share of the answer's shift moved")
    ax.set_xlim(2 ** -3.5, 2 ** 2.5)
    first = axes[0] if len(curves) > 1 else axes
    if first.get_legend_handles_labels()[0]:
        first.legend(fontsize=8)
    fig.tight_layout()
    path = out / "sweep_shares.png"
    with atomic_path(path) as tmp:  # listed in the folder's manifest: the report's own to redraw
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return path


def _table(rows: list[dict], d: int) -> list[list]:
    return [[r["entries"], f"{r['entries'] / d:.3g}", show(r["answer_accuracy"]),
             "" if r["chance"] is None else f"{r['chance']:.4f}",
             show(r["recurrent_fraction"]) if r["check"]["valid"] else r["check"]["verdict"],
             show(r["cache_fraction"]) if r["check"]["valid"] else r["check"]["verdict"],
             "" if r["check"]["valid"] and "seed" not in r["check"]["reason"] else r["check"]["reason"]]
            for r in rows]


def sweep_section(ctx: Context) -> SectionResult:
    from storelab.subjects import HEAD_DIM, SIZES

    subs = subjects_of(ctx)
    examples = 32 if ctx.quick else 96
    d = HEAD_DIM
    curves = {name: curve(subs, name, SIZES, examples) for name in HYBRIDS}
    div = division(subs, examples)
    f_rows, f_data, _ = forgetting_rows(subs, 16)
    fig = figure(ctx.out, curves, d)
    cols = ["entries n", "n / d", "clean prompts right", "chance", "moved by the states", "moved by the caches",
            "checks that failed"]
    tables = [Table(f"{name}: the state swap by entries (d = {d}; mean [lowest, highest] over seeds)", cols,
                    _table(rows, d)) for name, rows in curves.items()]
    tables.append(Table("The division is learned? At 1 to 4 entries (a state holds every one): trained on the mixture "
                        "(kda-hybrid) against trained on small dictionaries only (kda-small)",
                        ["subject", *cols], [[name, *row] for name in ("kda-hybrid", "kda-small")
                                             for row in _table(div[name], d)]))
    tables.append(Table("Forgetting on the task's prompts (16 entries): each recurrent head's half-life, the median over "
                        "heads, and the ranking of heads from fast to slow across prompts (mean and lowest Spearman)",
                        ["subject", "median half-life (tokens)", "ranking stability (mean)", "ranking stability (lowest pair)"],
                        f_rows))
    how = "the trained subjects kda-hybrid and kda-small (d = 8), state swap at 1, 2 and 4 entries, three seeds"
    chk = f_data["kda-hybrid"]["check"]
    claims = [Claim(S, "the division of labour is learned, not forced by capacity", "learned",
                    div["answer"].split(":")[0], reason=div["answer"] + f" ({how})",
                    status="" if not div["answer"].startswith("not measured") else "not measured"),
              checked_claim(S, "the ranking of recurrent heads from fast to slow is almost the same for every document",
                            1.0, (f_data["kda-hybrid"]["ranking_stability"] or {}).get("mean"), chk,
                            within=(0.8, 1.0), reason="mean Spearman between prompts, kda-hybrid's seeds"),
              ]
    gone = [f"{name} seed {x['seed']} ({x['verdict']})" for name in (*HYBRIDS, "kda-small", "recurrent")
            for x in subs.left_out(name)]
    left = (" Seeds that did not learn by their recipe's bar are in no figure: " + "; ".join(gone) + ".") if gone else ""
    return SectionResult(
        text=(f"The two 3:1 hybrids of section 7 (recurrent heads of d = {d}), probed by the state swap at every size "
              f"from {SIZES[0]} to {SIZES[-1]} entries (d/8 to 4 d), three seeds each; a point counts only from seeds "
              "whose model answers above chance and whose swap moves the answer. "
              + " ".join(f"{name}: {crossing(rows, d)}" for name, rows in curves.items())
              + f" The essay: \"{ESSAY_LEARNED}\" Measured here: {div['answer']}." + left),
        tables=tables, figures=[fig], claims=claims,
        data={"curves": curves, "division": div, "forgetting": f_data, "d": d})
