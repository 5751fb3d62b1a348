"""Probe tasks a small real language model does: seeded generators of text prompt pairs.

Every generator returns *pairs*: two prompts that differ in one stored value, the one the question
asks for, as ``storelab.probes.prompts``'s swap records (``prompt_a``, ``prompt_b``, ``answer_a``,
``answer_b``) plus what the probes group by (``task``, ``keys``, ``entries``, ``distance``). The same
``seed`` gives the same prompts, so sizes scale without changing what a smaller run saw.

Tasks (a worked example of each, values two-digit numbers whose first digit is the scored token)::

    list        kovi: 47            prose       The number of kovi is 47. The number of
                tamu: 52                        tamu is 52. ... The number of kovi is 4
                ...
                kovi: 4
    copy        kovi tamu resa bilo ... kovi tamu resa        (induction: the next word is bilo)

The question ends where the value's first digit starts (``"kovi: "``: both tokenizers here write a
number as a space token then one token per digit, so the scored token is the first digit, one of 9).
Keys are ``random`` (pseudo-words of two syllables, distinct) or ``near`` (near-duplicates: one stem
and a three-digit suffix, ``kovi-417``, ``kovi-471``, ...: no sharpening separates them; essay section 3).

``distance``: a question asked ``distance`` tokens after its fact (``count`` says how many tokens a
text is, the model's tokenizer): after the asked entry come other entries until the question is that
far away (inside or beyond a 512-token window). The other generators ask a uniformly drawn entry.
"""

from __future__ import annotations

import random
from typing import Callable

__all__ = ["FORMATS", "KEYS", "VALUE_CHANCE", "dictionary_pairs", "distance_pairs", "copy_pairs", "pairs_of"]

FORMATS = ("list", "prose")
KEYS = ("random", "near")
VALUE_CHANCE = 1 / 9   # the scored token is a value's first digit, 1 to 9
_C, _V = "bdfgklmnprstvz", "aeiou"


def _word(r: random.Random) -> str:
    return "".join(r.choice(_C) + r.choice(_V) for _ in range(2))


def _keys(r: random.Random, n: int, keys: str) -> list[str]:
    if keys not in KEYS:
        raise ValueError(f"keys: one of {', '.join(KEYS)}, got {keys!r}")
    if keys == "near" and n > 900:
        raise ValueError(f"entries: near-duplicate keys have 900 suffixes (100-999), asked for {n}")
    out: list[str] = []
    stem = _word(r)
    while len(out) < n:
        k = _word(r) if keys == "random" else f"{stem}-{r.randint(100, 999)}"
        if k not in out:
            out.append(k)
    return out


def _entry(fmt: str, k: str, v: int) -> str:
    if fmt == "list":
        return f"{k}: {v}\n"
    if fmt == "prose":
        return f"The number of {k} is {v}. "
    raise ValueError(f"format: one of {', '.join(FORMATS)}, got {fmt!r}")


def _question(fmt: str, k: str) -> str:
    return f"{k}: " if fmt == "list" else f"The number of {k} is "


def _other_value(r: random.Random, v: int) -> int:
    """A value whose first digit differs from ``v``'s (the scored tokens of a and b differ)."""
    while True:
        w = r.randint(10, 99)
        if str(w)[0] != str(v)[0]:
            return w


def _pair(fmt: str, keys: list[str], vals: list[int], q: int, r: random.Random, **meta) -> dict:
    vb = list(vals)
    vb[q] = _other_value(r, vals[q])
    head = "".join(_entry(fmt, k, v) for k, v in zip(keys, vals))
    head_b = "".join(_entry(fmt, k, v) for k, v in zip(keys, vb))
    ask = _question(fmt, keys[q])
    return {"prompt_a": head + ask, "prompt_b": head_b + ask, "answer_a": str(vals[q])[0],
            "answer_b": str(vb[q])[0], "format": fmt, "entries": len(keys), **meta}


def dictionary_pairs(n: int, *, entries: int, fmt: str = "list", keys: str = "random", seed: int = 0) -> list[dict]:
    """``n`` pairs of dictionaries of ``entries`` entries, a uniformly drawn one asked."""
    out = []
    for i in range(n):
        r = random.Random(f"dict-{seed}-{i}-{entries}-{fmt}-{keys}")
        ks = _keys(r, entries, keys)
        vals = [r.randint(10, 99) for _ in ks]
        out.append({"id": f"dict-{fmt}-{keys}-{entries}-s{seed}-{i}", "task": fmt, "keys": keys,
                    **_pair(fmt, ks, vals, r.randrange(entries), r, seed=seed)})
    return out


def distance_pairs(n: int, *, distance: int, count: Callable[[str], int], fmt: str = "list", keys: str = "random",
                   before: int = 4, seed: int = 0) -> list[dict]:
    """``n`` pairs whose asked fact lies ``distance`` tokens (at least; ``count`` measures) before the
    question's end: ``before`` entries, the asked one, then entries until the question is that far."""
    out = []
    for i in range(n):
        r = random.Random(f"dist-{seed}-{i}-{distance}-{fmt}-{keys}")
        pool = _keys(r, 400, keys)
        ks = pool[:before + 1]
        vals = [r.randint(10, 99) for _ in ks]
        q = before
        tail = ""
        j = len(ks)
        while count(_entry(fmt, ks[q], vals[q]) + tail + _question(fmt, ks[q])) < distance:
            if j >= len(pool):
                raise ValueError(f"distance: {distance} tokens needs more entries than {len(pool)} keys")
            ks.append(pool[j])
            vals.append(r.randint(10, 99))
            tail += _entry(fmt, ks[-1], vals[-1])
            j += 1
        got = count(_entry(fmt, ks[q], vals[q]) + tail + _question(fmt, ks[q]))
        out.append({"id": f"dist-{fmt}-{keys}-{distance}-s{seed}-{i}", "task": fmt, "keys": keys,
                    **_pair(fmt, ks, vals, q, r, seed=seed, distance=got, asked_distance=distance)})
    return out


def copy_pairs(n: int, *, words: int = 12, seed: int = 0) -> list[dict]:
    """Induction: a run of ``words`` pseudo-words, then its start again; the next word is asked. B changes
    that word in the first run."""
    out = []
    for i in range(n):
        r = random.Random(f"copy-{seed}-{i}-{words}")
        ws = _keys(r, words, "random")
        cut = r.randrange(2, words - 1)
        other = ws[cut]
        while other[0] == ws[cut][0] or other in ws:   # b's scored token differs from a's
            other = _word(r)
        wb = list(ws)
        wb[cut] = other
        tail = " ".join(ws[:cut])
        out.append({"id": f"copy-{words}-s{seed}-{i}", "task": "copy", "keys": "random", "entries": words,
                    "prompt_a": " ".join(ws) + ". " + tail, "prompt_b": " ".join(wb) + ". " + tail,
                    "answer_a": " " + ws[cut], "answer_b": " " + other, "format": "copy", "seed": seed})
    return out


def pairs_of(task: str, n: int, *, entries: int = 8, keys: str = "random", seed: int = 0) -> list[dict]:
    """One of the tasks by name: ``list``, ``prose`` (dictionaries) or ``copy``."""
    if task == "copy":
        return copy_pairs(n, words=max(entries, 4), seed=seed)
    return dictionary_pairs(n, entries=entries, fmt=task, keys=keys, seed=seed)
