"""The figures of a probe's result as table rows: (figure, ours, the essay's large-model figure).

``probe_rows(name, result)`` serves ``storelab probe`` and the report's checkpoint section alike;
``sweep_rows`` lays out the selection sweep (recall and mass missed per layer, short to long).
"""

from __future__ import annotations

__all__ = ["probe_rows", "sweep_rows"]


def sweep_rows(r: dict) -> list[list]:
    """Per selecting layer and top-k multiplier: recall and mass missed at each context (short to long)."""
    rows = [["contexts (last %d queries each)" % r["queries"], " / ".join(map(str, r["contexts"])), ""]]
    for x in r["layers"]:
        shares = "" if x["own_indexer"] else f", shares layer {x['owner']}"
        name = f"layer {x['layer']} ({x['kind']}{shares})"
        for m in r["topk"]:
            pts = [p for p in x["points"] if p["topk_multiplier"] == m]
            fmt = lambda k: " / ".join("-" if p[k] is None else f"{p[k]:.3f}" for p in pts)  # noqa: E731
            rows += [[f"{name} recall, top {m * x['k']}", fmt("recall"), "-"],
                     [f"{name} mass missed, top {m * x['k']}", fmt("mass_missed"), "-"]]
    return rows


def probe_rows(name: str, r: dict) -> list[list]:
    """(figure, ours, essay) rows for one probe's result."""
    e = r.get("essay", {})
    if r.get("probe") == "selection_sweep":
        return sweep_rows(r)
    if name == "state_swap":
        lo_r, hi_r = e["recurrent_fraction"]
        lo_c, hi_c = e["cache_fraction"]
        return [["answer accuracy (prompt A)", r["answer_accuracy"], ""],
                ["shift moved by all recurrent states", r["recurrent_fraction"], f"{lo_r:.1%} to {hi_r:.1%}"],
                ["shift moved by all attention caches", r["cache_fraction"], f"{lo_c:.0%} to {hi_c:.0%}"],
                ["answers flipped by the states", r["answers_flipped"]["recurrent"], ""],
                ["answers flipped by the caches", r["answers_flipped"]["cache"], ""]] + [
                [f"layer {x['layer']} ({x['kind']}) alone", x["fraction"], ""] for x in r.get("per_layer", [])]
    if name == "keep_one":
        p = r["paired"]
        return [["retrieval, both stores", r["full"]["retrieval"], ""],
                ["retrieval, cache only", r["cache_only"]["retrieval"], e["retrieval"]["cache_only"]],
                ["retrieval, state only", r["state_only"]["retrieval"], e["retrieval"]["state_only"]],
                ["compliance, both stores", r["full"]["compliance"], ""],
                ["compliance, cache only", r["cache_only"]["compliance"], e["compliance"]["cache_only"]],
                ["compliance, state only", r["state_only"]["compliance"], e["compliance"]["state_only"]],
                ["paired: content from the cache's prompt", p["content_from_cache"], "most"],
                ["paired: content from the state's prompt", p["content_from_state"], ""],
                ["paired: language from the cache's prompt", p["language_from_cache"], ""],
                ["paired: language from the state's prompt", p["language_from_state"], "most"]] + [
                [f"persona, {c.replace('_', ' ')}", v, e["persona"].get(c, "")]
                for c, v in r.get("persona", {}).items()]
    if name == "forgetting":
        return [["median half-life (tokens)", r["median_half_life"], e["median_half_life_tokens"]],
                ["ranking stability (mean Spearman)", r["ranking_stability"], e["ranking"]],
                ["KDA heads mixing fast and slow channels", r["kda_mixing_fraction"], e["kda_mixing_fraction"]]]
    if name == "mhc":
        ess = {"identity_first_half": e["identity_first_half"], "identity_second_half": e["identity_second_half"],
               "average_first_half": e["average"], "average_second_half": e["average"]}
        base = [["perplexity, as trained", r["base_perplexity"], ""]] if "base_perplexity" in r else []
        return base + [[f"perplexity change, {k.replace('_', ' ')}", v["perplexity_change"], ess.get(k, "")]
                       for k, v in r["conditions"].items()]
    if name == "selection":
        rows = [["miss rate (top-budget entries not selected)", r["miss_rate"], "-"],
                ["top-1 entry missed", r["top1_miss"], "-"],
                ["attention mass missed", r["mass_missed"], "-"],
                ["selects the first block", r["first_block_rate"], "learned (sink)"]]
        for x in r["layers"]:  # ours in the ours column; the essay gives no per-layer figure
            rows += [[f"layer {x['layer']} ({x['kind']}) miss rate", x.get("miss_rate"), "-"],
                     [f"layer {x['layer']} ({x['kind']}) selects the first block", x.get("first_block_rate"), "-"]]
        return rows
    return []
