"""Prompt sets for the probes on text: JSON Lines, one record an object, shipped in ``prompts/``.

A record's ``kind`` says which probe reads it (a record without ``kind`` is a document):

``swap`` (state_swap, after Lee et al., arXiv 2609.33093)::

    {"kind": "swap", "id": "swap-00", "prompt_a": "...Laura looks after the",
     "prompt_b": "<prompt_a with only the asked value changed>", "answer_a": " cow", "answer_b": " wolf"}

  The two prompts must differ only in the value the question asks for, so that they tokenize to
  the same length (a position-aligned swap; pairs that do not are skipped and counted). The
  answers are continuations of the prompt text, with the leading space they need; the first token
  of each is what the logit difference uses. Optional ``facts`` (an int) is reported per example.

``keep_one`` (keep_one, after Afendulev et al., arXiv 2609.04434)::

    {"kind": "keep_one", "task": "language", "id": "language-01", "prompt": "...Answer:",
     "retrieval": [" yellow", " jaune", " gelb"], "compliance": [" rot", " blau", " gelb"],
     "paired": {"prompt": "...", "retrieval": [...], "compliance": [...]}}

  ``task`` is ``dictionary``, ``language`` or ``persona``. ``retrieval``: the right value in any
  language; ``compliance``: words that mark the requested language or persona. Each is a list of
  candidate answers (either may be empty: not scored); the model's most likely next token counts as
  a hit when it is the first token of a candidate. ``paired`` (optional): a prompt of the same token
  length with other values and another language or persona, for the paired swap.

``document`` (forgetting's inputs; the form of ``prompts/documents.jsonl``)::

    {"id": "bread", "text": "Baking bread at home is ..."}

``load_records(path)`` validates a file: a line that is not a JSON object, or a field of the wrong
type, is a ``ValueError`` naming the file, the line and the field. ``shipped(kind)`` returns the
records the package ships for a kind; ``records_of(records, kind, path)`` those of one kind (an
error naming the file when it holds none).
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["KINDS", "FOLDER", "load_records", "shipped", "records_of", "encode_prompt", "first_token"]

FOLDER = Path(__file__).parent / "prompts"
SHIPPED = {"swap": "swap.jsonl", "keep_one": "keep_one.jsonl", "document": "documents.jsonl"}
TASKS = ("dictionary", "language", "persona")

# per kind: required fields (name -> type) and optional ones
KINDS: dict[str, tuple[dict[str, type], dict[str, type]]] = {
    "swap": ({"id": str, "prompt_a": str, "prompt_b": str, "answer_a": str, "answer_b": str}, {"facts": int}),
    "keep_one": ({"id": str, "task": str, "prompt": str, "retrieval": list, "compliance": list}, {"paired": dict}),
    "document": ({"id": str, "text": str}, {}),
}


def _check_fields(rec: dict, need: dict, opt: dict, where: str) -> None:
    for k, typ in need.items():
        if k not in rec:
            raise ValueError(f"{where}: {k}: missing")
    for k, typ in {**need, **opt}.items():
        v = rec.get(k)
        if k in rec and (not isinstance(v, typ) or isinstance(v, bool)):
            raise ValueError(f"{where}: {k}: expected {typ.__name__}, got {type(v).__name__}")
        if typ is str and k in rec and not v.strip() and k != "id":
            raise ValueError(f"{where}: {k}: empty")
        if typ is list and k in rec and not all(isinstance(x, str) and x.strip() for x in v):
            raise ValueError(f"{where}: {k}: expected a list of non-empty strings")


def _check(rec: dict, where: str) -> dict:
    kind = rec.get("kind", "document")
    if kind not in KINDS:
        raise ValueError(f"{where}: kind: one of {', '.join(KINDS)}, got {kind!r}")
    need, opt = KINDS[kind]
    _check_fields(rec, need, opt, where)
    if kind == "swap" and rec["answer_a"] == rec["answer_b"]:
        raise ValueError(f"{where}: answer_b: equals answer_a (the pair must differ in the asked value)")
    if kind == "keep_one":
        if rec["task"] not in TASKS:
            raise ValueError(f"{where}: task: one of {', '.join(TASKS)}, got {rec['task']!r}")
        if not rec["retrieval"] and not rec["compliance"]:
            raise ValueError(f"{where}: retrieval, compliance: give candidates for at least one")
        if "paired" in rec:
            _check_fields(rec["paired"], {"prompt": str, "retrieval": list, "compliance": list}, {},
                          f"{where}: paired")
    return {**rec, "kind": kind}


def load_records(path: str | Path) -> list[dict]:
    """The records of a JSON Lines file, each checked (blank lines skipped)."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise ValueError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read it as UTF-8 text ({e})") from None
    out, seen = [], set()
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}: line {n}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}: not valid JSON ({e.msg})") from None
        if not isinstance(rec, dict):
            raise ValueError(f"{where}: expected a JSON object, got {type(rec).__name__}")
        rec = _check(rec, where)
        if (rec["kind"], rec["id"]) in seen:
            raise ValueError(f"{where}: id: {rec['id']!r} appears twice")
        seen.add((rec["kind"], rec["id"]))
        out.append(rec)
    if not out:
        raise ValueError(f"{path}: no records (one JSON object per line)")
    return out


def shipped(kind: str) -> list[dict]:
    """The records the package ships for ``kind`` (swap, keep_one, document)."""
    return load_records(FOLDER / SHIPPED[kind])


def records_of(records: list[dict], kind: str, path: str | Path) -> list[dict]:
    """The records of ``kind``; a ValueError naming ``path`` when there are none."""
    out = [r for r in records if r["kind"] == kind]
    if not out:
        raise ValueError(f"{path}: no records of kind {kind!r} (this probe reads those; see storelab.probes.prompts)")
    return out


# -- text -> ids ------------------------------------------------------------------------------
def _prefix_text(tok, prompt: str, chat: bool) -> str:
    return tok.render([{"role": "user", "content": prompt}]) if chat else prompt


def encode_prompt(tok, prompt: str, *, chat: bool = False) -> list[int]:
    """The prompt's ids: as plain text, or (``chat``) as a user turn of the folder's chat template."""
    return tok.chat([{"role": "user", "content": prompt}]) if chat else tok.encode(prompt)


def first_token(tok, prompt: str, answer: str, *, chat: bool = False) -> int:
    """The id of the first token ``answer`` adds after ``prompt``: the prompt and answer encoded together,
    when the prompt's own ids are a prefix of them; else the answer alone. After a chat template's
    generation prompt the answer starts the turn, so its leading spaces are dropped."""
    if chat:
        answer = answer.lstrip()
    text = _prefix_text(tok, prompt, chat)
    special = not chat
    head = tok.encode(text, special=special)
    both = tok.encode(text + answer, special=special)
    if len(both) > len(head) and both[:len(head)] == head:
        return both[len(head)]
    alone = tok.encode(answer, special=False)
    if not alone:
        raise ValueError(f"answer: {answer!r} encodes to no token")
    return alone[0]
