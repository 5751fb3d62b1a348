"""Section 8 of the report: where the stored value goes as the dictionary outgrows the state.

The hybrid of section 7 (three KDA layers to one attention layer, per-head key width d = 32) is
trained afresh for each number of dictionary entries n, every prompt holding exactly n, from well
below d to above it; the state-swap probe (Lee et al., arXiv 2609.33093) then measures which store
moves the answer when one stored value changes. A delta-rule state of d x d per head holds about d
associations with nearly orthogonal keys (arXiv 2102.11174); below that the recurrent layers can carry
the value, above it they cannot all of it, and the cache must. One vocabulary (``n_symbols`` keys
and values) serves every point, so only the number of entries, and with it the prompt length
(2 n + 17 tokens), changes. A point whose hybrid did not learn (or whose swap moved nothing) keeps
its accuracy and chance but no fraction, and the sentence on where the value goes reads only the
points that learned (``storelab.probes.validity``).
"""

from __future__ import annotations

from typing import Any

from storelab.report.core import Context, SectionResult, Table
from storelab.report.probe_rows import cell

# entries per prompt against the per-head d of 32: an eighth of it to twice it
ENTRIES = (4, 8, 16, 32, 64)
SECONDS_EACH = 90.0
QUICK_ENTRIES = (4, 40)  # --quick: two points, a smoke check
QUICK_SECONDS_EACH = 5.0


def capacity_sweep(entries: tuple[int, ...] = ENTRIES, seconds_each: float = SECONDS_EACH, *, seed: int = 0,
                   n_probe: int = 64, **overrides: Any) -> list[dict[str, Any]]:
    """One trained hybrid per number of entries; per point the training figures and the swap's fractions.

    ``overrides`` go to ``train_dictionary_hybrid`` (model options, batch size, threads)."""
    from storelab.probes.swap import state_swap
    from storelab.tasks import make_task
    from storelab.train import train_dictionary_hybrid

    n_symbols = max(entries) + 8  # one vocabulary for every point, and spare values for the swap
    rows = []
    for n in entries:
        model, m = train_dictionary_hybrid(seconds_each, seed, pairs=(n, n), n_symbols=n_symbols, **overrides)
        swap = state_swap(model, make_task(**m["task_config"]), n=n_probe, seed=1)
        d = min(m["state_head_dims"])
        rows.append({"entries": n, "d": d, "entries_over_d": n / d, "prompt_tokens": m["prompt_tokens"],
                     "params": m["params"], "steps": m["steps"], "seconds": m["seconds"],
                     "retrieval": m["retrieval"], "compliance": m["compliance"],
                     "answer_accuracy": swap["answer_accuracy"], "chance": swap["chance"],
                     "valid": swap["valid"], "reason": swap["reason"], "validity": swap["validity"],
                     "recurrent_fraction": swap["recurrent_fraction"], "cache_fraction": swap["cache_fraction"]})
    return rows


def _crossing(rows: list[dict[str, Any]]) -> str:
    """One sentence on where the recurrent and cache fractions cross, from the checked rows only."""
    left_out = [r for r in rows if not r["valid"]]
    rows = [r for r in rows if r["valid"]]
    if not rows:
        return ("No point measured anything: at every size the swap found no effect to divide (the hybrid did not "
                "learn the task, or the swap did not move its answer), so no share is printed and nothing is "
                "concluded about where the stored value goes.")
    gone = ""
    if left_out:
        gone = (f" The points at {', '.join(str(r['entries']) for r in left_out)} entries are left out: "
                f"{'; '.join(r['reason'] for r in left_out)}.")
    lead = ["state" if r["recurrent_fraction"] > r["cache_fraction"] else "cache" for r in rows]
    every = "every point" if not left_out else "every point that learned"
    if len(set(lead)) == 1:
        where = "the recurrent states" if lead[0] == "state" else "the attention caches"
        return f"At {every} the larger share of the answer's shift went through {where}.{gone}"
    i = next(i for i in range(1, len(lead)) if lead[i] != lead[i - 1])
    a, b = rows[i - 1], rows[i]
    return (f"The larger share moved from {'the states' if lead[i - 1] == 'state' else 'the caches'} to "
            f"{'the states' if lead[i] == 'state' else 'the caches'} between {a['entries']} and {b['entries']} "
            f"entries ({a['entries_over_d']:.2g} and {b['entries_over_d']:.2g} times d).{gone}")


def sweep_section(ctx: Context) -> SectionResult:
    entries, seconds = (QUICK_ENTRIES, QUICK_SECONDS_EACH) if ctx.quick else (ENTRIES, SECONDS_EACH)
    overrides = dict(task_preset="tiny", eval_examples=32, batch_size=16) if ctx.quick else {}
    rows = capacity_sweep(entries, seconds, seed=ctx.seed, n_probe=16 if ctx.quick else 64, **overrides)
    d = rows[0]["d"]
    table = [[r["entries"], round(r["entries_over_d"], 3), r["prompt_tokens"], r["steps"], r["retrieval"],
              r["answer_accuracy"], r["chance"], cell(r["recurrent_fraction"], r["validity"]),
              cell(r["cache_fraction"], r["validity"])] for r in rows]
    return SectionResult(
        text=(f"The hybrid of section 7 trained once per dictionary size, {seconds:.0f} s each, every prompt holding "
              f"exactly n entries, n from {entries[0]} to {entries[-1]} against the recurrent state's per-head key "
              f"width d = {d}; then the state swap: the fraction of the answer's shift that patching all recurrent "
              "states, or all attention caches, moves (1: all of it). Below d a state can hold every entry; above it "
              "it cannot, and the essay's large models, on long prompts, answer from the cache. A point's fractions "
              "count only where its hybrid answers the swap's prompts above chance and the swap moves the answer "
              "(storelab.probes.validity); elsewhere the table says why. "
              + _crossing(rows)),
        tables=[Table(f"Entries against the state's capacity (d = {d})",
                      ["entries n", "n / d", "prompt tokens", "steps", "retrieval", "swap: answers right",
                       "chance", "moved by the states", "moved by the caches"], table)],
        data={"rows": rows, "seconds_each": seconds})
