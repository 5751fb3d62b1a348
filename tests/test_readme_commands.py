"""Every command the README shows runs today and prints what the README says it prints (issue 40).

The README (and the hand-written pages of docs/ listed in ``PAGES``) show commands as fenced blocks whose
first line is ``$ storelab ...``, followed by the command's real output, trimmed where a line is ``...``.
Each block runs here through the typer app (``CliRunner``), with the names a user writes mapped to files
this machine has:

* a real subject's GGUF file name (``gemma-3-270m-q4_k_m.gguf``) -> its installed file
  (``storelab.subjects.real``; the test skips when the ``real`` extra is not installed);
* ``Qwen/Qwen3-0.6B`` -> a Hugging Face cache built under tmp_path in the published layout, holding the
  published config.json (``tests/fixtures/configs/Qwen3-0.6B.json``), as ``hf download`` leaves it;
* ``my.toml`` -> the README's own TOML block, written to tmp_path.

Every line shown must appear in today's output (whitespace collapsed; a table row cell by cell), so every
figure the README prints (a total in MiB, bytes per token, parameters) is what the command prints now.
The report is not run here (tests/test_report.py builds it): its block is checked for the path it names.
A probe is slow on 2 cores: its block runs with ``STORELAB_SLOW_TESTS=1``.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from storelab.cli import TOUR, app
from storelab.console import console

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
PAGES = [README, ROOT / "docs" / "engines.md"]
CONFIGS = Path(__file__).parent / "fixtures" / "configs"
BOX = "│┃┏┓┗┛┡┩┢┪└┘┌┐━─┳┻╇╈┼┬┴├┤╋"
WIDTH = 88      # the terminal width the README's tables were printed at
SLOW = {"probe"}                 # run with STORELAB_SLOW_TESTS=1
NOT_RUN = {"report"}             # tested elsewhere; the block names the file written


def command_blocks(page: Path) -> list[tuple[str, list[str]]]:
    """(the command after '$ ', the output lines shown) for each ```-block of ``page`` that starts '$ storelab'."""
    found = []
    for m in re.finditer(r"```\n(\$ storelab [^\n]*)\n(.*?)```", page.read_text(), re.S):
        found.append((m.group(1)[2:], m.group(2).rstrip("\n").split("\n")))
    return found


def readme_toml() -> str:
    text = README.read_text()
    a = text.index("```toml") + len("```toml\n")
    return text[a:text.index("```", a)]


def _norm(s: str) -> str:
    return " ".join(s.split())


def _cells(line: str) -> tuple[str, ...]:
    return tuple(_norm(c) for c in re.split(f"[{BOX}]", line)[1:-1])


def shown_in(shown: list[str], out: str) -> list[str]:
    """The shown lines that today's output lacks: a text line as a part of the output (whitespace collapsed,
    so a line the terminal wrapped still counts), a table row as a row of the same cells."""
    text = _norm(out)
    rows = {_cells(line) for line in out.splitlines() if re.search(f"[{BOX}]", line)}
    missing = []
    for line in shown:
        if line.strip() in ("", "...") or not line.strip(f" {BOX}"):
            continue
        if re.search(f"[{BOX}]", line):
            if _cells(line) not in rows:
                missing.append(line)
        elif _norm(line) not in text:
            missing.append(line)
    return missing


@pytest.fixture
def machine(tmp_path, monkeypatch):
    """Names as a user writes them -> this machine's files; the console at the README's width."""
    cache = tmp_path / "hub"
    snap = cache / "models--Qwen--Qwen3-0.6B" / "snapshots" / ("0" * 40)
    snap.mkdir(parents=True)
    (snap / "config.json").write_text((CONFIGS / "Qwen3-0.6B.json").read_text())
    (cache / "models--Qwen--Qwen3-0.6B" / "refs").mkdir()
    (cache / "models--Qwen--Qwen3-0.6B" / "refs" / "main").write_text("0" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "my.toml").write_text(readme_toml())
    monkeypatch.chdir(tmp_path)
    width = console._width
    console.width = WIDTH
    yield tmp_path
    console._width = width


def real_file(name: str) -> str:
    from storelab.subjects.real import REAL, SubjectError

    for s in REAL:
        if s.file_name == name:
            try:
                return str(s.path())
            except SubjectError as e:
                pytest.skip(str(e))
    raise AssertionError(f"{name}: not a real subject's file (storelab.subjects.real.REAL)")


BLOCKS = [(page.name, cmd, shown) for page in PAGES for cmd, shown in command_blocks(page)]


def test_readme_shows_commands():
    names = [shlex.split(cmd)[1] for page, cmd, _ in BLOCKS if page == "README.md"]
    for needed in ("memory", "models", "probe", "report"):
        assert needed in names, f"the README shows no 'storelab {needed}' command with its output"


@pytest.mark.parametrize("page,cmd,shown", BLOCKS, ids=[f"{p}: {c}" for p, c, _ in BLOCKS])
def test_command_prints_what_the_page_shows(page, cmd, shown, machine):
    args = shlex.split(cmd)[1:]
    if args[0] in NOT_RUN:
        from storelab.report.build import FILES

        out = args[args.index("--out") + 1]
        assert "report.html" in FILES and any(line.endswith(f"/{out}/report.html") for line in shown)
        return
    if args[0] in SLOW and not os.environ.get("STORELAB_SLOW_TESTS"):
        pytest.skip(f"storelab {args[0]} takes minutes on 2 cores: STORELAB_SLOW_TESTS=1 runs it")
    args = [real_file(a) if a.endswith(".gguf") else a for a in args]
    r = CliRunner().invoke(app, args)
    assert r.exit_code == 0, r.output
    missing = shown_in(shown, r.output)
    assert not missing, f"{page}: `{cmd}` no longer prints:\n" + "\n".join(missing) + "\n--- it prints:\n" + r.output


def test_storelab_alone_prints_the_tour():
    r = CliRunner().invoke(app, [])
    assert r.exit_code == 0, r.output
    assert r.output.index("Start here:") < r.output.index("Commands:")
    for cmd, what in TOUR:
        assert cmd in r.output and what in r.output
    import typer

    for name, c in typer.main.get_command(app).commands.items():
        assert (f"\n  {name} " in r.output) != c.hidden, name
    assert "Usage:" not in r.output


def test_help_is_still_the_help():
    r = CliRunner().invoke(app, ["--help"])
    assert r.exit_code == 0 and "Usage:" in r.output and "Start here:" not in r.output


def test_tour_commands_are_the_readmes():
    """The tour's five commands are the five the README's sections run (by command and first argument kind)."""
    text = README.read_text()
    for cmd, _ in TOUR:
        verb = cmd.split()[1]
        assert f"$ storelab {verb} " in text, f"the tour's {cmd!r} has no README example"


def test_readme_picture_is_gemma():
    """The README's picture of Gemma 3 270M's stores is the one its GGUF file gives, layer by layer."""
    from storelab.checkpoint.source import model_config, resolve

    cfg = model_config(resolve(real_file("gemma-3-270m-q4_k_m.gguf")))
    text = README.read_text()
    a = text.index("```\nlayer ") + 4
    picture = text[a:text.index("```", a)]
    rows = {line.split()[0]: line.split()[1:cfg.n_layers + 1] for line in picture.splitlines() if line.strip()}
    assert rows["layer"] == [str(i) for i in range(cfg.n_layers)]
    letters = {"window": "w", "attention": "A", "ffn": "F"}
    assert rows["token"] == [letters[type(layer.token).KIND] for layer in cfg.layers]
    assert rows["channel"] == [letters[type(layer.channel).KIND] for layer in cfg.layers]
    assert {type(layer.depth).KIND for layer in cfg.layers} == {"residual"}
    windows = {layer.token.window for layer in cfg.layers if type(layer.token).KIND == "window"}
    assert windows == {511} and "the last 511 tokens" in text


def _first_column(page: str, header: str) -> list[str]:
    """The first cells (backticks dropped) of the table in docs/``page`` whose header row starts ``| header |``."""
    lines = (ROOT / "docs" / page).read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {header} |"))
    cells = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        cells.append(line.split("|")[1].strip().strip("`"))
    return cells


def test_docs_tables_name_what_the_code_has():
    """The few tables docs/ keeps by hand list exactly what the code registers (no row added or lost)."""
    from storelab.probes import PROBES
    from storelab.subjects import RECIPES
    from storelab.subjects.real import REAL

    assert _first_column("probes.md", "probe") == [*PROBES, "all"]
    assert _first_column("subjects.md", "subject") == list(RECIPES)
    text = (ROOT / "docs" / "subjects.md").read_text()
    for name, r in RECIPES.items():   # the layers column spells the recipe's pattern
        assert f"| `{name}` | {' '.join(r.pattern)}" in text, name
    rows = text[text.index("## Real subjects"):]
    assert [line.split("|")[1].strip().strip("`") for line in rows.splitlines()
            if line.startswith("| `")] == [s.name for s in REAL]
