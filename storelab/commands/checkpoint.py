"""``storelab save``: write a model as a checkpoint folder (config.json + safetensors) that
``storelab.load`` (and ``storelab generate --checkpoint``) reads back.

The model is a zoo model or a model file with seeded random weights, or a checkpoint folder
of any supported family, which is thereby converted to our own names. MODEL is any model argument
(``storelab.checkpoint.source.resolve``): a zoo name (``NAME --tiny``, ``NAME.tiny``, ``tiny-NAME``), a
model file (.toml/.json), a checkpoint folder, a .gguf file, a config.json with its safetensors beside it,
or a Hugging Face repo id ``org/name[@revision]`` whose weights are in the local cache (save reads only the
cache; a repo not there is an error saying ``hf download org/name``). ``--config`` and ``--checkpoint`` say
the kind outright, as before (no lookup: the path is read as that kind).
"""

from __future__ import annotations

from pathlib import Path

import typer

from storelab import options as opt
from storelab.console import console, emit_json, table


def save_model(source: str, out: Path, *, tiny: bool = False, config: bool = False, checkpoint: bool = False,
               seed: int = 0, dtype: str | None = None, max_shard_bytes: int = 5 * 2**30, force: bool = False) -> dict:
    """Build or load the model named by ``source``, save it to ``out``; return what was written.
    ``out`` is checked first (``storelab.checkpoint.saver``), before the model is built or read."""
    import torch

    from storelab.checkpoint import load, save
    from storelab.checkpoint.adapters import adapters_of
    from storelab.checkpoint.loader import resolve_dtype
    from storelab.checkpoint.saver import FILES
    from storelab.models.config import check_fits, load_model
    from storelab.outputs import check_folder

    check_folder(out, "save", FILES, force=force, option="OUT", inputs=[source] if checkpoint or config else ())
    if checkpoint:
        if Path(source).resolve() == Path(out).resolve():
            raise ValueError(f"OUT: {out} is the checkpoint being converted: write the conversion to another folder")
        meta = load(source, device="meta", dtype=dtype)  # reads no weights
        check_fits(meta.cfg, what="MODEL", bytes_per_param=next(meta.parameters()).element_size(),
                   instead="convert a smaller checkpoint")
        model = load(source, dtype=dtype)
    else:
        from storelab.models.model import Model
        from storelab.zoo import load_zoo

        cfg = load_model(Path(source)) if config else load_zoo(source, tiny=tiny)
        target = resolve_dtype(dtype or "float32", {})
        check_fits(cfg, what="MODEL", bytes_per_param=torch.empty(0, dtype=target).element_size(),
                   instead="write a smaller model file" if config else "save its tiny version (--tiny)")
        torch.manual_seed(seed)
        model = Model(cfg).eval().to(target)
    files = save(model, out, max_shard_bytes=max_shard_bytes, force=force)
    from storelab.models.accounting import count_params

    n_params = count_params(model.cfg).stored  # every learned number, as storelab models counts them
    return {"model": model.cfg.name, "source": source, "out": str(out), "layers": model.cfg.n_layers,
            "mix": model.cfg.mix(), "parameters": n_params,
            "adapters": [a["kind"] for a in adapters_of(model.cfg)],
            "files": [{"name": f.name, "bytes": f.stat().st_size} for f in files]}


def register(app: typer.Typer) -> None:
    @app.command()
    def save(
        model: str = typer.Argument(..., help="A zoo model name or model file (random weights), or a checkpoint to "
                                              "convert: a folder, .gguf, config.json beside its safetensors, or a "
                                              "Hugging Face repo id org/name (or org/name@REV) in the local cache."),
        out: Path = typer.Argument(..., help="The folder to write (created)."),
        tiny: bool = typer.Option(False, "--tiny", help="Use the zoo model's tiny version."),
        config: bool = typer.Option(False, "--config", help="MODEL is a model file path."),
        checkpoint: bool = typer.Option(False, "--checkpoint", help="MODEL is a checkpoint folder: convert it."),
        seed: int = opt.seed(help="Seed of the random weights (zoo model or model file)."),
        dtype: str = opt.dtype(),
        max_shard_mb: float = opt.number(5 * 1024, "--max-shard-mb", min=0, min_open=True,
                                         help="Largest shard, in MiB."),
        force: bool = opt.force(),
        offline: bool = typer.Option(False, "--offline", help="Hub repos from the local cache only (save reads "
                                     "weights from the cache alone in any case)."),
        json_: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """Write a model as config.json + safetensors (our names), loadable with storelab.load."""
        if config and checkpoint:
            opt.fail("--config and --checkpoint: give at most one")
        if tiny and (config or checkpoint):
            opt.fail(f"--tiny: picks the tiny version of a zoo model; it does nothing to "
                     f"{'--config' if config else '--checkpoint'} (leave it out)")
        with opt.user_errors():
            source = model
            if not (config or checkpoint):   # the kind from the argument itself
                source, config, checkpoint, tiny = save_source(model, tiny=tiny, offline=offline)
            res = save_model(source, out, tiny=tiny, config=config, checkpoint=checkpoint, seed=seed, dtype=dtype,
                             max_shard_bytes=max(1, int(max_shard_mb * 2**20)), force=force)
            res["source"] = model
        if json_:
            emit_json(res)
            return
        console.print(f"{res['model']} ({res['mix']}, {res['parameters']:,} parameters) -> {res['out']}")
        console.print(table("Files written", ["File", "Bytes"], [[f["name"], f["bytes"]] for f in res["files"]]))


def save_source(text: str, *, tiny: bool = False, offline: bool = False) -> tuple[str, bool, bool, bool]:
    """MODEL as ``save_model`` takes it: (source, config, checkpoint, tiny). A zoo model by its file's name
    (its tiny version said in the name or by ``tiny``), a model file's path, a checkpoint's weights folder
    (local only: a Hub repo from the cache)."""
    from storelab.checkpoint.source import Source, resolve, weights_path

    src = resolve(text, tiny=tiny, offline=offline)
    if src.kind is Source.ZOO:
        return src.zoo, False, False, src.tiny
    if src.kind is Source.MODEL_FILE:
        return str(src.path), True, False, False
    return str(weights_path(src)), False, True, False
