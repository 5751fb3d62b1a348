"""Section 4 of the report: the capacity lab's table and curves."""

from __future__ import annotations

from storelab.report.core import Claim, Context, SectionResult, Table

S = "capacity"


def capacity_section(ctx: Context) -> SectionResult:
    from storelab.capacity import run

    plot_dir = ctx.out / "capacity"
    rows = run(quick=ctx.quick, plot_dir=plot_dir, progress=False)
    figures = sorted(plot_dir.glob("*.png"))
    claims = []
    for r in rows:
        if r.get("essay") is None:
            continue
        wording = f"{r['experiment']}, {r['criterion']} (d or N = {r['d']})"
        note = r.get("note", "") or ""
        if ctx.quick:
            note = f"quick size: the essay's rule evaluated at this size. {note}"
        if isinstance(r["essay"], (int, float)) and r["essay"] == 0:
            # a zero target: reproduced when the measured value is zero to within 0.05 in absolute terms
            ok = isinstance(r["measured"], (int, float)) and abs(r["measured"]) <= 0.05
            claims.append(Claim(S, wording, r["essay"], r["measured"], status="reproduced" if ok else "differs", reason=note))
        else:
            claims.append(Claim(S, wording, r["essay"], r["measured"], 0.25, note))
    table = Table("Capacity: theory, the essay's figure and the measured value",
                  ["experiment", "d", "criterion", "theory", "essay", "measured", "measured/essay", "note"],
                  [[r["experiment"], r["d"], r["criterion"], r["theory"], r["essay"], r["measured"], r["ratio"], r.get("note", "")]
                   for r in rows])
    return SectionResult(
        text=("Each capacity figure of the essay's sections 2, 3 and 6 as an experiment: random unit keys and values, "
              "seeded; the load where the criterion fails is found by search over the number stored. "
              "The essay column is the essay's rule evaluated at the size measured (its own figure where the size is the essay's); "
              "a claim counts as reproduced within 25 %. "
              + ("Quick sizes: smaller d than the essay's." if ctx.quick else "")),
        tables=[table], figures=figures, claims=claims, data=rows)
