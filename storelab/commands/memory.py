"""``storelab memory``: what each layer keeps and reads at a context length (essay worked example 2)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from storelab.console import console, emit_json, err_console, table
from storelab.report.memory_plot import plot_memory


def _layers_text(idx: list[int]) -> str:
    from storelab.models.fileformat import compact_indices

    c = compact_indices(idx, 10**9)
    items = c if isinstance(c, list) else [c]
    out = []
    for it in items:
        if isinstance(it, str):
            parts = it.split(":")
            a, b = int(parts[0]), int(parts[1]) - 1
            out.append(f"{a}-{b}" if len(parts) == 2 else f"{a},{a + int(parts[2])},..,{b - (b - a) % int(parts[2])}")
        else:
            out.append(str(it))
    return ",".join(out)


def register(app: typer.Typer) -> None:
    @app.command()
    def memory(
        name: list[str] = typer.Argument(None, help="Zoo models (default: all)."),
        context: int = typer.Option(1_000_000, "--context", help="Context length L in tokens."),
        dtype: str = typer.Option("bf16", "--dtype", help="Entry format: fp32, bf16, fp8 or fp4."),
        config: list[Path] = typer.Option(None, "--config", help="A model file instead of the zoo."),
        tiny: bool = typer.Option(False, "--tiny", help="The tiny versions."),
        plot: bool = typer.Option(False, "--plot", help="Draw cache bytes and read cost against context into a PNG."),
        out: Path = typer.Option(Path("memory.png"), "--out", help="Where --plot writes its PNG (and a JSON beside it)."),
        json_: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """Per layer and model at context L: entries kept and read, bytes per token, read FLOPs."""
        from storelab.commands.models import load_configs
        from storelab.models.accounting import kind_summary, memory_report

        if dtype not in ("fp32", "bf16", "fp8", "fp4"):
            err_console.print(f"[red]error:[/red] dtype: must be fp32, bf16, fp8 or fp4, got {dtype!r}")
            raise typer.Exit(2)
        try:
            cfgs = load_configs(config, tiny, name)
            records = [rec for cfg in cfgs for rec in memory_report(cfg, context, dtype=dtype)]
        except ValueError as e:
            err_console.print(f"[red]error:[/red] {e}")
            raise typer.Exit(2)
        if plot:
            data = plot_memory(cfgs, out, dtype=dtype)
            side = out.with_suffix(".json")
            side.write_text(json.dumps({"command": "memory", "dtype": dtype, "models": [c.name for c in cfgs],
                                        "configs": {c.name: c.to_dict() for c in cfgs}, "series": data}, indent=2))
            if not json_:
                console.print(f"wrote {out} and {side}")
                return
        if json_:
            emit_json(records)
            return
        for cfg in cfgs:
            recs = [r for r in records if r["model"] == cfg.name]
            tot = recs[-1]
            glob: dict[int, float] = {r["layer"]: r["global_bytes_per_token"] for r in recs[:-1]}
            rows = []
            for g in kind_summary(recs[:-1]):
                kind = ", ".join([g["kind"]] + ([g["part"]] if g["part"] else [])
                                 + (["reads a shared cache"] if g["shared"] else []))
                rows.append([kind, f"{len(g['layers'])}: {_layers_text(g['layers'])}", g["kept"], g["read"],
                             g["scored"], sum(glob[i] for i in g["layers"]), g["bytes_per_token"],
                             float(g["read_flops"])])
            rows.append(["total", str(cfg.n_layers), tot["kept"], tot["read"], tot["scored"],
                         tot["global_bytes_per_token"], tot["bytes_per_token"], float(tot["read_flops"])])
            console.print(table(f"{cfg.title or cfg.name} at L = {context:,} ({dtype} entries)",
                                ["Store", "Layers", "Kept (each)", "Read (each)", "Scored (each)",
                                 "Global cache B/token", "All state B/token", "Read FLOPs"], rows))
