"""The probes on a model folder's text: its model (loaded or streamed), its tokenizer, the prompt sets.

A Hugging Face folder (config.json + safetensors + tokenizer.json) or a ``storelab save`` folder
runs the probes that read text (``TEXT_PROBES``) on the shipped prompt sets
(``storelab/probes/prompts/*.jsonl``) or on the user's records, encoded with the folder's
tokenizer.json (plain text, or ``chat``: each prompt as a user turn of the folder's chat
template). selection and mhc read the documents at ``contexts``. Used by ``storelab probe
--checkpoint`` and by the report's checkpoint section.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["TEXT_PROBES", "MODEL_FOLDERS", "DOCUMENT_CONTEXTS", "open_text_model", "text_records", "run_text_probes"]

TEXT_PROBES = ("state_swap", "keep_one", "forgetting", "selection", "mhc")
DOCUMENT_CONTEXTS = (1024,)  # selection and mhc on text without --contexts
MODEL_FOLDERS = ("hf", "save", "gguf")   # model checkpoints (checkpoint_kind): a folder, or a GGUF file


def open_text_model(folder: Path, *, stream: bool = False, device: str = "cpu", dtype=None):
    """(model, tokenizer) of a model folder on ``device`` in ``dtype`` (None: its own); the model checked to
    fit in memory before any weight is read, unless ``stream`` (each layer's weights read during its call:
    ``storelab.probes.source.open_model``)."""
    from storelab.checkpoint import load
    from storelab.models.config import check_fits
    from storelab.probes.source import open_model
    from storelab.text import Tokenizer

    tok = Tokenizer.load(folder)                 # a missing tokenizer is named before the weights are read
    if not stream:
        meta = load(folder, device="meta", dtype=dtype)
        check_fits(meta.cfg, what="--checkpoint", bytes_per_param=next(meta.parameters()).element_size(),
                   instead="probe it with --stream, or a smaller checkpoint")
    return open_model(folder, stream=stream, device=device, dtype=dtype), tok


def text_records(name: str, prompts: Path | None, records: list[dict] | None) -> list[dict]:
    """The records probe ``name`` reads: those of its kind in the user's file (``records``, read from
    ``prompts`` by ``load_records``), or the shipped ones."""
    from storelab.probes.prompts import records_of, shipped

    kind = {"state_swap": "swap", "keep_one": "keep_one", "forgetting": "document", "selection": "document",
            "mhc": "document"}[name]
    if records is None:
        return shipped(kind)
    return records_of(records, kind, prompts)


def run_text_probes(model, tok, names: list[str], *, prompts: Path | None, records: list[dict] | None, n: int,
                    chat: bool, explicit: bool, position: int = -2, decode: bool = False,
                    contexts: list[int] | None = None, topk: list[int] = (1,), queries: int = 64
                    ) -> tuple[dict, dict]:
    """(results, skipped) of the text probes in ``names``; a probe that cannot run is skipped with its
    reason, or (``explicit``: the user asked for that one) raises. selection and mhc read the documents
    (the shipped ones or the user's), encoded with the folder's tokenizer, at ``contexts`` (default
    ``DOCUMENT_CONTEXTS``): the documents laid end to end to each length."""
    from storelab.probes import DOCUMENT_PROBES
    from storelab.probes.text import text_forgetting, text_keep_one, text_state_swap

    def on_documents(nm: str):
        def run_docs(recs: list[dict]) -> dict:
            docs = [tok.encode(r["text"]) for r in recs]
            return DOCUMENT_PROBES[nm](model, docs, contexts=list(contexts or DOCUMENT_CONTEXTS), topk=list(topk),
                                       queries=queries, n=n)
        return run_docs

    run = {"state_swap": lambda r: text_state_swap(model, tok, r, n=n, chat=chat, position=position, decode=decode),
           "keep_one": lambda r: text_keep_one(model, tok, r, n=n, chat=chat),
           "forgetting": lambda r: text_forgetting(model, tok, r, n=n),
           **{nm: on_documents(nm) for nm in DOCUMENT_PROBES}}
    results, skipped = {}, {}
    for nm in names:
        try:
            if nm not in run:
                raise ValueError(f"name: {nm} runs on a train run's synthetic task, not on text "
                                 f"(on a model folder: {', '.join(TEXT_PROBES)})")
            results[nm] = run[nm](text_records(nm, prompts, records))
        except ValueError as e:
            if explicit:
                raise
            skipped[nm] = str(e)
    return results, skipped
