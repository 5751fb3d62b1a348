"""``storelab memory``: what each layer keeps at a context length, in two terms (bytes per token,
bytes per sequence), the totals at L for a batch, and the longest context that fits a budget.

Models: any model argument, positionally (``storelab.checkpoint.source.resolve``): zoo names
(``NAME --tiny``, ``NAME.tiny``, ``tiny-NAME``), storelab model files (.toml/.json), checkpoint folders,
config.json or .gguf files, Hugging Face repo ids ``org/name[@revision]`` (from the local cache; online, a
repo not there has its config.json fetched and, for ``--budget``, its safetensors headers read by HTTP range
reads, never its weights; ``--offline`` or ``HF_HUB_OFFLINE``: the cache alone). ``--config FILE`` and
``--checkpoint DIR|config.json`` say the kind outright, as before. No weights are needed. Formats:
``--cache-dtype`` for caches (each store's published format when not given), ``--state-dtype`` for
recurrent states and open pools, ``--weights-dtype`` for the weights beside them under ``--budget``.

A GGUF file is read from its header alone (milliseconds at any size, a large vocabulary aside) and accounted
for the engine that runs it: ``--engine`` defaults to llama.cpp there (said in the output: "default for a
GGUF file"), with llama.cpp's f16 caches and f32 states; ``--budget`` counts each tensor as the file stores
it (Q4_K, Q6_K, Q8_0, MXFP4, ..., ``weights_format`` "gguf", ``weights_by_dtype`` by GGML type).

From a checkpoint folder: the cache format its config states (``quantization_config.kv_cache_scheme``,
``kv_cache_quant_algo``, ``kv_cache_dtype``; ``storelab.models.memory_terms.folder_cache_format``) when no
``--cache-dtype`` is given, the record naming the field (``cache_format_source``); and with safetensors
beside it (or on the Hub, for a repo whose shards are not cached), ``--budget`` takes the weights' bytes
from the shards' headers, tensor by tensor in its stored dtype (fp8 and packed fp4 experts, their block
scales), unless ``--weights-dtype`` is given.

``--engine``: what an engine allocates beside the ideal (``storelab.models.engines``: ideal, the
default but for a GGUF, stated in the output; transformers, llama.cpp, vllm, each rule from its source): per
layer in the JSON (``engine_bytes``, ``engine_rule``), its total in the text; ``--engine-option KEY=VALUE``
sets the engine's settings (``storelab.models.engines.engine_options``). transformers and vLLM keep their
caches in the model's dtype, read from the checkpoint's ``dtype`` / ``torch_dtype`` unless
``--engine-option model_dtype=`` or ``--cache-dtype`` says otherwise (a folder saved in float32 keeps a
float32 cache in transformers); the output names where it was read (``engine.model_dtype_source``).

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
        name: list[str] = typer.Argument(None, metavar="MODEL", help="Models (default: the zoo's, unless "
                                         "--config/--checkpoint): zoo names, model files, checkpoint folders, "
                                         "config.json or .gguf files, Hugging Face repo ids org/name (or "
                                         "org/name@REV)."),
        context: int = typer.Option(None, "--context", help="Context length L in tokens (default: each model's "
                                                            "published context, else 1,000,000)."),
        batch: int = typer.Option(1, "--batch", help="Sequences held at once (totals at L are for all of them)."),
        cache_dtype: str = typer.Option(None, "--cache-dtype", help="Cache format: f32, f16, bf16, fp8, fp4, "
                                        "q8_0, q4_0 (default: each store's published format, else bf16)."),
        state_dtype: str = typer.Option(None, "--state-dtype", help="Recurrent states and open pools: f32 or bf16 "
                                        "(default f32; vllm: the config's mamba_ssm_dtype, else the model's)."),
        weights_dtype: str = typer.Option(None, "--weights-dtype", help="Weights beside the cache (--budget; "
                                          "default: a folder's safetensors headers, else bf16)."),
        budget: str = typer.Option(None, "--budget", help="Memory to fill, e.g. 24GiB: the longest context per "
                                                          "batch size that fits beside the weights."),
        engine: str = typer.Option(None, "--engine", help="Whose allocation: ideal (what the stores need), "
                                   "transformers, llama.cpp or vllm (their conventions: padding, pages, f32 "
                                   "states). Default: llama.cpp for a .gguf file (what it runs on), else ideal."),
        engine_option: list[str] = typer.Option(None, "--engine-option", help="An engine's setting, KEY=VALUE "
                                                "(llama.cpp: n_ubatch, swa_full, kv_unified; vllm: "
                                                "max_num_batched_tokens, block_size, model_dtype)."),
        dtype: str = typer.Option(None, "--dtype", hidden=True, help="Old name of --cache-dtype."),
        config: list[Path] = typer.Option(None, "--config", help="A model file instead of the zoo."),
        checkpoint: list[Path] = typer.Option(None, "--checkpoint", help="A checkpoint folder or its config.json."),
        tiny: bool = typer.Option(False, "--tiny", help="The tiny versions."),
        offline: bool = typer.Option(False, "--offline", help="Hub repos from the local cache only (as "
                                     "HF_HUB_OFFLINE=1); online, a repo not there has its config.json and "
                                     "safetensors headers read."),
        plot: bool = typer.Option(False, "--plot", help="Draw cache bytes and read cost against context into a PNG."),
        out: Path = typer.Option(None, "--out", help="Where --plot writes its PNG (default memory.png) and the "
                                 "JSON beside it (memory.json)."),
        force: bool = opt.force(),
        json_: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """Per layer and model at context L: bytes per token and per sequence, entries kept and read."""
        from storelab.checkpoint.gguf import is_gguf
        from storelab.checkpoint.source import hf_config_path
        from storelab.commands.models import load_sources
        from storelab.models.accounting import count_params
        from storelab.models.engines import ENGINES, check_engine_cache, engine_options
        from storelab.models.memory_terms import (cache_dtype as read_cache, parse_size, state_dtype as read_state,
                                                  weights_dtype as read_weights)
        from storelab.report.memory_json import budget_record, memory_document, memory_record

        try:
            cache = read_cache(cache_dtype if cache_dtype is not None else dtype)
            state, wdt = read_state(state_dtype or "f32"), read_weights(weights_dtype or "bf16")
            room = parse_size(budget) if budget is not None else None
            if batch <= 0:
                raise ValueError(f"batch: must be > 0, got {batch}")
            if engine is not None and engine not in ENGINES:
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
                    check_apart(f, [*(config or []), *(checkpoint or []), *(Path(n) for n in name or []
                                                                           if Path(n).exists())], folder=False)
                check_files(files, "memory", force=force)
            found = load_sources(name, tiny, config=config, checkpoint=checkpoint, offline=offline)
            cfgs = [cfg for _, cfg in found]
            reports = []
            for src, cfg in found:
                folder = hf_config_path(src) if src.kind.is_checkpoint else None
                gguf = folder is not None and is_gguf(folder)
                eng = engine or ("llama.cpp" if gguf else "ideal")  # a GGUF is run by llama.cpp: its rules
                options = engine_options(eng, engine_option or [])
                check_engine_cache(eng, cache)
                L = context or cfg.context or 1_000_000
                stated = folder_format(folder) if folder is not None and cache is None else None
                eng_state, eng_settings, model_source = None, {}, None
                if eng in ("vllm", "transformers") and "model_dtype" not in options:
                    model_source = model_dtype(folder)   # (format, where it was read), or None
                    if model_source:
                        eng_settings = {"model_dtype": model_source[0]}
                if eng == "vllm":
                    eng_state, eng_settings = vllm_formats(folder, state_dtype and state,
                                                           options.get("model_dtype"))
                eng_settings = {**eng_settings, **options}
                rec = memory_record(cfg, L, cache=stated[0] if stated else cache, state=state, batch=batch,
                                    engine=eng, engine_state=eng_state, engine_settings=eng_settings)
                if stated:
                    rec["cache_format_source"] = stated[1]
                if engine is None and eng != "ideal":
                    rec["engine"]["chosen"] = "default for a GGUF file"
                if model_source and "model_dtype" in rec["engine"]["settings"]:
                    rec["engine"]["model_dtype_source"] = model_source[1]
                if room is not None:
                    rec["budget"] = budget_record(rec["total"], budget=room, weights_format=wdt,
                                                  stored=count_params(cfg).stored, batches=sorted({*BATCHES, batch}))
                    held = weights_held(src) if folder is not None and weights_dtype is None else None
                    if held:
                        check_weights_agree(folder, count_params(cfg).stored, held)
                        from_headers(rec["budget"], rec["total"], held, source="gguf" if gguf else "folder")
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
    fmt = "published formats" if e["cache_format"] == "published" else f"{shown(e['cache_format'])} caches"
    out = ["", f"engine {e['name']}, {fmt}: {gib_mib(e['total_bytes'])}"]
    if e.get("chosen"):
        out[-1] += f" ({e['chosen']}; --engine ideal for what the stores need)"
    if e.get("model_dtype_source"):
        out.append(f"  model dtype {e['settings']['model_dtype']} from {e['model_dtype_source']}")
    if e["state_format"] != rec["state_format"]:
        out[-1] += f", states {shown(e['state_format'])}"
    items = [f"{k} {v:,}" if isinstance(v, int) and not isinstance(v, bool) else f"{k} {v}"
             for k, v in e["settings"].items()
             if v not in (0, "") and not (k == "model_dtype" and e.get("model_dtype_source"))]
    line = ""
    for i, item in enumerate(items):  # the settings, wrapped at 80 columns
        piece = item + ("," if i < len(items) - 1 else "")
        if line and len(line) + 1 + len(piece) > 80:
            out.append(line)
            line = ""
        line = f"{line} {piece}" if line else f"  {piece}"
    if line:
        out.append(line)
    return out


# bytes per element of each safetensors dtype (a packed fp4 tensor is stored as I8 / U8: its bytes as stored)
SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                     "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}


def folder_format(path: Path) -> tuple[str, str] | None:
    """The cache format a checkpoint's config.json states and the field it came from (None: it states none)."""
    from storelab.checkpoint.config_only import read_hf_config
    from storelab.models.memory_terms import folder_cache_format

    hf, file = read_hf_config(path)
    try:
        return folder_cache_format(hf)
    except ValueError as e:
        raise ValueError(f"{file}: {e}") from None


def model_dtype(folder: Path | None) -> tuple[str, str] | None:
    """The model's dtype a checkpoint's config states (``dtype`` / ``torch_dtype``, under ``text_config`` too)
    and where it was read (``config.json: dtype``), or None; a GGUF's is its weights' dequantized dtype."""
    from storelab.checkpoint.config_only import read_hf_config
    from storelab.models.memory_terms import folder_dtypes

    if folder is None:
        return None
    hf, file = read_hf_config(folder)
    named = folder_dtypes(hf)
    if "model" not in named:
        return None
    key = next(k for d in (hf.get("text_config"), hf) if isinstance(d, dict) for k in ("dtype", "torch_dtype")
               if isinstance(d.get(k), str))
    where = f"{file.name}: {key}" if file.suffix != ".gguf" else f"{file.name} (dequantized weights)"
    return named["model"], where


def vllm_formats(folder: Path | None, state: str | None, model: str | None = None) -> tuple[str, dict[str, str]]:
    """vLLM's formats for a model: the states' (``state`` when given, else the config's ``mamba_ssm_dtype``,
    else the model's dtype: its "auto") and the model's dtype (the convolution states': ``model`` when given,
    else the config's, else bf16)."""
    from storelab.checkpoint.config_only import read_hf_config
    from storelab.models.memory_terms import folder_dtypes

    named = folder_dtypes(read_hf_config(folder)[0]) if folder is not None else {}
    model = model or named.get("model", "bf16")
    return state or named.get("ssm", model), {"model_dtype": model}


def weights_held(src) -> dict[str, int] | None:
    """Bytes of a checkpoint's tensors per safetensors dtype: from its local shards' headers, or online from
    the Hub's (a repo whose shards are not in the cache: ``safetensors_headers``, HTTP range reads of the
    headers only); None when neither is there (a config.json alone offline, a GGUF)."""
    import math

    from storelab.checkpoint.source import Source, hf_config_path, safetensors_headers

    if src.kind is Source.GGUF or (src.repo is not None and src.repo.filename is not None):
        from storelab.checkpoint.gguf import gguf_stored_bytes

        return dict(sorted(gguf_stored_bytes(hf_config_path(src)).items()))   # each tensor as stored (Q4_K ...)
    remote = safetensors_headers(src)
    if remote is None:
        return folder_weights(src.path)
    out: dict[str, int] = {}
    for fname, tensors in remote.items():
        for name, (shape, dt) in tensors.items():
            if dt not in SAFETENSORS_BYTES:
                raise ValueError(f"tensor {name!r} in {src.repo.asked}/{fname}: dtype {dt} has no size known to "
                                 f"storelab")
            out[dt] = out.get(dt, 0) + math.prod(shape) * SAFETENSORS_BYTES[dt]
    return dict(sorted(out.items())) or None


def folder_weights(path: Path) -> dict[str, int] | None:
    """Bytes of the folder's tensors per safetensors dtype, from the shards' headers (None: no safetensors)."""
    import math

    from storelab.checkpoint.shards import CheckpointError, Shards

    folder = path if path.is_dir() else path.parent
    if not any(folder.glob("*.safetensors")):
        return None
    shards = Shards(folder)
    out: dict[str, int] = {}
    for name, (shape, dt) in shards.info.items():
        if dt not in SAFETENSORS_BYTES:
            raise CheckpointError(f"tensor {name!r} in {shards.where[name]}: dtype {dt} has no size known to "
                                  f"storelab")
        out[dt] = out.get(dt, 0) + math.prod(shape) * SAFETENSORS_BYTES[dt]
    return dict(sorted(out.items()))


# bytes per parameter a checkpoint's tensors can take, from 1.56-bit ternary / IQ1 GGUF blocks to fp64
BYTES_PER_PARAM = (0.15, 8.5)


def check_weights_agree(folder: Path, params: int, held: dict[str, int]) -> None:
    """A ValueError naming the config and the weights when the weights' bytes cannot hold the parameters the
    config describes (a config.json beside another model's shards): no budget is planned around them."""
    have = sum(held.values())
    lo, hi = BYTES_PER_PARAM
    if params and not lo <= have / params <= hi:
        raise ValueError(f"{folder}: its config describes {params:,} parameters, but the weights beside it hold "
                         f"{have:,} bytes ({have / params:.3g} bytes a parameter; any format takes {lo} to {hi}): "
                         f"the config and the weights are of different models")


def from_headers(bud: dict, total: dict, held: dict[str, int], *, source: str = "folder") -> None:
    """A budget record's weights replaced by the bytes the shards (``source`` "folder") or the GGUF file's tensors
    ("gguf", by GGML type) hold, and what fits beside them."""
    from storelab.models.memory_terms import longest_contexts

    bud["weights_format"], bud["weights_bytes"], bud["weights_by_dtype"] = source, sum(held.values()), held
    bud["longest_context"] = longest_contexts(total["bytes_per_token"], total["bytes_per_sequence_full"],
                                              budget=bud["budget_bytes"], weights=bud["weights_bytes"],
                                              batches=[f["batch"] for f in bud["longest_context"]])
