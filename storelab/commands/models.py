"""``storelab models [MODEL...]``: the zoo (or a model file) with layer counts, store mix and parameters.

MODEL is any model argument (``storelab.checkpoint.source.resolve``): a zoo name (``NAME --tiny``,
``NAME.tiny``, ``tiny-NAME``), a storelab model file (.toml/.json), a checkpoint folder, a config.json,
a .gguf file, or a Hugging Face repo id ``org/name[@revision]`` (read from the local cache; online, only
its config.json is fetched; ``--offline`` or ``HF_HUB_OFFLINE``: the cache alone). ``--config FILE`` and
``--checkpoint DIR|config.json`` say the kind outright, as before.

With a checkpoint (a folder, config.json, GGUF or repo, or ``--checkpoint``), the text model's stored and
active parameters, and beside them what the checkpoint holds that storelab does not build
(``storelab.checkpoint.towers``): each vision or audio tower and the MTP layers, named, with their
parameters or "not counted" and why; and the total of the text model and the counted parts (Qwen3.5-0.8B: 752M + 101M + 20.5M = 873M, its published figure). ``--json``: per
checkpoint ``parts`` (name, kind, source, params: null when not counted, why) and ``params.total_stored``,
``params.not_counted``."""

from __future__ import annotations

from pathlib import Path

import typer

from storelab import options as opt
from storelab.console import console, emit_json, table
from storelab.models.record import model_record


def _fmt_params(n: float | None) -> str:
    if n is None:
        return "-"
    return f"{n / 1e12:.3g}T" if n >= 1e12 else f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"


def load_sources(names: list[str] | None, tiny: bool = False, *, config: list[Path] | None = None,
                 checkpoint: list[Path] | None = None, offline: bool = False):
    """The models named: each model argument resolved (``storelab.checkpoint.source``), then the ``--config``
    files and the ``--checkpoint`` folders, in that order; all zoo models when nothing is named. A Hub repo
    not in the cache has its config.json fetched (online only). Returns (source, ModelConfig) pairs."""
    from storelab.checkpoint.source import (checkpoint_source, fetch_config, model_config, model_file_source,
                                            resolve, zoo_source)
    from storelab.zoo import zoo_names

    if tiny and not names and (config or checkpoint):
        raise ValueError(f"--tiny: picks the tiny version of a zoo model; it does nothing to "
                         f"{'--config' if config else '--checkpoint'} (leave it out, or name a zoo model)")
    srcs = ([resolve(n, tiny=tiny, offline=offline) for n in names or []]
            + [model_file_source(p) for p in config or []] + [checkpoint_source(p) for p in checkpoint or []])
    if not srcs:
        srcs = [zoo_source(n, tiny=tiny) for n in zoo_names()]
    srcs = [fetch_config(s) for s in srcs]
    return [(s, model_config(s)) for s in srcs]


def add_parts(rec: dict, cfg, path: Path) -> None:
    """The checkpoint's parts apart (towers, MTP layers) and its total, into its record."""
    from dataclasses import asdict

    from storelab.checkpoint import towers
    from storelab.checkpoint.config_only import read_hf_config

    found = towers.parts(read_hf_config(path)[0], cfg)
    rec["parts"] = [asdict(p) for p in found]
    rec["params"]["total_stored"], rec["params"]["not_counted"] = towers.total(cfg, found)


def register(app: typer.Typer) -> None:
    @app.command()
    def models(
        name: list[str] = typer.Argument(None, metavar="MODEL", help="Models to show (default: the zoo's): "
                                         "zoo names, model files, checkpoint folders, config.json or .gguf files, "
                                         "Hugging Face repo ids org/name (or org/name@REV)."),
        config: list[Path] = typer.Option(None, "--config", help="A model file (TOML or JSON) instead of the zoo."),
        checkpoint: list[Path] = typer.Option(None, "--checkpoint", help="A checkpoint folder or its config.json "
                                                                        "(no weights needed)."),
        tiny: bool = typer.Option(False, "--tiny", help="The tiny versions of the zoo models."),
        offline: bool = typer.Option(False, "--offline", help="Hub repos from the local cache only (as "
                                     "HF_HUB_OFFLINE=1); online, a repo not there has its config.json fetched."),
        json_: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """List the zoo's models (or a model file): layers, store mix, parameters beside the publisher's."""
        from storelab.checkpoint.source import hf_config_path

        with opt.user_errors():
            found = load_sources(name, tiny, config=config, checkpoint=checkpoint, offline=offline)
            recs = [model_record(c) for _, c in found]
            for (src, cfg), rec in zip(found, recs):
                if src.kind.is_checkpoint:   # a checkpoint: its towers and MTP layers beside the text model
                    add_parts(rec, cfg, hf_config_path(src))
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
        console.print("Parameters count the embedding and the LM head matrices in full (once when tied), as the "
                      "publishers do; active = per generated token.", highlight=False)
        for r in recs:  # a model with no published figures (a checkpoint): without the embedding and head too
            p = r["params"]
            if not p.get("published_stored"):
                console.print(f"[bold]{r['title']}[/bold]: {'text model ' if r.get('parts') else ''}stored "
                              f"{_fmt_params(p['stored'])}, active {_fmt_params(p['active'])}; without the "
                              f"embedding and LM head, active {_fmt_params(p['active_without_embedding'])}",
                              highlight=False)
            for part in r.get("parts", []):   # what the checkpoint holds beside the text model
                console.print(f"  {part['name']}, from {part['source']} (not built): "
                              + (f"{_fmt_params(part['params'])} ({part['params']:,})" if part["params"] is not None
                                 else f"not counted: {part['why']}"), highlight=False, soft_wrap=True)
            if r.get("parts"):
                missing = p["not_counted"]
                console.print(f"  total: {_fmt_params(p['total_stored'])} ({p['total_stored']:,}), the text model and "
                              f"the parts counted" + (f"; without {', '.join(missing)} (not counted)" if missing else ""),
                              highlight=False, soft_wrap=True)
        for r in recs:  # where ours differs by more than 3 %, the zoo file says why
            p = r["params"]
            off = [k for k in ("stored_ratio", "active_ratio", "active_prefill_ratio", "engram_ratio")
                   if p.get(k) and abs(p[k] - 1) > 0.03]
            if (off or not p.get("published_stored")) and p.get("published_note"):
                console.print(f"[bold]{r['title']}[/bold]: {p['published_note']}")
