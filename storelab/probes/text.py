"""The probes on text: a real checkpoint, its tokenizer, and prompt sets (``storelab.probes.prompts``).

``text_state_swap(model, tok, records)`` (Lee et al., arXiv 2609.33093). Each pair of prompts
differs only in the asked value; both run to ``t = T - 2`` (all but the question's last token),
and the base (prompt A) continues with its last token from a patched cache (``storelab.probes.patch``):
all recurrent states from prompt B, all caches from prompt B, or one layer at a time. The answer's
shift is ``ld = logit[b] - logit[a]`` at the last token, a and b the first tokens of the two
answers; fractions are ``(ld_patched - ld_A) / (ld_B - ld_A)`` over the pooled means.

``text_keep_one(model, tok, records)`` (Afendulev et al., arXiv 2609.04434). After the prompt
(to ``T - 2``), keep only the caches (recurrent states emptied) or only the recurrent states
(caches emptied), and read the most likely next token: a retrieval hit when it starts a retrieval
candidate (the right value, in any language), a compliance hit when it starts a compliance
candidate (the requested language's words, the persona's marker). Items with ``paired`` also
run the paired swap: prompt 1's caches with prompt 2's recurrent states.

``text_forgetting(model, tok, documents)``: the recurrent heads' half-lives (``forgetting``) on
the documents, each cut to the shortest one's token count (at most ``max_tokens``) so that they
run as one batch.

Each returns a dict with the same figures as the synthetic probes (``storelab.probes.swap``), checked
as they are (``storelab.probes.validity``: the clean answers above chance, a uniform guess over the
vocabulary, or over it the candidates' share for keep_one; fractions None otherwise), and
per layer / per head / per example detail; prompts whose pair does not align (other token
lengths) or whose two answers start with the same token are skipped and counted.
"""

from __future__ import annotations

import torch

from storelab.probes.common import cache_layers, discard_states, group_by_length, mix_states, recurrent_layers
from storelab.probes.forgetting import forgetting
from storelab.probes.patch import Swap, continue_from, logit_diff, patched_logits, run_to, swap_fraction
from storelab.probes.prompts import encode_prompt, first_token
from storelab.probes.swap import ESSAY_KEEP, ESSAY_SWAP, keep_checks, mask_keep
from storelab.probes.validity import all_of, learned, swap_effect

__all__ = ["text_state_swap", "text_keep_one", "text_forgetting"]


def _count(skipped: dict, why: str) -> None:
    skipped[why] = skipped.get(why, 0) + 1


def _check_vocab(model, ids: list[int], where: str) -> None:
    if ids and max(ids) >= model.cfg.vocab_size:
        raise ValueError(f"{where}: token id {max(ids)} is outside the model's vocabulary of {model.cfg.vocab_size} "
                         f"(tokenizer.json does not belong to this checkpoint?)")


@torch.no_grad()
def text_state_swap(model, tok, records: list[dict], *, n: int = 64, chat: bool = False, position: int = -2,
                    decode: bool = False) -> dict:
    """Fraction of the answer's shift moved by all recurrent states, all caches, and each layer alone.

    ``position``: the token after which the states are swapped, 0-based from the prompt's start, or
    from its end when negative (-2, the default: the second-to-last, so the answer's token reads the
    patched stores at once). A swap before the differing fact measures what the stores carry of the
    prompt's earlier part (nothing of the asked value). ``decode``: the tokens after the swap run one
    per call, as decoding does, rather than as one prefill call."""
    model.eval()
    R, C = recurrent_layers(model), cache_layers(model)
    skipped: dict[str, int] = {}
    items = []
    for rec in records[:n]:
        ia, ib = encode_prompt(tok, rec["prompt_a"], chat=chat), encode_prompt(tok, rec["prompt_b"], chat=chat)
        if len(ia) != len(ib):
            _count(skipped, "prompts of other token lengths")
            continue
        if len(ia) < 2:
            _count(skipped, "prompt of one token")
            continue
        a = first_token(tok, rec["prompt_a"], rec["answer_a"], chat=chat)
        b = first_token(tok, rec["prompt_b"], rec["answer_b"], chat=chat)
        if a == b:
            _count(skipped, "answers starting with the same token")
            continue
        _check_vocab(model, ia + ib + [a, b], f"prompt {rec['id']}")
        items.append({"id": rec["id"], "facts": rec.get("facts"), "ia": ia, "ib": ib, "a": a, "b": b})
    if not items:
        raise ValueError(f"prompts: no usable swap pair (skipped: {skipped or 'none given'})")
    names = ("clean", "corrupt", "recurrent", "cache")
    sums = {k: 0.0 for k in names}
    layer_sums = [0.0] * model.cfg.n_layers
    flips = {"recurrent": 0, "cache": 0}
    eligible = correct = 0
    per_example = []
    for _, idx in sorted(group_by_length([torch.tensor(x["ia"]) for x in items]).items()):
        grp = [items[i] for i in idx]
        A = torch.tensor([x["ia"] for x in grp])
        B = torch.tensor([x["ib"] for x in grp])
        a, b = torch.tensor([x["a"] for x in grp]), torch.tensor([x["b"] for x in grp])
        T = A.shape[1]
        t = position if position >= 0 else T + position
        if not 0 <= t <= T - 2:
            raise ValueError(f"position: {position} is outside the prompts of {T} tokens (the swap needs a token "
                             f"after it: 0 to {T - 2}, or -{T} to -2 from the end)")
        pl = t + 1 if decode else None
        ca, cb = run_to(model, A, t), run_to(model, B, t)
        logits = {"clean": continue_from(model, A, ca, t, prompt_len=pl)[:, -1],
                  "corrupt": continue_from(model, B, cb, t, prompt_len=pl)[:, -1]}
        for k, layers in (("recurrent", R), ("cache", C)):
            logits[k] = (patched_logits(model, A, B, Swap(t, tuple(layers)), base_cache=ca, donor_cache=cb,
                                        prompt_len=pl)[:, -1] if layers else logits["clean"])
        ld = {k: logit_diff(v, a, b) for k, v in logits.items()}
        for k in names:
            sums[k] += float(ld[k].sum())
        for i in range(model.cfg.n_layers):
            lg = patched_logits(model, A, B, Swap(t, (i,)), base_cache=ca, donor_cache=cb, prompt_len=pl)[:, -1]
            layer_sums[i] += float(logit_diff(lg, a, b).sum())
        top = {k: v.argmax(-1) for k, v in logits.items()}
        ok = (top["clean"] == a) & (top["corrupt"] == b)
        eligible += int(ok.sum())
        correct += int((top["clean"] == a).sum())
        for k in flips:
            flips[k] += int((ok & (top[k] == b)).sum())
        for j, x in enumerate(grp):
            per_example.append({"id": x["id"], "tokens": int(A.shape[1]), "facts": x["facts"],
                                "correct": bool(top["clean"][j] == a[j]),
                                "ld": {k: float(ld[k][j]) for k in names}})
    total = len(items)
    mean = {k: v / total for k, v in sums.items()}
    ld_a, ld_b = torch.tensor([mean["clean"]]), torch.tensor([mean["corrupt"]])
    chance = 1 / model.cfg.vocab_size   # a uniform guess over the vocabulary
    check = swap_effect(correct / total, chance, mean["corrupt"] - mean["clean"])

    def frac(ld: float) -> float | None:
        return check.keep(swap_fraction(torch.tensor([ld]), ld_a, ld_b))

    per_layer = [{"layer": i, "kind": model.cfg.layers[i].token.KIND,
                  "store": "recurrent" if i in R else "cache", "logit_diff": s / total,
                  "fraction": frac(s / total)} for i, s in enumerate(layer_sums)]
    return check.stamp({
        "probe": "state_swap", "input": "text", "examples": total, "skipped": skipped,
        "answer_accuracy": correct / total, "chance": chance, "recurrent_layers": R, "cache_layers": C,
        "position": position, "decode": decode, "logit_diff": mean,
        "recurrent_fraction": frac(mean["recurrent"]) if R else None,
        "cache_fraction": frac(mean["cache"]) if C else None,
        "answers_flipped": {k: check.keep(v / eligible if eligible else None) for k, v in flips.items()},
        "flip_eligible": eligible, "per_layer": per_layer, "per_example": per_example, "essay": ESSAY_SWAP})


def _candidates(tok, prompt: str, words: list[str], chat: bool) -> set[int]:
    return {first_token(tok, prompt, w, chat=chat) for w in words}


def _rates(hits: list[dict], cond: str, what: str) -> float | None:
    xs = [h[cond][what] for h in hits if h[cond][what] is not None]
    return sum(xs) / len(xs) if xs else None


@torch.no_grad()
def text_keep_one(model, tok, records: list[dict], *, n: int = 64, chat: bool = False) -> dict:
    """Retrieval and compliance with only the caches or only the recurrent states; the paired swap."""
    model.eval()
    R, C = recurrent_layers(model), cache_layers(model)
    skipped: dict[str, int] = {}
    items = []
    for rec in records[:n]:
        ids = encode_prompt(tok, rec["prompt"], chat=chat)
        if len(ids) < 2:
            _count(skipped, "prompt of one token")
            continue
        x = {"id": rec["id"], "task": rec["task"], "ids": ids,
             "ret": _candidates(tok, rec["prompt"], rec["retrieval"], chat) if rec["retrieval"] else None,
             "com": _candidates(tok, rec["prompt"], rec["compliance"], chat) if rec["compliance"] else None}
        p = rec.get("paired")
        if p is not None:
            ids2 = encode_prompt(tok, p["prompt"], chat=chat)
            if len(ids2) != len(ids):
                _count(skipped, "paired prompts of other token lengths (paired swap only)")
            else:
                x.update(ids2=ids2,
                         ret2=_candidates(tok, p["prompt"], p["retrieval"], chat) if p["retrieval"] else None,
                         com2=_candidates(tok, p["prompt"], p["compliance"], chat) if p["compliance"] else None)
        _check_vocab(model, ids + x.get("ids2", []), f"prompt {rec['id']}")
        items.append(x)
    if not items:
        raise ValueError(f"prompts: no usable keep_one item (skipped: {skipped or 'none given'})")

    def hit(tops: torch.Tensor, j: int, cands: set[int] | None) -> float | None:
        return None if cands is None else float(int(tops[j]) in cands)

    hits, paired = [], []
    for _, idx in sorted(group_by_length([torch.tensor(x["ids"]) for x in items]).items()):
        grp = [items[i] for i in idx]
        X = torch.tensor([x["ids"] for x in grp])
        t = X.shape[1] - 2
        c1 = run_to(model, X, t)
        caches = {"full": c1, "cache_only": discard_states(model, c1, R), "state_only": discard_states(model, c1, C)}
        tops = {k: continue_from(model, X, c, t)[:, -1].argmax(-1) for k, c in caches.items()}
        for j, x in enumerate(grp):
            hits.append({"id": x["id"], "task": x["task"], "tokens": int(X.shape[1]),
                         **{k: {"retrieval": hit(tops[k], j, x["ret"]), "compliance": hit(tops[k], j, x["com"])}
                            for k in caches}})
        with_pair = [j for j, x in enumerate(grp) if "ids2" in x]
        if R and C and with_pair:
            sub = [grp[j] for j in with_pair]
            X1, X2 = X[with_pair], torch.tensor([x["ids2"] for x in sub])
            mixed = mix_states(model, run_to(model, X1, t), run_to(model, X2, t), R)  # caches of 1, states of 2
            top = continue_from(model, X1, mixed, t)[:, -1].argmax(-1)
            for j, x in enumerate(sub):
                paired.append({"id": x["id"], "task": x["task"],
                               "content_from_cache": hit(top, j, x["ret"]),
                               "content_from_state": hit(top, j, x["ret2"]),
                               "language_from_cache": hit(top, j, x["com"]),
                               "language_from_state": hit(top, j, x["com2"])})
    conds = ("full", "cache_only", "state_only")
    content = [h for h in hits if h["task"] in ("dictionary", "language")]
    lang = [h for h in hits if h["task"] == "language"]
    persona = [h for h in hits if h["task"] == "persona"]
    V = model.cfg.vocab_size
    share = {"retrieval": _chance([x["ret"] for x in items if x["task"] in ("dictionary", "language")], V),
             "compliance": _chance([x["com"] for x in items if x["task"] == "language"], V),
             "persona": _chance([x["com"] for x in items if x["task"] == "persona"], V)}
    out = {"probe": "keep_one", "input": "text", "examples": len(hits), "skipped": skipped,
           "recurrent_layers": R, "cache_layers": C}
    for c in conds:  # the essay's three figures: retrieval (dictionary items), compliance (language), persona
        out[c] = {"retrieval": _rates(content, c, "retrieval"), "compliance": _rates(lang, c, "compliance")}
    checks = keep_checks(out["full"], share)
    if persona:
        out["persona"] = {c: _rates(persona, c, "compliance") for c in conds}
        if out["persona"]["full"] is not None:
            checks["persona"] = learned(out["persona"]["full"], share["persona"],
                                        what="persona compliance with both stores")
    for c in ("cache_only", "state_only"):
        out[c] = mask_keep(out[c], checks)
        if persona and "persona" in checks:
            out["persona"][c] = checks["persona"].keep(out["persona"][c])
    keys = ("content_from_cache", "content_from_state", "language_from_cache", "language_from_state")

    def mean_of(sel: list[dict], k: str) -> float | None:
        xs = [p[k] for p in sel if p[k] is not None]
        part = checks.get("retrieval" if k.startswith("content") else "compliance")
        return part.keep(sum(xs) / len(xs)) if xs and part is not None else None

    out["paired"] = {k: mean_of(paired, k) for k in keys}
    out["paired"]["examples"] = len(paired)

    def by_task(tk: str) -> dict:
        sel = [h for h in hits if h["task"] == tk]
        own = {**checks, "compliance": checks["persona"]} if tk == "persona" and "persona" in checks else checks
        rates = {c: {w: _rates(sel, c, w) for w in ("retrieval", "compliance")} for c in conds}
        return {c: v if c == "full" else mask_keep(v, own) for c, v in rates.items()}

    out.update({"chance": share, "checks": {k: v.as_dict() for k, v in checks.items()},
                "tasks": {tk: by_task(tk) for tk in sorted({h["task"] for h in hits})}, "per_example": hits,
                "paired_per_example": paired, "essay": ESSAY_KEEP})
    return all_of(checks).stamp(out)


def _chance(candidates: list[set[int] | None], vocab: int) -> float | None:
    """The hit rate of a uniform guess over the vocabulary: the candidates' mean share of it."""
    sets = [c for c in candidates if c is not None]
    return sum(len(c) for c in sets) / len(sets) / vocab if sets else None


@torch.no_grad()
def text_forgetting(model, tok, documents: list[dict], *, n: int = 64, max_tokens: int = 512) -> dict:
    """Half-lives of the recurrent heads on the documents (each cut to the shortest's length)."""
    docs = documents[:n]
    ids = [tok.encode(d["text"]) for d in docs]
    for d, x in zip(docs, ids):
        _check_vocab(model, x, f"document {d['id']}")
    T = min(max_tokens, *(len(x) for x in ids)) if ids else 0
    if T < 2:
        raise ValueError(f"documents: need documents of at least 2 tokens (the shortest has {T})")
    out = forgetting(model, inputs=torch.tensor([x[:T] for x in ids]))
    out.update({"input": "text", "document_ids": [d["id"] for d in docs], "tokens_per_document": T})
    return out
