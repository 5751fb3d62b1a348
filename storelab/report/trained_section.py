"""Section 7 of the report: what trained hybrids keep where.

The probes run live on the shipped subjects (``storelab.subjects``: small models trained here by
storelab's own trainer until they do the dictionary-and-language task, three seeds each), or on
subjects trained afresh (``storelab report --retrain``). At 2 d entries (16 against the recurrent
heads' d = 8, far above what a state holds; Afendulev et al.'s dictionaries held 15 to 30), on each
seed: the state swap (Lee et al., arXiv 2609.33093) and keep-one with its paired swap (Afendulev et
al., arXiv 2609.04434). The essay's figures are Qwen3.5-4B's. Each figure is summarised over the
seeds whose check passed (``storelab.probes.validity``: the model answers above chance, the swap
moves the answer); the claims are decided from those seeds only, "not measured" where none passed.
"""

from __future__ import annotations

from typing import Any

from storelab.report.core import Claim, Context, SectionResult, Table, checked_claim
from storelab.report.subject_probes import Subjects, combined, show, spread

S = "trained hybrid"
PROBE_N = 16                 # entries a probed prompt holds: 2 d
HYBRIDS = ("kda-hybrid", "gdn-hybrid")
CONTROLS = ("attention", "recurrent")


def subjects_of(ctx: Context) -> Subjects:
    return Subjects(ctx.subjects, quick=ctx.quick)


def subject_rows(subs: Subjects) -> tuple[list[list], dict[str, Any]]:
    """One row per subject: its layers, seeds that learned, steps, training time, held-out figures."""
    from storelab.subjects import RECIPES, SIZES

    rows, data = [], {}
    for name, r in RECIPES.items():
        metas = subs.metas(name)
        good = [m for m in metas if m["learned"]] or metas    # the figures of the seeds that learned
        held = {k: {w: spread([m["held_out"][str(k)][w] for m in good]) for w in ("retrieval", "compliance")}
                for k in SIZES}
        data[name] = {"layers": r.pattern, "about": r.about, "params": metas[0]["params"],
                      "learned": [m["learned"] for m in metas], "verdicts": [m["verdict"] for m in metas],
                      "steps": metas[0]["steps"], "seconds": [m["seconds"] for m in metas], "held_out": held,
                      "train_mixture": [list(p) for p in r.mix]}
        mix = ", ".join(f"{p[0]:.0%} at {p[1]}-{p[2]}" for p in r.mix)
        learned_of = f"{sum(m['learned'] for m in metas)} of {len(metas)}" + "".join(
            f"; seed {m['seed']}: {m['verdict']}" for m in metas if not m["learned"])
        rows.append([name, r.pattern, metas[0]["params"], mix, learned_of,
                     metas[0]["steps"], f"{sum(m['seconds'] for m in metas) / len(metas):.0f}",
                     *[f"{held[k]['retrieval']['mean']:.2f}" for k in SIZES],
                     f"{min(held[k]['compliance']['min'] for k in SIZES):.2f}"])
    return rows, data


def probe_hybrid(subs: Subjects, name: str, n: int = PROBE_N, examples: int = 128) -> dict[str, Any]:
    """State swap and keep-one on every seed of ``name`` at ``n`` entries, and their summaries."""
    from storelab.probes.swap import keep_one, state_swap

    swaps = subs.at(name, n, state_swap, n=examples, seed=1)
    keeps = subs.at(name, n, keep_one, n=examples, seed=2)
    ret = [k.get("checks", {}).get("retrieval") for k in keeps]
    com = [k.get("checks", {}).get("compliance") for k in keeps]
    out = {"entries": n, "state_swap": swaps, "keep_one": keeps,
           "check_swap": combined([s["validity"] for s in swaps]),
           "check_retrieval": combined([c for c in ret if c]), "check_compliance": combined([c for c in com if c]),
           "recurrent_fraction": spread([s["recurrent_fraction"] for s in swaps]),
           "cache_fraction": spread([s["cache_fraction"] for s in swaps]),
           "answer_accuracy": spread([s["answer_accuracy"] for s in swaps]),
           "has_states": bool(swaps and swaps[0]["recurrent_layers"]),
           "has_caches": bool(swaps and swaps[0]["cache_layers"]), "left_out": subs.left_out(name)}
    for where in ("cache_only", "state_only"):
        for w in ("retrieval", "compliance"):
            out[f"{where}_{w}"] = spread([k[where][w] for k in keeps])
    for w in ("content_from_cache", "content_from_state", "language_from_cache", "language_from_state"):
        out[f"paired_{w}"] = spread([k["paired"][w] for k in keeps])
    return out


def _mean(s: dict | None) -> float | None:
    return None if s is None else s["mean"]


def _summary(name: str, p: dict[str, Any]) -> str:
    said = []
    r, c = p["recurrent_fraction"], p["cache_fraction"]
    if r is not None and c is not None:
        where = "the recurrent states" if r["mean"] > c["mean"] else "the attention caches"
        said.append(f"In {name} at {p['entries']} entries the recurrent states moved {r['mean']:.0%} of the answer's "
                    f"shift and the caches {c['mean']:.0%} (mean of {c['seeds']} seeds): the stored value went "
                    f"through {where}.")
    else:
        said.append(f"The state swap measured nothing in {name} ({p['check_swap']['reason']}).")
    so, co = p["state_only_compliance"], p["cache_only_compliance"]
    if so is not None and co is not None:
        lang = "its states" if so["mean"] > co["mean"] else "its caches"
        said.append(f"The requested language survived best with {lang} alone ({so['mean']:.0%} with the states, "
                    f"{co['mean']:.0%} with the caches).")
    return " ".join(said)


def probe_rows(p: dict[str, Any]) -> list[list]:
    sw, rt, cm = p["check_swap"], p["check_retrieval"], p["check_compliance"]

    def c(key: str, check: dict) -> str:
        if key == "recurrent_fraction" and not p["has_states"]:
            return "none: no recurrent layers"
        if key == "cache_fraction" and not p["has_caches"]:
            return "none: no attention caches"
        return show(p[key], check["verdict"]) if check["valid"] else check["verdict"]

    gone = "; ".join(f"seed {x['seed']} ({x['verdict']})" for x in p["left_out"]) or "none"
    return [
        ["seeds left out (did not learn by their recipe's bar)", gone, ""],
        ["checks that failed", "; ".join(x["reason"] for x in (sw, rt, cm) if not x["valid"] or "seed" in x["reason"])
         or "none", ""],
        ["clean prompts answered right", show(p["answer_accuracy"]), ""],
        ["state swap: shift moved by the recurrent states", c("recurrent_fraction", sw), "0.2 to 3.6 %"],
        ["state swap: shift moved by the attention caches", c("cache_fraction", sw), "96 to 100 %"],
        ["keep the cache only: retrieval", c("cache_only_retrieval", rt), "89 %"],
        ["keep the state only: retrieval", c("state_only_retrieval", rt), "never (0 %)"],
        ["keep the state only: language compliance", c("state_only_compliance", cm), "70 %"],
        ["keep the cache only: language compliance", c("cache_only_compliance", cm), "1 %"],
        ["paired (cache of prompt 1, state of prompt 2): content from the cache", c("paired_content_from_cache", rt),
         "content from the first"],
        ["paired: language from the state", c("paired_language_from_state", cm), "language from the second"],
    ]


def _claims(p: dict[str, Any], how: str, section: str = S) -> list[Claim]:
    sw, rt, cm = p["check_swap"], p["check_retrieval"], p["check_compliance"]
    S = section  # noqa: N806 (each hybrid's claims under its own name)
    return [checked_claim(S, "exact recall runs through the attention caches (state swap moves 96-100 %)", 0.98,
                          _mean(p["cache_fraction"]), sw, within=(0.96, 1.0), reason=how),
            checked_claim(S, "the recurrent states carry almost none of it (0.2-3.6 %)", 0.019,
                          _mean(p["recurrent_fraction"]), sw, within=(0.002, 0.036), reason=how),
            checked_claim(S, "with the caches alone the value is retrieved (89 %)", 0.89,
                          _mean(p["cache_only_retrieval"]), rt, reason=how),
            checked_claim(S, "with the state alone the value is never retrieved (0 %)", 0.0,
                          _mean(p["state_only_retrieval"]), rt, within=(0.0, 0.05), reason=how),
            checked_claim(S, "the recurrent state carries the answer's language (70 % compliance with the state alone)",
                          0.70, _mean(p["state_only_compliance"]), cm, reason=how)]


def trained_section(ctx: Context) -> SectionResult:
    from storelab.subjects import SIZES

    subs = subjects_of(ctx)
    rows, subjects = subject_rows(subs)
    examples = 32 if ctx.quick else 128
    probes = {name: probe_hybrid(subs, name, examples=examples) for name in (*HYBRIDS, *CONTROLS)}
    def how(name: str) -> str:
        return (f"the subject {name} trained here ({subjects[name]['about']}, d = 8), probed at {PROBE_N} entries, "
                "mean over the seeds whose check passed; the essay's figures are Qwen3.5-4B's (Gated DeltaNet), "
                "Kimi Linear (KDA) showed the same division")

    tables = [Table("The subjects (held-out retrieval by entries a prompt, mean over the seeds that learned; "
                    "compliance: the lowest over sizes and those seeds)",
                    ["subject", "layers", "parameters", "trained on (entries)", "learned", "steps", "seconds",
                     *[f"n={k}" for k in SIZES], "compliance"], rows)]
    for name in (*HYBRIDS, *CONTROLS):
        tables.append(Table(f"{name}: probes at {PROBE_N} entries (mean [lowest, highest] over the seeds whose "
                            "check passed), beside the essay's large-model figures",
                            ["probe", "ours", "essay (Qwen3.5-4B)"], probe_rows(probes[name])))
    source = "shipped" if ctx.subjects is None else f"retrained into {ctx.subjects}"
    return SectionResult(
        text=(f"Small models trained by storelab's own trainer until they do the dictionary-and-language task "
              f"(subjects {source}; `storelab subjects` lists them with their recipes): two 3:1 hybrids, "
              "KDA:attention and Gated DeltaNet:attention, and two controls, attention only and KDA only, each "
              "with recurrent heads of d = 8, three or four seeds each, of which the seeds that learned are probed. "
              f"Each is probed at {PROBE_N} entries, twice what a "
              "recurrent head's state holds: patch all recurrent states or all attention caches from a run whose "
              "prompt differs in one stored value (Lee et al.), and keep one store while discarding the other "
              "(Afendulev et al.). A figure counts only from seeds whose check passed (the model answers above "
              "chance, the swap moves the answer). " + " ".join(_summary(n, probes[n]) for n in HYBRIDS)),
        tables=tables,
        claims=[c for name in HYBRIDS for c in _claims(probes[name], how(name), f"trained {name}")],
        data={"subjects": subjects, "probes": probes, "entries": PROBE_N, "source": source})
