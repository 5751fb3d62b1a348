"""``storelab generate MODEL``: prefill a random prompt in chunks, decode token by token, and
report per store kind the state bytes measured beside the analytic ones.

MODEL is any model argument (``storelab.checkpoint.source.resolve``): a zoo name (``NAME --tiny``,
``NAME.tiny``, ``tiny-NAME``) or a storelab model file (.toml/.json), built with random weights; or a
checkpoint with its weights: a folder, a .gguf file, a config.json with its safetensors beside it, a
Hugging Face repo id ``org/name[@revision]`` whose weights are in the local cache (generate reads only
the cache; a repo not there, or there without its weights, is an error saying ``hf download org/name``).
``--config FILE`` and ``--checkpoint DIR`` say the kind outright, as before.

With ``--prompt TEXT`` (and a checkpoint) the prompt is text instead: encoded with the
folder's tokenizer.json (``--chat``: as a user turn of its chat template), decoded greedily or
sampled, stopped at an end-of-sequence token (tokenizer_config.json's eos_token, and
generation_config.json's / config.json's eos_token_id), and printed as text (``--json``: the ids
and the text). A missing or malformed tokenizer is an error naming the file."""

from __future__ import annotations

from pathlib import Path

import typer

from storelab import options as opt
from storelab.console import console, emit_json, err_console, table

MAX_TOKENS = 2**24  # prompt and generated tokens each: beyond it the prompt alone needs gigabytes


def _weights_choice(weights: str, checkpoint, device: str, dtype: str | None) -> tuple[str, str]:
    """``--weights``: the format to run and why (empty: as given). ``auto``: a checkpoint's own on the CPU when no
    other --dtype than fp32 is asked (``storelab.checkpoint.loader.own_weight_format``), else as loaded (fp32)."""
    from storelab.models.quant import WEIGHT_FORMATS

    if weights != "auto":
        if weights not in WEIGHT_FORMATS:
            raise ValueError(f"--weights: must be auto or one of {', '.join(WEIGHT_FORMATS)}, got {weights!r}")
        return weights, ""
    if checkpoint is None:
        return "fp32", "auto: random weights, fp32"
    if str(device) != "cpu":
        return "fp32", f"auto: as loaded on {device} (packed weights are for the CPU)"
    if dtype not in (None, "fp32", "float32"):
        return "fp32", f"auto: as loaded in --dtype {dtype}"
    from storelab.checkpoint.loader import own_weight_format

    fmt, why = own_weight_format(checkpoint)
    return fmt, f"auto: {why}"


def run_generation(cfg, *, prompt_len: int, new_tokens: int, chunk: int = 0, temperature: float = 0.0,
                   top_k: int = 0, seed: int = 0, progress=None, model=None, device: str = "cpu",
                   dtype: str | None = None, weights: str = "fp32") -> dict:
    """Build the model with random weights on ``device`` in ``dtype`` (None: fp32) unless ``model`` is
    given (a loaded checkpoint, run where it lies), generate, and account the cache it holds (in the
    model's dtype). The prompt is drawn on the CPU, so it is the same on every device."""
    import torch

    from storelab.checkpoint.loader import resolve_dtype
    from storelab.commands._finite import check_weights
    from storelab.probes.source import placement
    from storelab.models.accounting import analytic_state_bytes
    from storelab.models.memory_terms import check_run_fits
    from storelab.models.model import Model, cache_bytes_by_kind, generate

    if prompt_len <= 0 or new_tokens < 0:
        raise ValueError(f"prompt_len: must be > 0 and new_tokens >= 0, got {prompt_len}, {new_tokens}")
    if cfg.context and prompt_len + new_tokens > cfg.context:
        raise ValueError(f"prompt_len: {prompt_len} + {new_tokens} new tokens exceed {cfg.name}'s context of "
                         f"{cfg.context:,} tokens")
    if chunk < 0 or top_k < 0 or not 0 <= seed <= opt.SEED_MAX:
        raise ValueError(f"chunk, top_k, seed: must be >= 0 (seed <= {opt.SEED_MAX}), got {chunk}, {top_k}, {seed}")
    if not (temperature >= 0 and temperature != float("inf")):
        raise ValueError(f"temperature: must be a finite number >= 0, got {temperature}")
    check_run_fits(cfg, tokens=prompt_len + new_tokens, chunk=chunk or prompt_len, option="--prompt-len, "
                   "--new-tokens", instead="generate fewer tokens")
    torch.manual_seed(seed)
    if model is None:
        model = Model(cfg).eval().to(device=device, dtype=resolve_dtype(dtype or "fp32", {}))
    check_weights(model, cfg.name)
    from storelab.models.quant import quantize_weights

    quantize_weights(model, weights)  # bf16 / int8 linear weights (fp32: as it is)
    gate_generation(model, prompt_len=prompt_len, new_tokens=new_tokens, chunk=chunk,
                    option="--prompt-len, --new-tokens", instead="generate fewer tokens (or give --chunk)")
    where = placement(model, next(model.parameters()).device)
    prompt = torch.randint(0, cfg.vocab_size, (1, prompt_len), generator=torch.Generator().manual_seed(seed))
    gen = torch.Generator(device=where["device"]).manual_seed(seed + 1)   # sampling draws where the logits are
    out, cache = generate(model, prompt.to(where["device"]), new_tokens, chunk=chunk, temperature=temperature,
                          top_k=top_k, generator=gen, on_token=progress)
    measured = cache_bytes_by_kind(model, cache)
    analytic = analytic_state_bytes(cfg, [st.seen for st in cache], dtype=where["dtype"], own_copies=model.unshared)
    kinds = sorted(set(measured) | set(analytic))
    return {
        "model": cfg.name, **where, "prompt_len": prompt_len, "new_tokens": new_tokens, "chunk": chunk,
        "temperature": temperature, "seed": seed, "tokens": out[0].tolist(),
        "layer_tokens": [st.seen for st in cache],
        "state": [{"kind": k, "measured_bytes": measured.get(k, 0), "analytic_bytes": analytic.get(k, 0)}
                  for k in kinds],
        "unshared_layers": model.unshared,
    }


def eos_ids(folder: Path, tok) -> set[int]:
    """The ids that end a generation: the tokenizer's eos_token and the folder's eos_token_id entries."""
    import json

    out = {tok.eos_id} - {None}
    for name in ("generation_config.json", "config.json"):
        try:
            d = json.loads((Path(folder) / name).read_text())
        except (OSError, ValueError):
            continue
        v = d.get("eos_token_id") if isinstance(d, dict) else None
        out |= {x for x in (v if isinstance(v, list) else [v]) if isinstance(x, int) and not isinstance(x, bool)}
    return out


def gate_generation(model, *, prompt_len: int, new_tokens: int, chunk: int, option: str, instead: str) -> None:
    """Refuse a generation whose measured peak (``storelab.models.peaks``) passes half this machine."""
    from storelab.models import peaks
    from storelab.models.memory_terms import run_bytes

    floor = run_bytes(model.cfg, tokens=prompt_len + new_tokens, chunk=chunk or prompt_len)
    peaks.gate(model, floor, lambda: peaks.generate_tensors(model, prompt_len=prompt_len, new_tokens=new_tokens,
                                                             chunk=chunk),
               option=option, held=f"a prompt of {prompt_len:,} tokens and {new_tokens:,} new", instead=instead,
               large=prompt_len + new_tokens > peaks.LARGE)


def generate_text(model, tok, ids: list[int], *, new_tokens: int, stop: set[int], chunk: int = 0,
                  temperature: float = 0.0, top_k: int = 0, seed: int = 0) -> dict:
    """Generate after the prompt ids until ``new_tokens`` or a token of ``stop``; the ids and the text."""
    import torch

    from storelab.commands._finite import check_logits
    from storelab.models.memory_terms import check_run_fits
    from storelab.models.model import pick, prefill
    from storelab.probes.source import placement

    if not ids:
        raise ValueError("prompt: encodes to no token")
    if max(ids) >= model.cfg.vocab_size:
        raise ValueError(f"prompt: token id {max(ids)} is outside the model's vocabulary of {model.cfg.vocab_size} "
                         f"(tokenizer.json does not belong to this checkpoint?)")
    if model.cfg.context and len(ids) + new_tokens > model.cfg.context:
        raise ValueError(f"prompt: {len(ids)} tokens + {new_tokens} new exceed {model.cfg.name}'s context of "
                         f"{model.cfg.context:,} tokens")
    check_run_fits(model.cfg, tokens=len(ids) + new_tokens, chunk=chunk or len(ids), option="--prompt, "
                   "--new-tokens", instead="give a shorter prompt or fewer tokens")
    gate_generation(model, prompt_len=len(ids), new_tokens=new_tokens, chunk=chunk, option="--prompt, --new-tokens",
                    instead="give a shorter prompt or fewer tokens (or give --chunk)")
    where = placement(model, next(model.parameters()).device)
    gen = torch.Generator(device=where["device"]).manual_seed(seed + 1)   # sampling draws where the logits are
    out, why = [], "length"
    with torch.no_grad():
        logits, cache = prefill(model, torch.tensor([ids], device=where["device"]), chunk=chunk)
        while len(out) < new_tokens:
            check_logits(logits, f"token {len(ids) + len(out)}")
            nxt = pick(logits.float(), temperature=temperature, top_k=top_k, generator=gen)
            if int(nxt) in stop:
                why = "eos"
                break
            out.append(int(nxt))
            if len(out) < new_tokens:
                step, cache = model(nxt, cache)
                logits = step[:, -1]
    return {"model": model.cfg.name, **where, "prompt_ids": ids, "tokens": out, "text": tok.decode(out), "stopped": why,
            "temperature": temperature, "seed": seed}


def register(app: typer.Typer) -> None:
    @app.command()
    def generate(
        model: str = typer.Argument(None, help="A zoo model name or model file (random weights), or a checkpoint: "
                                    "a folder, .gguf, config.json beside its safetensors, or a Hugging Face repo "
                                    "id org/name (or org/name@REV) in the local cache."),
        tiny: bool = typer.Option(False, "--tiny", help="Use the model's tiny version."),
        prompt_len: int = opt.integer(None, "--prompt-len", min=1, max=MAX_TOKENS,
                                      help="Random prompt length (default 32; not with --prompt)."),
        new_tokens: int = opt.integer(8, "--new-tokens", min=0, max=MAX_TOKENS, help="Tokens to generate."),
        chunk: int = opt.count(0, "--chunk", zero=True, help="Prefill chunk size (0: the whole prompt in one call)."),
        temperature: float = opt.number(0.0, "--temperature", min=0, help="0: greedy; > 0: sample."),
        top_k: int = opt.count(0, "--top-k", zero=True, help="Sample among the k most likely (0: all)."),
        seed: int = opt.seed(),
        config: Path = typer.Option(None, "--config", help="A model file (TOML or JSON) instead of a zoo name."),
        checkpoint: Path = typer.Option(None, "--checkpoint",
                                        help="A checkpoint folder (config.json + safetensors), or a Hugging Face "
                                        "repo id org/name (or org/name@REV) in the local cache: its weights."),
        json_: bool = typer.Option(False, "--json", help="Print one JSON document."),
        prompt: str = typer.Option(None, "--prompt", help="Text to continue (needs --checkpoint: its tokenizer.json); "
                                   "prints the generated text."),
        chat: bool = typer.Option(False, "--chat", help="With --prompt: wrap it in the folder's chat template."),
        offline: bool = typer.Option(False, "--offline", help="Hub repos from the local cache only (generate "
                                     "reads weights from the cache alone in any case)."),
        device: str = opt.device(),
        dtype: str = opt.dtype(),
        weights: str = typer.Option("auto", "--weights", help="Linear weights for CPU inference: fp32 (as loaded), "
                                    "bf16 or int8 (weight-only, a scale per output channel; activations fp32); auto: "
                                    "a checkpoint's own on the CPU (bf16 where it stores bf16, int8 where a GGUF "
                                    "stores quantized weights, else fp32), as loaded otherwise."),
    ) -> None:
        """Generate with random weights (or a checkpoint's); report the cache per store kind, measured
        beside analytic. With --prompt: text in, text out."""
        from rich.progress import Progress

        from storelab.allocator import keep_freed_memory
        from storelab.checkpoint.source import Source, checkpoint_weights, model_config, resolve, weights_path
        from storelab.models.config import load_model

        from storelab.commands._finite import check_weights
        from storelab.models.config import check_fits

        keep_freed_memory()   # a prefill's activations reused, not faulted in again each chunk (storelab.allocator)

        loaded = tok = None
        with opt.user_errors():
            if chat and prompt is None:
                raise ValueError("--chat: wraps a --prompt in the chat template; give --prompt TEXT")
            if prompt is not None and prompt_len is not None:
                raise ValueError(f"--prompt-len: sets the length of a random prompt; --prompt gives the text itself "
                                 f"(its length is its tokens'): give one of them, not {prompt_len} and a text")
            prompt_len = 32 if prompt_len is None else prompt_len
            if top_k and temperature == 0:
                raise ValueError(f"--top-k: {top_k} samples among the k most likely, but --temperature 0 decodes "
                                 f"greedily (the top-k changes nothing): give --temperature > 0, or leave --top-k out")
            if tiny and model is None:
                raise ValueError(f"--tiny: picks the tiny version of a zoo model; it does nothing to "
                                 f"{'--checkpoint' if checkpoint is not None else '--config'} (leave it out)")
            if (model is None) + (config is None) + (checkpoint is None) != 2:
                raise ValueError("model: give a zoo model name, a checkpoint, --config FILE or --checkpoint FOLDER "
                                 "(one of them)")
            if checkpoint is not None:   # a Hub repo id too: its snapshot in the Hugging Face cache
                checkpoint = checkpoint_weights(checkpoint, offline=offline)
            if model is not None:   # any model argument: a checkpoint's weights, or a model built at random
                src = resolve(model, tiny=tiny, offline=offline)
                if src.kind.is_checkpoint:
                    checkpoint = weights_path(src)
                elif src.kind is Source.MODEL_FILE:
                    config = src.path
                elif src.kind is not Source.ZOO:
                    weights_path(src)   # names what to do with it (a train run: export it)
            if prompt is not None and checkpoint is None:
                raise ValueError("--prompt: text needs a tokenizer: give a checkpoint (a folder with tokenizer.json, "
                                 "or a Hugging Face repo in the cache)")
            if prompt is not None:
                from storelab.text import Tokenizer

                tok = Tokenizer.load(checkpoint)           # before any weight is read
                ids = tok.chat([{"role": "user", "content": prompt}]) if chat else tok.encode(prompt)
            weights, weights_why = _weights_choice(weights, checkpoint, device, dtype)
            if checkpoint is not None:
                from storelab.checkpoint import load

                meta = load(checkpoint, device="meta", dtype=dtype)  # reads no weights
                check_fits(meta.cfg, what="--checkpoint", bytes_per_param=next(meta.parameters()).element_size(),
                           instead="generate with a smaller checkpoint")
                # random prompt: fp32 unless --dtype says otherwise; text: --dtype, else its own dtype (fp32 under
                # packed weights, whose activations are fp32)
                loaded = load(checkpoint, device=device,
                              dtype=dtype or ("fp32" if prompt is None or weights != "fp32" else None))
                check_weights(loaded, checkpoint)
                from storelab.models.quant import quantize_weights

                quantize_weights(loaded, weights)
                cfg = loaded.cfg
            else:
                cfg = load_model(config) if config is not None else model_config(src)
                check_fits(cfg, what="model" if model is not None else "--config",
                           instead="write a smaller model file" if config is not None
                           else f"run its tiny version (storelab generate {model} --tiny)")
        if weights_why and not json_:
            err_console.print(f"weights: {weights} ({weights_why})")
        if tok is not None:
            with opt.user_errors():
                res = generate_text(loaded, tok, ids, new_tokens=new_tokens, stop=eos_ids(checkpoint, tok),
                                    chunk=chunk, temperature=temperature, top_k=top_k, seed=seed)
            res.update(weights=weights, weights_from=weights_why)
            if json_:
                emit_json(res)
            else:
                typer.echo(res["text"])
            return
        with opt.user_errors():
            if json_:
                res = run_generation(cfg, prompt_len=prompt_len, new_tokens=new_tokens, chunk=chunk,
                                     temperature=temperature, top_k=top_k, seed=seed, model=loaded,
                                     device=device, dtype=dtype, weights=weights)
            else:
                with Progress(console=err_console, transient=True) as bar:
                    task = bar.add_task(f"{cfg.name}: prefill {prompt_len}, decode", total=new_tokens)
                    res = run_generation(cfg, prompt_len=prompt_len, new_tokens=new_tokens, chunk=chunk,
                                         temperature=temperature, top_k=top_k, seed=seed, model=loaded,
                                         device=device, dtype=dtype, weights=weights,
                                         progress=lambda n: bar.advance(task, n))
        res.update(weights=weights, weights_from=weights_why)
        if json_:
            emit_json(res)
            return
        console.print(f"{cfg.name}: generated {res['tokens']}")
        console.print(table(f"State after {prompt_len} + {new_tokens} tokens ({res['dtype']} on {res['device']})",
                            ["Store", "Measured bytes", "Analytic bytes", "equal"],
                            [[s["kind"], s["measured_bytes"], s["analytic_bytes"],
                              "yes" if s["measured_bytes"] == s["analytic_bytes"] else "NO"] for s in res["state"]]))
        if res["unshared_layers"]:
            console.print(f"note: layers {res['unshared_layers']} keep their own copy of a shared cache at run time "
                          "(their store cannot read another layer's state)")
