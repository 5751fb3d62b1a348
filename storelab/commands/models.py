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
        "experts": _experts(cfg),
        "shared_caches": sorted({lay.cache_owner for lay in cfg.layers if lay.cache_owner is not None}),
        "encoder_layers": cfg.encoder_layers,
        "context": cfg.context,
        "params": compare_published(cfg, pa),
    }
    return rec


def _experts(cfg) -> str:
    """Experts chosen / available per token, as the essay's table says it ("6 / 384, plus 1 shared")."""
    moes = {(m.top_k, m.n_experts, m.n_shared) for m in (lay.channel for lay in cfg.layers) if m.KIND == "moe"}
    out = []
    for k, e, s in sorted(moes):
        out.append(f"{k} / {e}" + (f", plus {s} shared" if s else ""))
    return "; ".join(out)


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

            def pair(ours, pub, ratio):
                return f"{_fmt_params(ours)} / {_fmt_params(pub) if pub else 'open'}" + (
                    f" ({p[ratio]:.3f})" if p.get(ratio) else "")

            stored = pair(p["stored"] - p.get("engram", 0), p.get("published_stored"), "stored_ratio")
            if p.get("engram"):
                stored += f" + Engram {pair(p['engram'], p.get('published_engram'), 'engram_ratio')}"
            active = pair(p["active"], p.get("published_active"), "active_ratio")
            if "active_prefill" in p:
                active += f"; prefill {pair(p['active_prefill'], p.get('published_active_prefill'), 'active_prefill_ratio')}"
            rows.append([r["title"], r["layers"], r["mix"], r["experts"], r["depth"], stored, active])
        console.print(table("Models as data: parameters ours / the publisher's (ratio)",
                            ["Model", "Layers", "Token mixing", "Experts", "Depth", "Stored", "Active per token"],
                            rows))
        for r in recs:  # where ours differs by more than 3 %, the zoo file says why
            p = r["params"]
            off = [k for k in ("stored_ratio", "active_ratio", "active_prefill_ratio", "engram_ratio")
                   if p.get(k) and abs(p[k] - 1) > 0.03]
            if (off or not p.get("published_stored")) and p.get("published_note"):
                console.print(f"[bold]{r['title']}[/bold]: {p['published_note']}")
