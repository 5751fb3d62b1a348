"""The ``storelab`` command line.

Every command takes ``--json`` and then prints exactly one JSON document on
stdout and nothing else. Commands live in ``storelab/commands/<name>.py``; each
module defines ``register(app)`` and is discovered here.
"""

from __future__ import annotations

import importlib
import pkgutil

import typer

app = typer.Typer(add_completion=False, no_args_is_help=True, help="storelab: every layer a store.")


@app.callback()
def _root() -> None:
    """storelab: implements, measures and explains the memory of modern language models."""


def _load_commands() -> None:
    import storelab.commands as pkg

    for m in sorted(pkgutil.iter_modules(pkg.__path__), key=lambda m: m.name):
        if not m.name.startswith("_"):
            importlib.import_module(f"storelab.commands.{m.name}").register(app)


_load_commands()


def main() -> None:
    app()
