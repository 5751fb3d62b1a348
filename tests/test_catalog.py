"""``storelab families``: the catalog is the registries (every family, every GGUF architecture), and the committed
docs/families.md is its Markdown exactly."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from storelab.checkpoint.catalog import catalog, gguf_only, markdown
from storelab.checkpoint.families import FAMILIES
from storelab.checkpoint.gguf import GGUF_ARCHS
from storelab.cli import app
from storelab.stores.base import REGISTRY

DOC = Path(__file__).resolve().parent.parent / "docs" / "families.md"


def test_every_family_and_architecture_is_listed():
    rows = catalog()
    assert [r.family for r in rows] == [f.name for f in FAMILIES]
    listed = {a for r in rows for a in r.gguf} | {a for a, _ in gguf_only()}
    assert listed == set(GGUF_ARCHS)
    for r in rows:
        assert r.title and r.model_types and r.oracle
        assert r.stores == ("any",) or set(r.stores) <= set(REGISTRY), f"{r.family}: {r.stores}"
        assert r.runs == (not r.refused)
    assert {r.family for r in rows if not r.runs} == {"minimax", "unread"}


def test_docs_page_is_generated():
    assert DOC.read_text() == markdown(), "docs/families.md differs: storelab families --markdown > docs/families.md"


def test_cli():
    res = CliRunner().invoke(app, ["families", "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert len(doc["families"]) == len(FAMILIES) and doc["families"][0]["family"] == "storelab"
    res = CliRunner().invoke(app, ["families"])
    assert res.exit_code == 0 and "llama" in res.output
    res = CliRunner().invoke(app, ["families", "--json", "--markdown"])
    assert res.exit_code == 2 and "--markdown" in res.output
