"""``storelab memory`` for people: one model's two terms, totals at L and what fits, in 80 columns.

Layer lists are summarised ("48 of 64: all but every 4th", "16 of 64: every 4th from 3"); no
number is ever split across lines (each is formatted whole, and every line is at most ``WIDTH``
characters); totals are given in GiB and MiB at L.
"""

from __future__ import annotations

from typing import Any

from storelab.models.memory_terms import GIB, MIB, human_bytes

WIDTH = 80
LAYERS = 32  # the layers column
_SHOWN = {"fp32": "f32", "fp16": "f16"}  # llama.cpp's names for the formats people type


def shown(fmt: str) -> str:
    return _SHOWN.get(fmt, fmt)


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def _runs(idx: list[int]) -> list[str]:
    out, start = [], idx[0]
    for a, b in zip(idx, idx[1:] + [None]):
        if b != a + 1:
            out.append(f"{start}" if start == a else f"{start}-{a}")
            start = b
    return out


def _fit(parts: list[str], width: int) -> str:
    text = ""
    for i, p in enumerate(parts):
        more = (", " if text else "") + p
        if len(text + more) > width or (i < len(parts) - 1 and len(text + more + ", ..") > width):
            return text + (", .." if text else "..")
        text += more
    return text


def _pattern(idx: list[int], n: int) -> str:
    """"every 4th" (layers 3, 7, ..: every 4th counting from 1), "every 2nd from 2", "all but every 4th",
    "all"; "" when ``idx`` (sorted, within range(n)) is none of these."""
    rest = [i for i in range(n) if i not in set(idx)]
    for ids, say in ((idx, "every"), (rest, "all but every")):
        step = ids[1] - ids[0] if len(ids) > 2 else 0
        if step > 1 and ids == list(range(ids[0], ids[-1] + 1, step)) and ids[-1] + step >= n:
            return f"{say} {_ordinal(step)}" + (f" from {ids[0]}" if ids[0] != step - 1 else "")
    return "all" if len(idx) == n else ""


def layers_text(idx: list[int], n_layers: int, width: int = 32) -> str:
    """Which of a model's layers, summarised to ``width`` characters: ``"16 of 64: every 4th"`` (layers
    3, 7, .., 63), ``"48 of 64: all but every 4th"``, ``"24 of 93: every 4th and the last"``,
    ``"3 of 40: 2, 8, 14"``."""
    idx = sorted(idx)
    head = f"{len(idx)} of {n_layers}: "
    body = _pattern(idx, n_layers)
    if not body and n_layers > 3 and idx[-1] == n_layers - 1:  # a pattern broken only by the last layer
        body = _pattern(idx[:-1], n_layers - 1)                   # (Kimi K3's layer 93)
        body = body and body + " and the last"
    if not body or len(head + body) > width:
        body = _fit(_runs(idx), width - len(head))
    return head + body


def per_token_text(v: float) -> str:
    return (f"{v:,.1f}".rstrip("0").rstrip(".") if v != int(v) else f"{int(v):,}") + " B"


def _groups(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        shared = r["cache_owner"] != r["layer"]
        key = (r["kind"], shared, r.get("part", ""), r.get("token_format", ""))
        g = groups.setdefault(key, {"kind": r["kind"], "shared": shared, "part": r.get("part", ""),
                                    "format": r.get("token_format", ""), "layers": [],
                                    "bytes_per_token": 0.0, "bytes_per_sequence": 0.0})
        g["layers"].append(r["layer"])
        g["bytes_per_token"] += r["bytes_per_token"]
        g["bytes_per_sequence"] += r["bytes_per_sequence"]
    return list(groups.values())


def _row(cells: list[str]) -> str:
    widths, align = (18, LAYERS, 4, 10, 12), "<<<>>"
    return " ".join(f"{c:{a}{w}}" for c, w, a in zip(cells, widths, align)).rstrip()


def gib_mib(n: float) -> str:
    return f"{human_bytes(n)} ({human_bytes(n, unit='MiB')})" if n >= GIB else human_bytes(n)


def model_text(cfg, rec: dict[str, Any]) -> list[str]:
    """The lines for one model (a ``storelab.report.memory_json`` record): its stores, the two terms at
    L (the fixed part as held at L), totals at L for the batch."""
    L, B, rows, tot = rec["context"], rec["batch"], rec["layers"], rec["total"]
    caches = "the publisher's formats" if rec["cache_format"] == "published" else shown(rec["cache_format"])
    out = [f"{cfg.title or cfg.name}: {cfg.n_layers} layers, L = {L:,} tokens, batch {B}",
           f"caches in {caches}, recurrent states in {shown(rec['state_format'])}", "",
           _row(["store", "layers", "fmt", "per token", "per sequence"])]
    shared = False
    for g in _groups(rows):
        label = (g["part"][:3] + " " if g["part"] else "") + g["kind"] + ("*" if g["shared"] else "")
        shared |= g["shared"]
        out.append(_row([label, layers_text(g["layers"], cfg.n_layers, LAYERS), shown(g["format"]),
                         per_token_text(g["bytes_per_token"]), human_bytes(g["bytes_per_sequence"])]))
    out.append(_row(["total", "", "", per_token_text(tot["bytes_per_token"]),
                     human_bytes(tot["bytes_per_sequence"])]))
    if shared:
        out.append("* reads another layer's cache: counted once, at that layer")
    if tot["cache_bytes_per_token"] != tot["bytes_per_token"]:
        out.append(f"of the per-token bytes, the global cache: {per_token_text(tot['cache_bytes_per_token'])}; "
                   f"index keys: {per_token_text(tot['bytes_per_token'] - tot['cache_bytes_per_token'])}")
    if tot["bytes_per_sequence"] < tot["bytes_per_sequence_full"]:
        out.append(f"per sequence: as held at L; at its fullest {human_bytes(tot['bytes_per_sequence_full'])}")
    grow, fixed = B * tot["bytes_per_token"] * L, B * tot["bytes_per_sequence"]
    out += ["", f"at L = {L:,} for {B} sequence{'s' if B > 1 else ''}:",
            f"  growing with L   {gib_mib(grow)}", f"  fixed            {gib_mib(fixed)}",
            f"  total            {gib_mib(tot['total_bytes'])}"]
    return out


def params_text(n: int) -> str:
    """A parameter count people read: "1.23B", "45.6M", "7,936" (never "0.00B")."""
    if n >= 1e9:
        return f"{n / 1e9:,.2f}B"
    return f"{n / 1e6:,.3g}M" if n >= 1e6 else f"{n:,}"


LONGEST_SHOWN = 2**31 - 1  # a model that states no context: longer fits are said in words, not as a count


def budget_text(cfg, b: dict[str, Any]) -> list[str]:
    """What fits in the budget (a ``budget_record``), per batch size."""
    fits, budget, weights = b["longest_context"], b["budget_bytes"], b["weights_bytes"]
    held = ", as stored" if b["weights_format"] in ("folder", "gguf") else \
        f" in {shown(b['weights_format'])}"
    out = ["", f"budget {human_bytes(budget)}, weights {human_bytes(weights)} "
               f"({params_text(b['stored_params'])} parameters{held}):",
           "  batch  longest context"]
    for f in fits:
        if not f["fits"] and weights > budget:
            out[-1] = "  the weights alone exceed it: no context fits"
            break
        if f["context"] is None:
            what = "any length (nothing grows with context)"
        elif not f["fits"]:
            out.append(f"  {f['batch']:>5}  does not fit")
            break
        elif f["context"] >= (cfg.context or LONGEST_SHOWN):  # a count past what is read says nothing
            what = (f"every context up to its {cfg.context:,} (room to spare)" if cfg.context else
                    f"every context up to {LONGEST_SHOWN:,} tokens and beyond")
        else:
            what = f"{f['context']:,} tokens"
        out.append(f"  {f['batch']:>5}  {what}")
    return out
