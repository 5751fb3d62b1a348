"""Write the report as one self-contained HTML page, plus Markdown and JSON.

Figures are PNG files beside the page and also embedded as data URIs, so the page
needs no network and no other file to display.
"""

from __future__ import annotations

import base64
import html
import json
import math
from pathlib import Path
from typing import Any

from storelab.console import clean
from storelab.outputs import atomic_write
from storelab.report.core import NOT_MEASURED, STATUSES, Claim, SectionOutcome, Table

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222}
h1{font-size:1.8em} h2{border-bottom:1px solid #ccc;padding-bottom:.2em;margin-top:2em}
table{border-collapse:collapse;margin:1em 0;font-size:.85em} th,td{border:1px solid #ccc;padding:.25em .5em;vertical-align:top}
th{background:#f3f3f3} td.num{text-align:right;font-variant-numeric:tabular-nums}
.failed{background:#fee;border:1px solid #c00;padding:.5em} pre{white-space:pre-wrap;font-size:.8em}
.reproduced{color:#060} .differs{color:#a60} .not-checkable{color:#666}
.not-measured{color:#666;font-style:italic} img{max-width:100%;border:1px solid #eee}
nav a{margin-right:1em}
"""


# Marks the page once loaded with the number of images that failed to decode, so a
# headless browser test can read it from the DOM (tests/test_report.py).
CHECK_SCRIPT = ("<script>window.addEventListener('load',function(){var bad=0;"
                "for(var i of document.images){if(!(i.complete&&i.naturalWidth>0))bad++;}"
                "document.body.setAttribute('data-broken-images',String(bad));});</script>")


def fmt(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        if math.isnan(v) or math.isinf(v):
            return str(v)
        if v == 0:
            return "0"
        if abs(v) >= 1e5 or abs(v) < 1e-3:
            return f"{v:.4g}"
        return f"{v:,.4f}".rstrip("0").rstrip(".")
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _table_html(t: Table) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in t.columns)
    body = []
    for r in t.rows:
        cells = []
        for v in r:
            cls = ' class="num"' if isinstance(v, (int, float)) and not isinstance(v, bool) else ""
            if isinstance(v, str) and v in STATUSES:
                cls = f' class="{v.replace(" ", "-")}"'
            cells.append(f"<td{cls}>{html.escape(fmt(v))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<h3>{html.escape(t.title)}</h3><table><tr>{head}</tr>{''.join(body)}</table>"


def _table_md(t: Table) -> str:
    lines = [f"**{t.title}**", "", "| " + " | ".join(t.columns) + " |", "|" + "---|" * len(t.columns)]
    for r in t.rows:
        lines.append("| " + " | ".join(fmt(v).replace("|", "\\|") for v in r) + " |")
    return "\n".join(lines) + "\n"


def ledger_table(claims: list[Claim]) -> Table:
    return Table("Claim ledger", ["section", "claim", "essay", "measured", "ratio", "status", "reason"],
                 [[c.section, c.claim, c.essay, c.measured, c.ratio, c.status, c.reason] for c in claims])


def write(out: Path, outcomes: list[SectionOutcome], claims: list[Claim], meta: dict[str, Any]) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    parts_html = [f"<h1>storelab report</h1><p>{html.escape(meta.get('subtitle', ''))}</p>"]
    parts_html.append("<nav>" + "".join(f'<a href="#{oc.section.key}">{html.escape(oc.section.title)}</a>' for oc in outcomes) + '<a href="#ledger">Claim ledger</a></nav>')
    parts_md = ["# storelab report", "", meta.get("subtitle", ""), ""]
    for oc in outcomes:
        s = oc.section
        parts_html.append(f'<h2 id="{s.key}">{html.escape(s.title)}</h2>')
        parts_md.append(f"## {s.title}\n")
        if not oc.ok:
            parts_html.append(f'<div class="failed"><b>This section failed</b> after {oc.seconds:.1f} s:<pre>{html.escape(oc.error)}</pre></div>')
            parts_md.append(f"**This section failed:**\n\n```\n{oc.error}\n```\n")
            continue
        r = oc.result
        if r.text:
            parts_html.append("".join(f"<p>{html.escape(p)}</p>" for p in r.text.split("\n\n")))
            parts_md.append(r.text + "\n")
        for t in r.tables:
            parts_html.append(_table_html(t))
            parts_md.append(_table_md(t))
        for f in r.figures:
            f = Path(f)
            data = base64.b64encode(f.read_bytes()).decode()
            parts_html.append(f'<p><img alt="{html.escape(f.name)}" src="data:image/png;base64,{data}"></p>')
            parts_md.append(f"![{f.name}]({f.name})\n")
        parts_html.append(f"<p><small>{oc.seconds:.1f} s</small></p>")
    lt = ledger_table(claims)
    counts = {}
    for c in claims:
        counts[c.status] = counts.get(c.status, 0) + 1
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()))
    if counts.get(NOT_MEASURED):
        summary += (f". {counts[NOT_MEASURED]} trained-model claims are not measured: the model probed did not learn "
                    "its task, or the swap moved nothing, so no fraction was taken (each row says which)")
    parts_html.append(f'<h2 id="ledger">Claim ledger</h2><p>{html.escape(summary)}</p>' + _table_html(lt))
    parts_md.append(f"## Claim ledger\n\n{summary}\n\n" + _table_md(lt))
    page = (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>storelab report</title>"
            f"<style>{CSS}</style></head><body>{''.join(parts_html)}{CHECK_SCRIPT}</body></html>")
    paths = {"html": out / "report.html", "md": out / "report.md", "json": out / "report.json"}
    atomic_write(paths["html"], page)
    atomic_write(paths["md"], "\n".join(parts_md))
    doc = {"meta": meta,
           "sections": [{"key": oc.section.key, "title": oc.section.title, "ok": oc.ok, "seconds": oc.seconds,
                         "error": oc.error or None,
                         "tables": [t.__dict__ for t in (oc.result.tables if oc.ok else [])],
                         "figures": [Path(f).name for f in (oc.result.figures if oc.ok else [])],
                         "data": oc.result.data if oc.ok else None} for oc in outcomes],
           "ledger": [c.as_dict() for c in claims]}
    atomic_write(paths["json"], json.dumps(clean(doc), indent=1))
    return paths
