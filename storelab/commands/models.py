"""``storelab models``: the zoo (or a model file) with layer counts, store mix and parameters."""

from __future__ import annotations

from pathlib import Path

import typer

from storelab.commands._output import console, emit_json, err_console, table


def _fmt_params(n: float | None) -> str:
    if n is None:
        return "-"
    return f"{n / 1e12:.3g}T" if n >= 1e12 else f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"


def model_record(cfg) -> dict:
    """One model as data: layers, store mix, depth mixer, sharing, parameters beside the publisher's."""
    from storelab.models.accounting import compare_published, count_params

    pa = count_params(cfg)
    rec = {
        "name": cfg.name, "title": cfg.title or cfg.name, "layers": cfg.n_layers, "mix": cfg.mix(),
        "depth": cfg.layers[0].depth.KIND, "d_model": cfg.d_model, "vocab_size": cfg.vocab_size,
        "channel_mix": _slot_mix(cfg, "channel"),
        "shared_caches": sorted({lay.cache_owner for lay in cfg.layers if lay.cache_owner is not None}),
        "encoder_layers": cfg.encoder_layers,
        "context": cfg.context,
        "params": compare_published(cfg, pa),
    }
    return rec


def _slot_mix(cfg, slot: str) -> str:
    counts: dict[str, int] = {}
    for lay in cfg.layers:
        k = getattr(lay, slot).KIND
        counts[k] = counts.get(k, 0) + 1
    return " + ".join(f"{c} {k}" for k, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def load_configs(config: list[Path] | None, tiny: bool, names: list[str] | None = None):
    from storelab.models.config import load_model
    from storelab.zoo import load_zoo, zoo_names

    if config:
        return [load_model(p) for p in config]
    return [load_zoo(n, tiny=tiny) for n in (names or zoo_names())]


def register(app: typer.Typer) -> None:
    @app.command()
    def models(
        name: list[str] = typer.Argument(None, help="Zoo models to show (default: all)."),
        config: list[Path] = typer.Option(None, "--config", help="A model file (TOML or JSON) instead of the zoo."),
        tiny: bool = typer.Option(False, "--tiny", help="The tiny versions of the zoo models."),
        json_: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """List the zoo's models (or a model file): layers, store mix, parameters beside the publisher's."""
        try:
            cfgs = load_configs(config, tiny, name)
        except ValueError as e:
            err_console.print(f"[red]error:[/red] {e}")
            raise typer.Exit(2)
        recs = [model_record(c) for c in cfgs]
        if json_:
            emit_json(recs)
            return
        rows = []
        for r in recs:
            p = r["params"]
            stored = _fmt_params(p["stored"]) + (f" + {_fmt_params(p['engram'])} Engram" if p.get("engram") else "")
            pub = p.get("published_stored")
            pub_s = (_fmt_params(pub) if pub else "open") + (
                f" + {_fmt_params(p['published_engram'])}" if p.get("published_engram") else "")
            act = _fmt_params(p["active"]) + (f" ({_fmt_params(p['active_prefill'])} prefill)"
                                              if "active_prefill" in p else "")
            ratio = lambda k: f"{p[k]:.3f}" if p.get(k) else "-"  # noqa: E731
            rows.append([r["title"], r["layers"], r["mix"], r["depth"], stored, pub_s, ratio("stored_ratio"),
                         act, _fmt_params(p.get("published_active")), ratio("active_ratio")])
        console.print(table("Models as data (ours beside the publisher's)",
                            ["Model", "Layers", "Token mixing", "Depth", "Stored", "Published", "ratio",
                             "Active", "Published", "ratio"], rows))
