"""``storelab probe NAME --checkpoint DIR``: what a trained model keeps in each store.

Probes: state_swap, keep_one, forgetting, mhc, selection (see ``storelab.probes``), or
``all`` for every probe that applies to the model. The essay's figures for the large
models are printed beside ours, as context: tiny models on synthetic tasks need not match.

The model is the second positional argument, any model argument (``storelab.checkpoint.source.resolve``):
``storelab probe all ./run``, ``storelab probe state_swap Qwen/Qwen3.5-0.8B``, ``storelab probe all
tiny-kimi-k3``. A train run folder, a model folder or a Hugging Face repo id ``org/name[@revision]`` whose
weights are in the local cache (the probes read only the cache: a repo not there is an error saying ``hf
download org/name``) is read as ``--checkpoint``; a zoo name (``tiny-NAME`` or ``NAME.tiny``), a model
file or a built-in stack (``hybrid``, ``pattern:KKKA``) as ``--model``, untrained. The options
``--checkpoint DIR`` and ``--model NAME`` work as before.

``--checkpoint`` takes a ``storelab train`` run folder (the probes run on its task) or a model
folder, Hugging Face or ``storelab save``: the probes run on text (``storelab.probes.on_folder``),
or on a synthetic ``--task`` when one is given. ``--stream`` reads a model folder's weights layer by
layer during each call (``storelab.checkpoint.stream``: checkpoints larger than memory);
``forgetting --weights-only`` reads only the gate tensors (``storelab.probes.gate_weights``).
``--out DIR`` writes probe.json and a figure per probe.
"""

from __future__ import annotations

from pathlib import Path

import typer

from storelab import options as opt
from storelab.commands._finite import check_weights, invalid_fields
from storelab.commands._probe_text import OUT_FILES, write_out
from storelab.console import console, emit_json, table
from storelab.models.memory_terms import check_run_fits
from storelab.outputs import KINDS, check_folder
from storelab.probes.on_folder import MODEL_FOLDERS, open_text_model, run_text_probes
from storelab.probes.source import checkpoint_kind
from storelab.probes.prompts import load_records
from storelab.probes.source import on_device, open_model, placement
from storelab.report.probe_rows import probe_rows


def register(app: typer.Typer) -> None:
    @app.command()
    def probe(
        name: str = typer.Argument(..., help="state_swap, keep_one, forgetting, mhc, selection, or all."),
        target: str = typer.Argument(None, metavar="MODEL", help="The model: a train run or model folder, a "
                                     "Hugging Face repo id org/name (or org/name@REV) in the local cache (as "
                                     "--checkpoint), or a zoo name, model file or built-in stack (as --model)."),
        checkpoint: Path = typer.Option(None, "--checkpoint", help="A run folder written by storelab train --out, "
                                        "or a model folder (Hugging Face or storelab save: probes on text), or a "
                                        "Hugging Face repo id org/name (or org/name@REV) in the local cache."),
        model: str = typer.Option(None, "--model", help="Instead of a checkpoint: an untrained model "
                                  "(tiny-<zoo name> or a built-in stack), for a look at the machinery."),
        task: str = typer.Option(None, "--task", help="Probe on this task instead of the checkpoint's."),
        size: str = typer.Option("tiny", "--size", help="Size preset of --task."),
        n: int = opt.count(None, "--n", help="Examples (documents) per probe (default 64; selection on a "
                           "checkpoint's text reads every document and takes none)."),
        seed: int = opt.seed(1234),
        contexts: str = opt.int_list(None, "--contexts", help="Probe on documents at these context lengths "
                                     "(e.g. 512,1024,4096): selection sweeps them, mhc uses the first."),
        topk: str = opt.int_list("1", "--topk", help="selection: top-k multipliers (the layer reads m * k)."),
        queries: int = opt.count(64, "--queries", help="selection: query positions measured (the last ones)."),
        json_: bool = typer.Option(False, "--json", help="Print one JSON document."),
        # probes on text (a model folder); see storelab.commands._probe_text
        prompts: Path = typer.Option(None, "--prompts", help="A JSONL file of your own prompts (model folders; "
                                     "format in storelab.probes.prompts). Default: the shipped sets."),
        chat: bool = typer.Option(False, "--chat", help="Wrap each prompt in the folder's chat template."),
        out: Path = typer.Option(None, "--out", help="Write probe.json and a figure per probe into this folder."),
        force: bool = opt.force(),
        position: int = typer.Option(None, "--position", help="state_swap on text: swap the states after this "
                                     "token (0-based; negative from the prompt's end; default -2)."),
        decode: bool = typer.Option(False, "--decode", help="state_swap on text: run the tokens after the swap "
                                    "one per call, as decoding."),
        stream: bool = typer.Option(False, "--stream", help="With a model folder: read each layer's weights from "
                                    "the shards during its call, then let them go (checkpoints larger than "
                                    "memory; the same results)."),
        weights_only: bool = typer.Option(False, "--weights-only", help="forgetting only: the gates' half-lives "
                                          "at x = 0 and the KDA channel-fade estimate, from the gate tensors of a "
                                          "model folder alone (megabytes read, no model built)."),
        offline: bool = typer.Option(False, "--offline", help="Hub repos from the local cache only (the probes "
                                     "read weights from the cache alone in any case)."),
        device: str = opt.device(),
        dtype: str = opt.dtype(),
    ) -> None:
        """Run a probe on a trained model; print its figures beside the essay's."""
        import torch

        from storelab.allocator import keep_freed_memory
        from storelab.checkpoint.loader import resolve_dtype
        from storelab.models.model import Model
        from storelab.probes import DOCUMENT_PROBES, PROBES
        from storelab.tasks import make_task
        from storelab.train.loop import load_trained
        from storelab.train.models import resolve_model

        from storelab.models.config import check_fits

        keep_freed_memory()   # a prefill's activations reused, not faulted in again each chunk (storelab.allocator)
        with opt.user_errors():
            if target is not None:
                if checkpoint is not None or model is not None:
                    raise ValueError(f"model: {target!r} and {'--checkpoint' if checkpoint is not None else '--model'}"
                                     f": give the model once")
                checkpoint, model = probe_target(target, offline=offline)
            elif checkpoint is not None:   # a Hub repo id too: its snapshot in the Hugging Face cache
                from storelab.checkpoint.source import checkpoint_weights

                checkpoint = checkpoint_weights(checkpoint, offline=offline)
            if weights_only:
                from storelab.commands._probe_weights import weights_only as run_weights_only

                if device != "cpu" or dtype is not None:   # the gates are read as stored, on the CPU
                    raise ValueError(f"{'--device' if device != 'cpu' else '--dtype'}: --weights-only builds no "
                                     "model (it reads the gate tensors as stored); leave it out")

                return run_weights_only(name, checkpoint, json_=json_, out=out, force=force)
            names = list(PROBES) if name == "all" else [name]
            for nm in names:
                if nm not in PROBES:
                    raise ValueError(f"name: unknown probe {nm!r} (known: {', '.join(PROBES)}, all)")
            if (checkpoint is None) == (model is None):
                raise ValueError("checkpoint: give exactly one of --checkpoint DIR or --model NAME")
            kind = checkpoint_kind(checkpoint) if checkpoint is not None else None
            if checkpoint is not None and kind is None:
                raise ValueError(f"checkpoint: {checkpoint} does not exist")
            if kind is not None and kind != "run" and kind not in MODEL_FOLDERS:
                raise ValueError(f"checkpoint: {checkpoint} is {KINDS.get(kind, 'no model folder (' + kind + ')')}; "
                                 f"give a storelab train run folder or a model folder (config.json, *.safetensors, "
                                 f"tokenizer.json)")
            text = kind in MODEL_FOLDERS and task is None   # a model folder with --task: probed on the task
            if (position is not None or decode) and not (text and name in ("state_swap", "all")):
                opt_name = "--position" if position is not None else "--decode"
                raise ValueError(f"{opt_name}: sets where state_swap on text swaps (a model checkpoint's prompts); "
                                 f"it does nothing to {name if name != 'state_swap' else 'state_swap on a task'}: "
                                 f"leave it out")
            position = -2 if position is None else position
            if n is not None and text and name == "selection":
                raise ValueError("--n: selection on a checkpoint's text reads every document, laid end to end at "
                                 "each --contexts length; it takes no example count: leave it out")
            n = 64 if n is None else n
            if stream and kind not in MODEL_FOLDERS:
                raise ValueError("stream: --stream reads a model folder (config.json + safetensors) given as "
                                 "--checkpoint DIR")
            if (prompts is not None or chat) and not text:
                raise ValueError(f"{'--prompts' if prompts is not None else '--chat'}: prompts on text need a model "
                                 f"folder (Hugging Face or storelab save) as --checkpoint")
            if prompts is not None and not prompts.is_file():
                raise ValueError(f"--prompts: {prompts} is not a file")
            records = load_records(prompts) if prompts is not None else None   # checked before the model loads
            if out is not None:
                check_folder(out, "probe", OUT_FILES, force=force, inputs=(checkpoint, prompts))
            if text:
                net, t = open_text_model(checkpoint, stream=stream, device=device, dtype=dtype)
            elif kind in MODEL_FOLDERS:
                t = make_task(task, size)
                net = open_model(checkpoint, stream=stream, device=device, dtype=dtype)
                if t.vocab_size > net.cfg.vocab_size:
                    raise ValueError(f"task: {t.NAME} ({size}) has vocabulary {t.vocab_size}, more than the "
                                     f"model's {net.cfg.vocab_size}")
            elif checkpoint is not None:
                net, t, _ = load_trained(checkpoint, device=device, dtype=dtype)
                on_device(net, device)
                if task is not None:
                    t = make_task(task, size)
                    if t.vocab_size != net.cfg.vocab_size:
                        raise ValueError(f"task: {task} ({size}) has vocabulary {t.vocab_size}, the model "
                                         f"{net.cfg.vocab_size}")
            else:
                t = make_task(task or "dictionary", size)
                mcfg = resolve_model(model, t.vocab_size)
                check_fits(mcfg, what="--model", instead=f"probe its tiny version (--model tiny-{model})")
                torch.manual_seed(seed)
                net = on_device(Model(mcfg).eval().to(device=device, dtype=resolve_dtype(dtype or "fp32", {})),
                                device)
            check_weights(net, checkpoint if checkpoint is not None else model)  # NaN weights: no figure
            if contexts:  # documents prefilled in chunks of 1,024: the cache at the longest is what is held
                check_run_fits(net.cfg, tokens=max(contexts), chunk=1024, option="--contexts",
                               instead="give shorter contexts")
        docs = None if contexts is None or text else [row.tolist() for row in t.sample(n, seed).inputs]
        results, skipped = {}, {}
        if text:
            with opt.user_errors():
                results, skipped = run_text_probes(net, t, names, prompts=prompts, records=records, n=n,
                                                   chat=chat, explicit=name != "all", position=position,
                                                   decode=decode, contexts=contexts, topk=topk, queries=queries)
        for nm in [] if text else names:
            try:
                if docs is not None and nm in DOCUMENT_PROBES:
                    results[nm] = DOCUMENT_PROBES[nm](net, docs, contexts=contexts, topk=topk, queries=queries, n=n)
                else:
                    results[nm] = PROBES[nm](net, t, n=n, seed=seed)
            except ValueError as e:
                if name != "all":
                    opt.fail(str(e))
                skipped[nm] = str(e)
        for nm in [nm for nm, r in results.items() if invalid_fields(r)]:  # activations that overflowed
            why = f"invalid: non-finite values in {', '.join(invalid_fields(results.pop(nm))[:4])}"
            if name != "all":
                opt.fail(f"{nm}: {why}")
            skipped[nm] = why
        on = f"text ({prompts or 'shipped prompts'})" if text else t.NAME
        doc = {"model": net.cfg.name, "task": on, **placement(net, device), "results": results, "skipped": skipped}
        if out is not None:
            with opt.user_errors():
                written = write_out(out, doc, results)
        if json_:
            emit_json(doc)
            return
        for nm, r in results.items():
            console.print(table(f"probe {nm}: {net.cfg.name} on {on} (essay: {r['essay']['source']})",
                                ["figure", "ours", "essay (large models)"], probe_rows(nm, r)))
        for nm, why in skipped.items():
            console.print(f"probe {nm}: skipped ({why})")
        if out is not None:
            console.print(f"wrote {', '.join(written)} into {out}")


def probe_target(text: str, *, offline: bool = False) -> tuple[Path | None, str | None]:
    """The positional model as (``--checkpoint``, ``--model``): a built-in stack, a zoo model or a model file
    is built untrained (``--model``); a run folder, or a checkpoint's weights (local only), is read."""
    from storelab.checkpoint.source import Source, resolve, weights_path
    from storelab.train.models import BUILTIN

    if text in BUILTIN or text.startswith("pattern:"):
        return None, text
    src = resolve(text, offline=offline)
    if src.kind is Source.ZOO:
        return None, f"tiny-{src.zoo}" if src.tiny else src.zoo
    if src.kind is Source.MODEL_FILE:
        return None, str(src.path)
    if src.kind is Source.RUN:
        return src.path, None
    return weights_path(src), None
