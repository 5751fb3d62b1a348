"""Section 4 of the report: the capacity lab's table and curves."""

from __future__ import annotations

from storelab.report.core import NOT_CHECKABLE, Claim, Context, SectionResult, Table

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
        if ctx.quick:
            claims.append(Claim(S, wording, r["essay"], r["measured"], status=NOT_CHECKABLE,
                                reason="--quick measures at smaller sizes than the essay's; run the full report"))
        else:
            claims.append(Claim(S, wording, r["essay"], r["measured"], 0.25, r.get("note", "")))
    table = Table("Capacity: theory, the essay's figure and the measured value",
                  ["experiment", "d", "criterion", "theory", "essay", "measured", "measured/essay", "note"],
                  [[r["experiment"], r["d"], r["criterion"], r["theory"], r["essay"], r["measured"], r["ratio"], r.get("note", "")]
                   for r in rows])
    return SectionResult(
        text=("Each capacity figure of the essay's sections 2, 3 and 6 as an experiment: random unit keys and values, "
              "seeded; the load where the criterion fails is found by search over the number stored. "
              + ("Quick sizes: smaller d than the essay's, so the essay column is context only." if ctx.quick else "")),
        tables=[table], figures=figures, claims=claims, data=rows)
