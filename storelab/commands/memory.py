"""``storelab memory``: what each layer keeps at a context length, in two terms (bytes per token,
bytes per sequence), the totals at L for a batch, and the longest context that fits a budget.

Models: zoo names, storelab model files (``--config``) or real checkpoints (``--checkpoint``, a
folder or its config.json; no weights needed). Formats: ``--cache-dtype`` for caches (each store's
published format when not given), ``--state-dtype`` for recurrent states and open pools,
``--weights-dtype`` for the weights beside them under ``--budget``.

``--engine``: what an engine allocates beside the ideal (``storelab.models.engines``: ideal, the
default, stated in the output; transformers, llama.cpp, vllm, each rule from its source): per layer in
the JSON (``engine_bytes``, ``engine_rule``), its total in the text.

``--json`` prints one document of ``storelab.report.memory_json`` (docs/memory.schema.json, versioned);
the text is made from the same records. ``--plot`` writes the figure and a JSON beside it, both checked
first (``storelab.outputs.check_files``: rewritten only when that JSON says ``memory`` wrote it).
"""

from __future__ import annotations

import json
from pathlib import Path

import typer

from storelab import options as opt
from storelab.console import console, emit_json, err_console

BATCHES = (1, 2, 4, 8, 16, 32, 64)


def register(app: typer.Typer) -> None:
    @app.command()
    def memory(
        name: list[str] = typer.Argument(None, help="Zoo models (default: all, unless --config/--checkpoint)."),
        context: int = typer.Option(None, "--context", help="Context length L in tokens (default: each model's "
                                                            "published context, else 1,000,000)."),
        batch: int = typer.Option(1, "--batch", help="Sequences held at once (totals at L are for all of them)."),
        cache_dtype: str = typer.Option(None, "--cache-dtype", help="Cache format: f32, f16, bf16, fp8, fp4, "
                                        "q8_0, q4_0 (default: each store's published format, else bf16)."),
        state_dtype: str = typer.Option("f32", "--state-dtype", help="Recurrent states and open pools: f32 or bf16."),
        weights_dtype: str = typer.Option("bf16", "--weights-dtype", help="Weights beside the cache (--budget)."),
        budget: str = typer.Option(None, "--budget", help="Memory to fill, e.g. 24GiB: the longest context per "
                                                          "batch size that fits beside the weights."),
        engine: str = typer.Option("ideal", "--engine", help="Whose allocation: ideal (what the stores need), "
                                   "transformers, llama.cpp or vllm (their conventions: padding, pages, f32 "
                                   "states)."),
        dtype: str = typer.Option(None, "--dtype", hidden=True, help="Old name of --cache-dtype."),
        config: list[Path] = typer.Option(None, "--config", help="A model file instead of the zoo."),
        checkpoint: list[Path] = typer.Option(None, "--checkpoint", help="A checkpoint folder or its config.json."),
        tiny: bool = typer.Option(False, "--tiny", help="The tiny versions."),
        plot: bool = typer.Option(False, "--plot", help="Draw cache bytes and read cost against context into a PNG."),
        out: Path = typer.Option(None, "--out", help="Where --plot writes its PNG (default memory.png) and the "
                                 "JSON beside it (memory.json)."),
        force: bool = opt.force(),
        json_: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """Per layer and model at context L: bytes per token and per sequence, entries kept and read."""
        from storelab.commands.models import load_configs
        from storelab.models.accounting import count_params
        from storelab.models.engines import ENGINES
        from storelab.models.memory_terms import (cache_dtype as read_cache, parse_size, state_dtype as read_state,
                                                  weights_dtype as read_weights)
        from storelab.report.memory_json import budget_record, memory_document, memory_record

        try:
            cache = read_cache(cache_dtype if cache_dtype is not None else dtype)
            state, wdt = read_state(state_dtype), read_weights(weights_dtype)
            room = parse_size(budget) if budget is not None else None
            if batch <= 0:
                raise ValueError(f"batch: must be > 0, got {batch}")
            if engine not in ENGINES:
                raise ValueError(f"engine: unknown {engine!r} (known: {', '.join(ENGINES)})")
            if context is not None and context <= 0:
                raise ValueError(f"context: must be > 0, got {context}")
            if out is not None and not plot:
                raise ValueError("--out: names the file --plot writes; give --plot too")
            if plot:  # both files checked before the work, and neither inside an input
                from storelab.outputs import check_apart, check_files
                from storelab.report.memory_plot import plot_files

                files = plot_files(out if out is not None else Path("memory.png"))
                for f in files:
                    check_apart(f, [*(config or []), *(checkpoint or [])], folder=False)
                check_files(files, "memory", force=force)
            cfgs = load_configs(config, tiny, name, checkpoint)
            reports = []
            for cfg in cfgs:
                L = context or cfg.context or 1_000_000
                rec = memory_record(cfg, L, cache=cache, state=state, batch=batch, engine=engine)
                if room is not None:
                    rec["budget"] = budget_record(rec["total"], budget=room, weights_format=wdt,
                                                  stored=count_params(cfg).stored, batches=sorted({*BATCHES, batch}))
                reports.append((cfg, rec))
        except ValueError as e:  # CheckpointError is one
            opt.fail(str(e))
        if plot:
            from storelab.outputs import atomic_write
            from storelab.report.memory_plot import plot_memory

            try:
                png, side = files
                data = plot_memory(cfgs, png, dtype=cache or "bf16")
                side_doc = {"command": "memory", "dtype": cache or "bf16", "models": [c.name for c in cfgs],
                            "configs": {c.name: c.to_dict() for c in cfgs}, "series": data}
                atomic_write(side, json.dumps(side_doc, indent=2) + "\n")
            except (ValueError, OSError) as e:
                opt.fail(str(e))
            (err_console if json_ else console).print(f"wrote {png} and {side}", highlight=False, soft_wrap=True)
            if not json_:
                return
        if json_:
            emit_json(memory_document([rec for _, rec in reports]))
            return
        _print(reports)


def _print(reports) -> None:
    from storelab.report.memory_text import budget_text, model_text

    for k, (cfg, rec) in enumerate(reports):
        lines = model_text(cfg, rec) + engine_text(rec)
        if "budget" in rec:
            lines += budget_text(cfg, rec["budget"])
        if k:
            console.print("")
        for line in lines:
            console.print(line, highlight=False, markup=False, soft_wrap=True)


def engine_text(rec) -> list[str]:
    """The engine's line(s): its name (the ideal stated as such) and, for an engine, its total and settings."""
    from storelab.report.memory_text import gib_mib, shown

    e = rec["engine"]
    if e["name"] == "ideal":
        return ["", "engine: ideal (what the stores need; --engine llama.cpp, vllm, transformers)"]
    fmt = "the publisher's formats" if e["cache_format"] == "published" else shown(e["cache_format"])
    out = ["", f"engine {e['name']} (caches in {fmt}): {gib_mib(e['total_bytes'])}"]
    if e["settings"]:
        out.append("  " + ", ".join(f"{k} {v:,}" if isinstance(v, int) and not isinstance(v, bool) else f"{k} {v}"
                                    for k, v in e["settings"].items()))
    return out
