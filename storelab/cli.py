"""The ``storelab`` command line.

Every command takes ``--json`` and then prints exactly one JSON document on
stdout and nothing else. Commands live in ``storelab/commands/<name>.py``; each
module defines ``register(app)`` and is discovered here. ``storelab`` alone
prints a short tour (``TOUR``) and the command list; ``storelab --help`` the help.
"""

from __future__ import annotations

import importlib
import pkgutil

import click
import typer

app = typer.Typer(add_completion=False, help="storelab: every layer a store.")

ABOUT = "storelab: implements, measures and explains the memory of modern language models."
# the README's five things to do, one line each: (command, what it shows)
TOUR = (
    ("storelab memory MODEL --context 32768", "its caches and states at that context (a .gguf: llama.cpp's rules)"),
    ("storelab models MODEL", "its layers, the store in each, its parameters"),
    ("storelab probe state_swap MODEL", "what a trained model keeps where (state_swap, keep_one, ...)"),
    ("storelab report --out report", "the essay's claims beside what the code measures (report.html)"),
    ("storelab models my.toml", "a hybrid of your own in TOML (memory and generate take it too)"),
)
MODEL_ARG = ("MODEL: a .gguf file, a Hugging Face repo id in the local cache (org/name), a checkpoint\n"
             "folder or its config.json, a model file, or a zoo name (storelab models lists the zoo).")


def tour(group: click.Group, ctx: click.Context) -> str:
    """The text ``storelab`` prints alone: the five things to do, then every visible command and its line."""
    width = max(len(c) for c, _ in TOUR)
    lines = [ABOUT, "", "Start here:"]
    lines += [f"  {c.ljust(width)}  {what}" for c, what in TOUR]
    lines += ["", MODEL_ARG, "", "Commands:"]
    names = [n for n in group.list_commands(ctx) if not group.get_command(ctx, n).hidden]
    w = max(len(n) for n in names)
    lines += [f"  {n.ljust(w)}  {group.get_command(ctx, n).get_short_help_str(limit=100)}" for n in names]
    lines += ["", "storelab COMMAND --help gives a command's options; the README and docs/ say more."]
    return "\n".join(lines)


@app.callback(invoke_without_command=True)
def _root(ctx: typer.Context) -> None:
    """storelab: implements, measures and explains the memory of modern language models."""
    if ctx.invoked_subcommand is None:
        typer.echo(tour(ctx.command, ctx))


def _load_commands() -> None:
    import storelab.commands as pkg

    for m in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if not m.name.startswith("_"):
            importlib.import_module(f"storelab.commands.{m.name}").register(app)


_load_commands()


def main() -> None:
    app()
