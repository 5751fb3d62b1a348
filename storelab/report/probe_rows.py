"""The figures of a probe's result as table rows: (figure, ours, the essay's large-model figure).

``probe_rows(name, result)`` serves ``storelab probe`` and the report's checkpoint section alike;
``sweep_rows`` lays out the selection sweep (recall and mass missed per layer, short to long).

A probe's check (``storelab.probes.validity``) comes first: its verdict with the figures that decide
it (accuracy, chance); where it failed, each fraction's cell says "not learned" or "no effect to
divide" (``cell``) instead of a number.
"""

from __future__ import annotations

__all__ = ["probe_rows", "sweep_rows", "cell", "check_rows"]


def cell(value, check: dict | None):
    """The figure, or the verdict of the failed ``check`` (a ``Validity`` as a dict) in its place."""
    if check is not None and not check["valid"]:
        return check["verdict"]
    return value


def check_rows(r: dict) -> list[list]:
    """The check's rows: its verdict and reason, per part for keep_one; none for a result without one."""
    if "validity" not in r:
        return []
    parts = r.get("checks") or {"": r["validity"]}
    return [[f"check{': ' + k if k else ''}", v["verdict"] if v["valid"] else v["reason"], ""]
            for k, v in parts.items()]


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
    v = r.get("validity")
    if name == "state_swap":
        lo_r, hi_r = e["recurrent_fraction"]
        lo_c, hi_c = e["cache_fraction"]
        chance = [["chance (a uniform guess)", r["chance"], ""]] if "chance" in r else []
        return check_rows(r) + [["answer accuracy (prompt A)", r["answer_accuracy"], ""]] + chance + [
                ["shift moved by all recurrent states", cell(r["recurrent_fraction"], v), f"{lo_r:.1%} to {hi_r:.1%}"],
                ["shift moved by all attention caches", cell(r["cache_fraction"], v), f"{lo_c:.0%} to {hi_c:.0%}"],
                ["answers flipped by the states", cell(r["answers_flipped"]["recurrent"], v), ""],
                ["answers flipped by the caches", cell(r["answers_flipped"]["cache"], v), ""]] + [
                [f"layer {x['layer']} ({x['kind']}) alone", cell(x["fraction"], v), ""] for x in r.get("per_layer", [])]
    if name == "keep_one":
        p, chk = r["paired"], r.get("checks", {})
        ret, com = chk.get("retrieval"), chk.get("compliance")
        chance = r.get("chance") or {}
        return check_rows(r) + [
                ["retrieval, both stores", r["full"]["retrieval"], ""],
                ["retrieval, chance", chance.get("retrieval"), ""],
                ["retrieval, cache only", cell(r["cache_only"]["retrieval"], ret), e["retrieval"]["cache_only"]],
                ["retrieval, state only", cell(r["state_only"]["retrieval"], ret), e["retrieval"]["state_only"]],
                ["compliance, both stores", r["full"]["compliance"], ""],
                ["compliance, chance", chance.get("compliance"), ""],
                ["compliance, cache only", cell(r["cache_only"]["compliance"], com), e["compliance"]["cache_only"]],
                ["compliance, state only", cell(r["state_only"]["compliance"], com), e["compliance"]["state_only"]],
                ["paired: content from the cache's prompt", cell(p["content_from_cache"], ret), "most"],
                ["paired: content from the state's prompt", cell(p["content_from_state"], ret), ""],
                ["paired: language from the cache's prompt", cell(p["language_from_cache"], com), ""],
                ["paired: language from the state's prompt", cell(p["language_from_state"], com), "most"]] + [
                [f"persona, {c.replace('_', ' ')}", x if c == "full" else cell(x, chk.get("persona")),
                 e["persona"].get(c, "")] for c, x in r.get("persona", {}).items()]
    learned_rows = [["next-token accuracy", r["accuracy"], ""], ["chance (a uniform guess)", r["chance"], ""]] \
        if "accuracy" in r else []
    if name == "forgetting":
        return check_rows(r) + learned_rows + [
                ["median half-life (tokens)", cell(r["median_half_life"], v), e["median_half_life_tokens"]],
                ["ranking stability (mean Spearman)", cell(r["ranking_stability"], v), e["ranking"]],
                ["KDA heads mixing fast and slow channels",
                 cell(r["kda_mixing_fraction"], v) if r.get("kda_heads") else None, e["kda_mixing_fraction"]]]
    if name == "mhc":
        ess = {"identity_first_half": e["identity_first_half"], "identity_second_half": e["identity_second_half"],
               "average_first_half": e["average"], "average_second_half": e["average"]}
        base = [["perplexity, no condition applied", r["base_perplexity"], ""]] if "base_perplexity" in r else []
        return check_rows(r) + learned_rows + base + [
            [f"perplexity change, {k.replace('_', ' ')}", cell(c["perplexity_change"], v), ess.get(k, "")]
            for k, c in r["conditions"].items()]
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
