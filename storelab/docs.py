"""The reference pages of ``docs/`` that the code also knows, generated so they cannot drift.

    python -m storelab.docs [FOLDER]     # writes FOLDER/cli.md, stores.md, families.md (default docs/)

* ``cli.md``: every command of the ``storelab`` app, its arguments and options with their defaults and help,
  read from the typer app itself (``storelab --help`` and ``storelab COMMAND --help`` say the same);
* ``stores.md``: every store's card (``storelab stores``), the essay's five questions and the source;
* ``families.md``: what is read and what runs (``storelab families --markdown``).

``tests/test_docs.py`` regenerates each page and fails when the committed copy differs. The pages written by
hand (engines, probes, subjects, checkpoints, commands, distributed training, contributing, bench) sit
beside them; tests/test_readme_commands.py runs the commands they show.
"""

from __future__ import annotations

import sys
from pathlib import Path

from typer.core import TyperArgument, TyperGroup, TyperOption

__all__ = ["PAGES", "cli_page", "stores_page", "write_pages"]


def _opt_line(p: TyperArgument | TyperOption) -> str:
    if isinstance(p, TyperArgument):
        names = f"`{p.name.upper()}`" + ("" if p.required else " (optional)")
        names += " ..." if p.nargs == -1 else ""
    else:
        names = " / ".join(f"`{o}`" for o in [*p.opts, *p.secondary_opts])
    default = p.default
    shown = "" if default in (None, False, (), []) or callable(default) else f" (default: `{default}`)"
    help_ = " ".join((p.help or "").split())
    return f"- {names}{shown}: {help_}".rstrip(": ")


def _command(name: str, cmd, level: str = "##") -> list[str]:
    out = [f"{level} `storelab {name}`", ""]
    doc = " ".join((cmd.help or "").split("\n\n")[0].split())
    if doc:
        out += [doc, ""]
    params = [p for p in cmd.params if not p.hidden and p.name != "help"]
    out += [_opt_line(p) for p in params]
    if params:
        out.append("")
    if isinstance(cmd, TyperGroup):
        for sub_name, sub in sorted(cmd.commands.items()):
            out += _command(f"{name} {sub_name}", sub, level + "#")
    return out


def cli_page() -> str:
    """Every command's arguments and options, from the typer app."""
    import typer

    from storelab.cli import app

    group = typer.main.get_command(app)
    out = ["# The command line", "",
           "Generated from the typer app by `python -m storelab.docs`; `tests/test_docs.py` fails when this copy "
           "differs.", "Every command takes `--json` (one JSON document on stdout, nothing else); a bad input ends "
           "with `error: ...` naming the option, field or file, and exit code 2.", ""]
    for name, cmd in sorted(group.commands.items()):
        if not cmd.hidden:
            out += _command(name, cmd)
    return "\n".join(out).rstrip() + "\n"


def stores_page() -> str:
    """Every store's card."""
    from storelab.stores import store_cards

    out = ["# The stores", "",
           "Generated from the store cards (`storelab stores`) by `python -m storelab.docs`. The kind is what a model "
           "file's `[stores.<name>]` table names (`kind = \"kda\"`).", ""]
    for c in store_cards():
        out += [f"## `{c['kind']}`: {c['name']}", "",
                f"- **written by**: {c['written_by']}", f"- **holds**: {c['holds']}",
                f"- **reading costs**: {c['reading_costs']}", f"- **forgets**: {c['forgets']}",
                f"- **source**: {c['source']}", ""]
    return "\n".join(out).rstrip() + "\n"


def _families() -> str:
    from storelab.checkpoint.catalog import markdown

    return markdown()


PAGES = {"cli.md": cli_page, "stores.md": stores_page, "families.md": _families}


def write_pages(folder: Path) -> list[Path]:
    """Each page written to a temporary name and renamed into place."""
    import os

    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for name, make in PAGES.items():
        tmp = folder / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(make())
        os.replace(tmp, folder / name)
        out.append(folder / name)
    return out


if __name__ == "__main__":
    for p in write_pages(Path(sys.argv[1] if len(sys.argv) > 1 else "docs")):
        print(f"wrote {p}")
