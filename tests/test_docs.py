"""The generated pages of docs/ equal what the code generates now (``python -m storelab.docs``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from storelab.docs import PAGES, write_pages

DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.mark.parametrize("name", list(PAGES))
def test_generated_page_is_current(name):
    assert (DOCS / name).read_text() == PAGES[name](), \
        f"docs/{name} differs from the code: regenerate it with python -m storelab.docs"


def test_write_pages(tmp_path):
    written = write_pages(tmp_path / "d")
    assert sorted(p.name for p in written) == sorted(PAGES)
    assert not list((tmp_path / "d").glob(".*.tmp"))


def test_cli_page_lists_every_command():
    import typer

    from storelab.cli import app

    page = PAGES["cli.md"]()
    for name, cmd in typer.main.get_command(app).commands.items():
        assert (f"`storelab {name}`" in page) != cmd.hidden
