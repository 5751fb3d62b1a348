"""``storelab save``: write a model as a checkpoint folder (config.json + safetensors) that
``storelab.load`` (and ``storelab generate --checkpoint``) reads back.

The model is a zoo model or a model file with seeded random weights, or a checkpoint folder
of any supported family (``--checkpoint``), which is thereby converted to our own names.
"""

from __future__ import annotations

from pathlib import Path

import typer

from storelab.console import console, emit_json, err_console, table


def save_model(source: str, out: Path, *, tiny: bool = False, config: bool = False, checkpoint: bool = False,
               seed: int = 0, dtype: str | None = None, max_shard_bytes: int = 5 * 2**30) -> dict:
    """Build or load the model named by ``source``, save it to ``out``; return what was written."""
    import torch

    from storelab.checkpoint import load, save
    from storelab.checkpoint.adapters import adapters_of
    from storelab.checkpoint.loader import resolve_dtype

    if checkpoint:
        model = load(source, dtype=dtype)
    else:
        from storelab.models.config import load_model
        from storelab.models.model import Model
        from storelab.zoo import load_zoo

        cfg = load_model(Path(source)) if config else load_zoo(source, tiny=tiny)
        torch.manual_seed(seed)
        model = Model(cfg).eval().to(resolve_dtype(dtype or "float32", {}))
    files = save(model, out, max_shard_bytes=max_shard_bytes)
    n_params = sum(p.numel() for p in model.parameters())
    return {"model": model.cfg.name, "source": source, "out": str(out), "layers": model.cfg.n_layers,
            "mix": model.cfg.mix(), "parameters": n_params,
            "adapters": [a["kind"] for a in adapters_of(model.cfg)],
            "files": [{"name": f.name, "bytes": f.stat().st_size} for f in files]}


def register(app: typer.Typer) -> None:
    @app.command()
    def save(
        model: str = typer.Argument(..., help="A zoo model name (a model file with --config, a checkpoint folder "
                                              "with --checkpoint)."),
        out: Path = typer.Argument(..., help="The folder to write (created)."),
        tiny: bool = typer.Option(False, "--tiny", help="Use the zoo model's tiny version."),
        config: bool = typer.Option(False, "--config", help="MODEL is a model file path."),
        checkpoint: bool = typer.Option(False, "--checkpoint", help="MODEL is a checkpoint folder: convert it."),
        seed: int = typer.Option(0, "--seed", help="Seed of the random weights (zoo model or model file)."),
        dtype: str = typer.Option(None, "--dtype", help="fp32, bf16, fp16 (default: fp32, or the checkpoint's)."),
        max_shard_mb: float = typer.Option(5 * 1024, "--max-shard-mb", help="Largest shard, in MiB."),
        json_: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """Write a model as config.json + safetensors (our names), loadable with storelab.load."""
        if config and checkpoint:
            err_console.print("[red]error:[/red] --config and --checkpoint: give at most one")
            raise typer.Exit(2)
        try:
            res = save_model(model, out, tiny=tiny, config=config, checkpoint=checkpoint, seed=seed, dtype=dtype,
                             max_shard_bytes=max(1, int(max_shard_mb * 2**20)))
        except ValueError as e:
            err_console.print(f"[red]error:[/red] {e}")
            raise typer.Exit(2)
        if json_:
            emit_json(res)
            return
        console.print(f"{res['model']} ({res['mix']}, {res['parameters']:,} parameters) -> {res['out']}")
        console.print(table("Files written", ["File", "Bytes"], [[f["name"], f["bytes"]] for f in res["files"]]))
