"""``storelab subjects``: the trained models the report's probes read (``storelab.subjects``).

``storelab subjects`` lists the shipped subjects with their held-out figures; ``storelab subjects
train NAME --seed K`` (or ``--all``) re-creates them by their recipes, into the package's data folder
(``--force`` to replace the shipped files) or into ``--out DIR``."""

from __future__ import annotations

from pathlib import Path

import typer

from storelab import options as opt
from storelab.console import console, emit_json, table


def check_out(folder: Path, jobs: list[tuple[str, int]], force: bool) -> None:
    """The shipped folder's files are replaced only with --force; another folder is checked as a subjects folder."""
    from storelab.outputs import OutputError, check_folder
    from storelab.subjects import DATA, FILES, paths

    if folder.resolve() == DATA.resolve():
        have = [p for n, s in jobs for p in paths(n, s, folder) if p.exists()]
        if have and not force:
            raise OutputError(f"--out: {have[0]} ships with storelab: refusing to replace it (--force to retrain "
                              f"the shipped subjects in place, or --out DIR)")
        return
    check_folder(folder, "subjects", FILES, force=force)


def real_rows() -> list[dict]:
    """The real subjects (``storelab.subjects.real``): source, licence, format, size, installed or not."""
    from storelab.subjects.real import REAL

    return [s.record() for s in REAL]


def print_real(rows: list[dict]) -> None:
    from storelab.subjects.real import INSTALL

    console.print(table("Real subjects (language models trained elsewhere, GGUF from the package registry)",
                        ["subject", "model", "source", "licence", "format", "size", "installed"],
                        [[r["name"], r["title"], r["source"], r["licence"], r["format"],
                          f"{r['bytes'] / 2**20:.0f} MiB" if "bytes" in r else "",
                          "yes" if r["installed"] else "no"] for r in rows]))
    if not all(r["installed"] for r in rows):
        console.print(f"to install the real subjects: {INSTALL}")


def register(app: typer.Typer) -> None:
    sub = typer.Typer(help="The trained subjects the report's probes read.", invoke_without_command=True,
                      no_args_is_help=False)

    @sub.callback()
    def subjects(ctx: typer.Context,
                 folder: Path = typer.Option(None, "--dir", help="A subjects folder (default: the shipped ones)."),
                 json_: bool = typer.Option(False, "--json", help="Print one JSON document.")) -> None:
        """List the subjects, their layers and held-out retrieval / compliance at each size."""
        if ctx.invoked_subcommand is not None:
            return
        from storelab.subjects import DATA, RECIPES, SIZES, summary

        with opt.user_errors():
            folder = folder or DATA
            if not folder.is_dir():
                raise ValueError(f"--dir: {folder} is not a folder")
            rows = summary(folder)
        real = real_rows()
        if json_:
            emit_json({"folder": str(folder), "subjects": rows, "recipes": list(RECIPES), "real": real})
            return
        console.print(table(f"Trained subjects in {folder}",
                            ["subject", "seed", "layers", "steps", "s", "learned",
                             *[f"n={k}: ret / comp" for k in SIZES]],
                            [[r["name"], r["seed"], r["layers"], r["steps"], r["seconds"],
                              "yes" if r["learned"] else r["verdict"],
                              *[f"{r['held_out'][str(k)]['retrieval']:.2f} / {r['held_out'][str(k)]['compliance']:.2f}"
                                if str(k) in r["held_out"] else "" for k in SIZES]] for r in rows]))
        if not rows:
            console.print(f"no subjects in {folder}; `storelab subjects train --all` trains them")
        print_real(real)

    @sub.command("train")
    def train_cmd(name: str = typer.Argument(None, help="A subject (see `storelab subjects`); or --all."),
                  seed: int = opt.seed(0, "--seed", help="Which seed (0, 1, 2)."),
                  all_: bool = typer.Option(False, "--all", help="Every subject and seed."),
                  out: Path = typer.Option(None, "--out", help="Folder to write into (default: the shipped data)."),
                  jobs: int = opt.cores(0, "--jobs", help="Processes at once, one thread each (default: the "
                                        "machine's cores, at most 2; at most the machine's cores)."),
                  force: bool = opt.force(),
                  json_: bool = typer.Option(False, "--json", help="Print one JSON document.")) -> None:
        """Train subjects by their recipes (the exact runs that made the shipped files)."""
        import os

        from storelab.subjects import DATA, RECIPES, check_seed, every, recipe

        with opt.user_errors():
            if all_ and name is not None:
                raise ValueError("--all: give a subject's name or --all, not both")
            if not all_ and name is None:
                raise ValueError(f"name: give a subject ({', '.join(RECIPES)}) or --all")
            todo = every() if all_ else [(recipe(name).name, check_seed(seed, name))]
            folder = out or DATA
            check_out(folder, todo, force)
        workers = jobs or min(2, os.cpu_count() or 1)

        def say(m: dict) -> None:
            if not json_:
                console.print(f"{m['name']} seed {m['seed']}: {m['steps']} steps, {m['seconds']:.0f} s, {m['verdict']}")

        from storelab.subjects import train_many

        done = train_many(todo, folder, workers=min(workers, len(todo)), say=say)
        if json_:
            emit_json({"folder": str(folder), "trained": [{k: m[k] for k in ("name", "seed", "steps", "seconds",
                                                                             "learned", "verdict", "held_out")}
                                                          for m in done]})
        if not all(m["learned"] for m in done):
            raise typer.Exit(code=1)

    app.add_typer(sub, name="subjects")
