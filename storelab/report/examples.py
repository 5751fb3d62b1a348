"""Section 5 of the report: the essay's five worked examples, recomputed by the code."""

from __future__ import annotations

import math

import torch

from storelab.report.core import Claim, Context, SectionResult, Table

S = "worked examples"


def example_1() -> list[Claim]:
    from storelab.capacity.linear import worked_example_1

    w = worked_example_1(128)
    return [
        Claim(S, "Ex. 1, d=128: clean recall, outer product, about", 128, w["outer_clean"], 0.0, "signal meets interference at M = d"),
        Claim(S, "Ex. 1, d=128: clean recall, least squares, about", 256, w["lstsq_clean"], 0.0, "Wang's estimate: the outer product's ratio at 2d"),
        Claim(S, "Ex. 1, d=128: discrimination, outer product (n ln n = d^2/8), about", 350, round(w["outer_discrimination"]), 0.05,
              f"solved by Newton's method: n = {w['outer_discrimination']:.1f}"),
        Claim(S, "Ex. 1, d=128: discrimination, best linear map (n ln n = d^2/2), about", 1160, round(w["best_discrimination"]), 0.05,
              f"solved by Newton's method: n = {w['best_discrimination']:.1f}"),
    ]


def example_3() -> list[Claim]:
    """Per-channel forgetting through our GDN and KDA ops, with the essay's numbers."""
    from storelab.ops import gated_delta_rule, kda

    # One head, K = 2, V = 1: the memory "row" (2, 1) is S[:, 0] read against the key.
    S0 = torch.tensor([[2.0], [1.0]], dtype=torch.float64).view(1, 1, 2, 1)
    k = torch.tensor([1.0, 0.0], dtype=torch.float64).view(1, 1, 1, 2)
    v = torch.tensor([3.0], dtype=torch.float64).view(1, 1, 1, 1)
    beta = torch.tensor([0.5], dtype=torch.float64).view(1, 1, 1)
    g_gdn = torch.tensor([math.log(0.5)], dtype=torch.float64).view(1, 1, 1)
    g_kda = torch.tensor([math.log(0.5), 0.0], dtype=torch.float64).view(1, 1, 1, 2)
    _, s_gdn = gated_delta_rule(k, k, v, g=g_gdn, beta=beta, initial_state=S0, output_final_state=True, scale=1.0, mode="recurrent")
    _, s_kda = kda(k, k, v, g=g_kda, beta=beta, initial_state=S0, output_final_state=True, scale=1.0, mode="recurrent")
    row_gdn = tuple(round(float(x), 6) for x in s_gdn.flatten())
    row_kda = tuple(round(float(x), 6) for x in s_kda.flatten())
    return [
        Claim(S, "Ex. 3: GDN, decay 1/2, row (2,1), write 3 under (1,0), beta 1/2 -> row", "(2.0, 0.5)", str(row_gdn), reason="storelab.ops.gated_delta_rule"),
        Claim(S, "Ex. 3: KDA, retention (1/2,1), same write -> row", "(2.0, 1.0)", str(row_kda), reason="storelab.ops.kda"),
    ]


def example_4() -> list[Claim]:
    from storelab.stores.depth import mhc_collapse, mhc_combine

    x = torch.tensor([2.0, 4.0], dtype=torch.float64).view(1, 1, 2, 1)
    mix = torch.tensor([[0.75, 0.25], [0.25, 0.75]], dtype=torch.float64).view(1, 1, 2, 2)
    mixed = mhc_combine(x, torch.zeros(1, 1, 1, dtype=torch.float64), torch.zeros(1, 1, 2, dtype=torch.float64), mix)
    read = mhc_collapse(x, torch.tensor([0.5, 0.5], dtype=torch.float64).view(1, 1, 2))
    y = 2 * read
    out = mhc_combine(x, y, torch.tensor([0.5, 0.5], dtype=torch.float64).view(1, 1, 2), mix)
    return [
        Claim(S, "Ex. 4: doubly stochastic mix of streams (2,4) -> mixed residual", "(2.5, 3.5)", str(tuple(float(a) for a in mixed.flatten()))),
        Claim(S, "Ex. 4: total over the streams is conserved", 6, float(mixed.sum()), 0.0),
        Claim(S, "Ex. 4: block reads average 3, computes 6, half to each -> streams", "(5.5, 6.5)", str(tuple(float(a) for a in out.flatten())),
              reason="storelab.stores.depth.mhc_combine"),
    ]


def example_5() -> list[Claim]:
    from storelab.stores.depth import depth_attend

    values = torch.tensor([[1.0, 0.0], [0.0, 2.0]], dtype=torch.float64).view(1, 1, 2, 2)
    scores = torch.tensor([0.0, math.log(3.0)], dtype=torch.float64).view(1, 1, 2)
    w = torch.softmax(scores, -1).flatten()
    h = depth_attend(scores, values).flatten()
    return [
        Claim(S, "Ex. 5: scores 0 and ln 3 -> weights", "(0.25, 0.75)", str(tuple(round(float(a), 6) for a in w))),
        Claim(S, "Ex. 5: the layer's input", "(0.25, 1.5)", str(tuple(round(float(a), 6) for a in h)), reason="storelab.stores.depth.depth_attend"),
    ]


def example_2() -> list[Claim]:
    from storelab.report.memory import worked_example_2_claims

    return worked_example_2_claims()


def worked_examples_section(ctx: Context) -> SectionResult:
    claims: list[Claim] = []
    errors = []
    for fn in (example_1, example_2, example_3, example_4, example_5):
        try:
            claims += fn()
        except Exception as e:  # one example's failure is shown, the others still run
            errors.append(f"{fn.__name__}: {type(e).__name__}: {e}")
            claims.append(Claim(S, f"{fn.__name__.replace('_', ' ')}", None, None, status="failed", reason=f"{type(e).__name__}: {e}"))
    rows = [[c.claim, c.essay, c.measured, c.status, c.reason] for c in claims]
    if errors:
        raise RuntimeError("worked examples failed: " + "; ".join(errors))
    return SectionResult(
        text="Each worked example of the essay, run through storelab's own ops and stores with exactly the essay's numbers.",
        tables=[Table("Worked examples", ["example", "essay", "code", "status", "how"], rows)],
        claims=claims,
    )
