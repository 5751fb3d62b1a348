"""``storelab export RUN OUT``: a train run folder as a model folder that ``storelab.load`` reads.

The run's checkpoint (a DCP folder, written by any number of processes; or an older run's
``checkpoint.safetensors``) is read in this one process and written through the saver
(``storelab.checkpoint.saver``): ``OUT`` becomes exactly a ``storelab save`` folder, loadable by
``storelab.load``, ``storelab generate --checkpoint`` and the probes. ``OUT`` is checked first
(``storelab.outputs``): a storelab save is rewritten, a new or empty folder filled, a folder of
another kind (a run, a Hugging Face folder) refused unless ``--force``.
"""

from __future__ import annotations

from pathlib import Path

import typer

from storelab import options as opt
from storelab.console import console, emit_json, table


def export_run(run: str | Path, out: str | Path, *, dtype: str | None = None, force: bool = False) -> dict:
    """Write the model of the run folder ``run`` to the model folder ``out``; return what was written."""
    from storelab.checkpoint import save
    from storelab.checkpoint.loader import resolve_dtype
    from storelab.checkpoint.saver import FILES
    from storelab.models.accounting import count_params
    from storelab.outputs import check_folder, folder_kind
    from storelab.train.loop import load_trained

    check_folder(out, "save", FILES, force=force, option="OUT", inputs=[run])  # not inside the run: its next
    if folder_kind(run) != "run":                                                # checkpoint would clear it
        raise ValueError(f"RUN: {run} is not a run folder written by storelab train --out")
    model, task, meta = load_trained(run)
    if dtype:
        model = model.to(resolve_dtype(dtype, {}))
    files = save(model, out, force=force)
    return {"run": str(run), "out": str(out), "step": meta["step"], "model": model.cfg.name, "task": task.NAME,
            "parameters": count_params(model.cfg).stored,  # as storelab models counts them
            "files": [{"name": f.name, "bytes": f.stat().st_size} for f in files]}


def register(app: typer.Typer) -> None:
    @app.command()
    def export(
        run: Path = typer.Argument(..., help="A run folder (storelab train --out)."),
        out: Path = typer.Argument(..., help="The model folder to write (created): storelab.load reads it."),
        dtype: str = opt.dtype(),
        force: bool = opt.force(),
        json_: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """Write a trained run's model as config.json + safetensors, loadable with storelab.load."""
        with opt.user_errors():
            res = export_run(run, out, dtype=dtype, force=force)
        if json_:
            emit_json(res)
            return
        console.print(table("storelab export", ["", "value"],
                            [["run", f"{res['run']} (step {res['step']})"], ["model", res["model"]],
                             ["parameters", res["parameters"]], ["out", res["out"]]]
                            + [[f["name"], f"{f['bytes']:,} bytes"] for f in res["files"]]))
