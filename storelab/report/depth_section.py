"""Section 6 of the report: depth and parallel evaluation (essay section 6).

Beside the scan and the parity construction, every recurrent store registered is trained on parity
(``storelab.capacity.recurrence.parity_runs``) and printed beside what theory predicts from its transition:
diagonal recurrences with decays in (0, 1] (Mamba, Mamba-2, RG-LRU, linear and lightning attention) are in
TC0 and no transition with eigenvalues all >= 0 tracks parity at every length (Merrill, Petty and
Sabharwal, arXiv 2404.08819; Grazzi et al., arXiv 2411.12537), while a delta rule whose write step may
reach 2 (eigenvalue -1, a reflection; in products of Householders too) can. A run whose accuracy at trained lengths
is not above chance (``storelab.probes.validity.learned``) is marked "did not learn": its accuracy past
them says nothing about the theory, and the row makes no claim.
"""

from __future__ import annotations

import math

import torch

from storelab.report.core import Claim, Context, SectionResult, Table

S = "depth and scan"


def _op_scan_check(T: int) -> tuple[float, int]:
    """A Gated DeltaNet layer's outputs by the parallel scan vs the per-token recurrence."""
    from storelab.ops import gated_delta_rule
    from storelab.ops.norm import l2_norm

    g = torch.Generator().manual_seed(0)
    B, H, K, V = 1, 2, 8, 8
    q = l2_norm(torch.randn(B, T, H, K, generator=g, dtype=torch.float64))
    k = l2_norm(torch.randn(B, T, H, K, generator=g, dtype=torch.float64))
    v = torch.randn(B, T, H, V, generator=g, dtype=torch.float64)
    gl = -torch.rand(B, T, H, generator=g, dtype=torch.float64)
    beta = 2 * torch.rand(B, T, H, generator=g, dtype=torch.float64)
    o_ref, s_ref = gated_delta_rule(q, k, v, g=gl, beta=beta, output_final_state=True, mode="recurrent")
    o_scan, s_scan = gated_delta_rule(q, k, v, g=gl, beta=beta, output_final_state=True, mode="scan")
    err = max(float((o_ref - o_scan).abs().max()), float((s_ref - s_scan).abs().max()))
    return err, math.ceil(math.log2(T))


def parity_verdict(run) -> tuple[str, dict]:
    """A trained parity run (``ParityRun``) read against its prediction: "did not learn" unless its accuracy at
    trained lengths is above chance (``learned``); then whether it is above chance past them too (the same
    margin), and whether theory says it can be. Returns the verdict and the check (``Validity.as_dict``)."""
    from storelab.probes.validity import learned

    fit = learned(run.trained, run.chance, what="accuracy at trained lengths")
    if not fit.valid:
        need = fit.thresholds["min_accuracy"]
        return (f"did not learn: {run.trained:.3f} at trained lengths vs chance {run.chance:g} (needs >= {need:.3g})",
                fit.as_dict())
    far = learned(run.long, run.chance, what="accuracy past the trained lengths").valid
    if run.can is None:
        said = ("tracks parity past the trained lengths" if far else "learned the trained lengths only") + \
            "; theory does not settle this transition"
    elif run.can:
        said = ("tracks parity past the trained lengths, as eigenvalue -1 allows" if far else
                "learned the trained lengths only: theory allows more, this training did not find it")
    else:
        said = ("at chance past the trained lengths, as predicted" if not far else
                "above chance past the trained lengths: not as predicted at these lengths (theory bounds every "
                "length; longer strings decide)")
    return said, fit.as_dict()


def _parity_table(runs, quick: bool) -> tuple[Table, list[dict]]:
    from storelab.capacity.recurrence import PARITY_QUICK, PARITY_TRAIN, run_title

    c = PARITY_QUICK if quick else PARITY_TRAIN
    L, trained = c["len_max"], f"{c['past_conv']}..{c['len_max'] - 1}"
    rows, data = [], []
    for run in runs:
        verdict, check = parity_verdict(run)
        rows.append([run_title(run), run.transition.form, run.theory, run.trained, run.long, verdict])
        data.append({**run.as_dict(), "verdict": verdict, "validity": check})
    size = (f"quick sizes: {c['steps']} steps of {c['batch']} strings, too few to learn; the rows show the checks, "
            "not findings" if quick else f"{c['steps']} steps of {c['batch']} strings")
    far = f"{2 * L}..{c['eval_len'] - 1}"
    title = (f"Parity by training, one layer per recurrent store ({size}): accuracy at positions {trained} "
             f"(trained lengths of 2..{L} bits, past what a width-4 convolution sees) and at positions {far}")
    cols = ["store", "transition A_t", "theory", f"accuracy, positions {trained}", f"accuracy, positions {far}",
            "verdict"]
    return Table(title, cols, rows), data


def depth_section(ctx: Context) -> SectionResult:
    from storelab.capacity.recurrence import PARITY_QUICK, PARITY_TRAIN, exp_recurrence, parity_result, parity_runs

    res = exp_recurrence(ctx.quick, trained=False)
    runs = parity_runs(quick=ctx.quick)
    parity_table, parity_data = _parity_table(runs, ctx.quick)
    res.curves += parity_result(runs, train=PARITY_QUICK if ctx.quick else PARITY_TRAIN).curves
    rows = [[r["experiment"], r["criterion"], r["theory"], r["essay"], r["measured"], r.get("note", "")] for r in res.rows]
    claims = []
    for r in res.rows:
        if r.get("essay") is not None:
            claims.append(Claim(S, f"{r['experiment']}: {r['criterion']}", r["essay"], r["measured"], 1e-6, r.get("note", "")))
    T = 100 if ctx.quick else 1000
    err, rounds = _op_scan_check(T)
    rows.append(["Gated DeltaNet op, mode='scan'", f"max |scan - recurrent| over T = {T} (beta in [0, 2])", 0.0, None, err,
                 f"{rounds} rounds of composition instead of {T} sequential steps"])
    claims.append(Claim(S, f"a Gated DeltaNet layer evaluated by a scan in ceil(log2 {T}) rounds equals its recurrence",
                        "equal", "equal" if err < 1e-9 else f"differs by {err:.2e}", reason="storelab.ops.gated_delta_rule(mode='scan'), float64"))
    figures = []
    if res.curves:
        from storelab.capacity.plots import write_plots

        d = ctx.out / "depth"
        d.mkdir(parents=True, exist_ok=True)
        write_plots({"recurrence": res}, d)
        figures = sorted(d.glob("*.png"))
    return SectionResult(
        text=("The recurrences of these layers are affine in the state, so L updates compose in a balanced tree of "
              "about log2 L rounds: the parallel evaluation depth is far below the unrolled depth. The write step's range "
              "decides what one layer can track: with beta up to 2 the transition can have eigenvalue -alpha and a single "
              "layer tracks parity exactly; with beta in [0, 1], as in Kimi K3's released code and Qwen3.8, it cannot. "
              "The second table trains one layer of every recurrent store on parity and prints its accuracy beside "
              "what theory predicts from its transition: the diagonal recurrences (Mamba, Mamba-2, RG-LRU, linear "
              "and lightning attention: one decay in (0, 1] per head or channel, no delta correction) are in TC0 "
              "(Merrill, Petty and Sabharwal, arXiv 2404.08819), and no transition whose eigenvalues are all >= 0, "
              "delta rules with beta <= 1 included, tracks parity at every length (Grazzi et al., arXiv 2411.12537); "
              "a delta rule with beta up to 2 or a product of Householders can. Theory says what one layer can "
              "express, not what training finds; a run that did not learn the trained lengths is marked so and "
              "read as nothing."
              + (" These are quick sizes, too few steps to learn parity: the rows show the checks, not findings."
                 if ctx.quick else "")),
        tables=[Table("Depth, scan and parity", ["experiment", "criterion", "theory", "essay", "measured", "note"], rows),
                parity_table],
        figures=figures, claims=claims, data={"rows": res.rows, "parity_trained": parity_data})
