"""Swaps and keep-one by store group and by layer, on text prompt pairs (Lee et al., arXiv 2609.33093;
Afendulev et al., arXiv 2609.04434), for real language models.

Each pair (``storelab.probes.real_tasks``) differs in the asked value only; a and b are the first
tokens of the two answers. Both prompts run to their second-to-last token (one call, the LM head on
the last position only); then the last token runs on a copy of prompt A's cache in which

* **swap group g**: the token states of g's layers are prompt B's (``mix_states``);
* **swap layer i**: layer i's state alone is B's;
* **keep group g**: every other layer's token state is emptied (``discard_states``; those layers read
  only the last token itself), and the answer is read: does it still retrieve a?

The shift moved is ``(mean ld_patched - mean ld_A) / (mean ld_B - mean ld_A)`` with ``ld = logit[b] -
logit[a]``, in percent, its 95 % interval bootstrapped over the prompts (``store_groups.ratio_share``).
Groups come from the store configs (``store_groups``). Nothing is divided that is not there
(``storelab.probes.validity``): the clean prompts are answered above the task's chance by ``MARGIN`` and
B moves the logit difference by ``MIN_SHIFT`` nats, else every share is None and ``reason`` says why.
"""

from __future__ import annotations

import torch

from storelab.probes.common import copy_cache, discard_states, mix_states
from storelab.probes.prompts import first_token
from storelab.probes.store_groups import AXES, GROUP_WORDS, groups_of, rate_share, ratio_share
from storelab.probes.validity import swap_effect

__all__ = ["encode_pairs", "group_swap", "split_by"]


def encode_pairs(tok, records: list[dict], vocab: int) -> tuple[list[dict], dict[str, int]]:
    """Token ids of each pair and its scored tokens; pairs of other token lengths or equal answers skipped."""
    out, skipped = [], {}
    for rec in records:
        ia, ib = tok.encode(rec["prompt_a"]), tok.encode(rec["prompt_b"])
        a = first_token(tok, rec["prompt_a"], rec["answer_a"])
        b = first_token(tok, rec["prompt_b"], rec["answer_b"])
        why = ("prompts of other token lengths" if len(ia) != len(ib) else "answers starting with the same token"
               if a == b else "token outside the vocabulary" if max(ia + ib + [a, b]) >= vocab else "")
        if why:
            skipped[why] = skipped.get(why, 0) + 1
            continue
        out.append({**rec, "ia": ia, "ib": ib, "a": a, "b": b, "tokens": len(ia)})
    return out, skipped


@torch.no_grad()
def _prefix(model, ids: list[int]) -> list:
    _, cache = model(torch.tensor([ids[:-1]]), keep_logits=1)
    return cache


@torch.no_grad()
def _last(model, cache: list, ids: list[int]) -> torch.Tensor:
    logits, _ = model(torch.tensor([ids[-1:]]), copy_cache(model, cache), keep_logits=1)
    return logits[0, -1].float()


def _ld(lg: torch.Tensor, a: int, b: int) -> float:
    return float(lg[b] - lg[a])


@torch.no_grad()
def run_pair(model, x: dict, groups: dict[str, list[int]], per_layer: bool, only_right: bool = True) -> dict:
    """The logit differences and top-1 answers of one pair under every condition."""
    ca, cb = _prefix(model, x["ia"]), _prefix(model, x["ib"])
    a, b = x["a"], x["b"]
    clean, corrupt = _last(model, ca, x["ia"]), _last(model, cb, x["ib"])
    every = list(range(model.cfg.n_layers))
    out = {"ld_a": _ld(clean, a, b), "ld_b": _ld(corrupt, a, b), "right": int(clean.argmax()) == a,
           "right_b": int(corrupt.argmax()) == b, "swap": {}, "keep": {}, "layer": []}
    for g, layers in groups.items():
        out["swap"][g] = _ld(_last(model, mix_states(model, ca, cb, layers), x["ia"]), a, b)
        rest = [i for i in every if i not in layers]
        out["keep"][g] = int(_last(model, discard_states(model, ca, rest), x["ia"]).argmax()) == a
    if per_layer and (out["right"] or not only_right):   # a sweep on a prompt the model gets wrong would divide nothing
        out["layer"] = [_ld(_last(model, mix_states(model, ca, cb, [i]), x["ia"]), a, b) for i in every]
    return out


def summarise(model, rows: list[dict], chance: float, groups: dict[str, list[int]], *, boot: int = 1000) -> dict:
    """Accuracy, the check, and each group's (and layer's) share of the shift over ``rows``."""
    n = len(rows)
    acc = sum(r["right"] for r in rows) / n
    ld_a, ld_b = [r["ld_a"] for r in rows], [r["ld_b"] for r in rows]
    check = swap_effect(acc, chance, sum(ld_b) / n - sum(ld_a) / n)
    right = [r for r in rows if r["right"]]

    def share(p: list[float]):
        s = ratio_share(p, ld_a, ld_b, boot=boot)
        return check.keep(None if s is None else s.as_dict())

    out = {"prompts": n, "accuracy": rate_share(sum(r["right"] for r in rows), n).as_dict(), "chance": chance,
           "valid": check.valid, "reason": check.reason, "validity": check.as_dict(), "groups": {}}
    for g in (*AXES, *[g for g in groups if g not in AXES]):
        if g not in groups:
            out["groups"][g] = {"layers": [], "applies": False, "why": f"no {g.split()[0]} layers"}
            continue
        kept = rate_share(sum(r["keep"][g] for r in right), len(right))
        out["groups"][g] = {"layers": groups[g], "applies": True, "words": GROUP_WORDS[g],
                            "swap_share": share([r["swap"][g] for r in rows]),
                            "keep_retrieval": check.keep(None if kept is None else kept.as_dict())}
    swept = [r for r in rows if r["layer"]]
    if swept:   # the layer sweep's own check: on the pairs it ran
        acc_s = sum(r["right"] for r in swept) / len(swept)
        sa, sb = [r["ld_a"] for r in swept], [r["ld_b"] for r in swept]
        check_s = swap_effect(acc_s, chance, sum(sb) / len(sb) - sum(sa) / len(sa))
        kinds = {i: g for g, ls in groups.items() for i in ls}

        def share_s(i: int):
            s = ratio_share([r["layer"][i] for r in swept], sa, sb, boot=boot)
            return check_s.keep(None if s is None else s.as_dict())

        out["layer_prompts"] = len(swept)
        out["layers"] = [{"layer": i, "group": kinds[i], "kind": model.cfg.layers[i].token.KIND,
                          "swap_share": share_s(i)} for i in range(model.cfg.n_layers)]
    return out


def split_by(items: list[dict], key: str) -> dict:
    out: dict = {}
    for x in items:
        out.setdefault(x[key], []).append(x)
    return out


@torch.no_grad()
def group_swap(model, tok, records: list[dict], *, by: str = "task", chance: float, per_layer: bool = True,
               layer_points: int | None = None, layer_pairs: int | None = None, only_right: bool = True,
               boot: int = 1000) -> dict:
    """Swap and keep-one by store group (and swap by layer) on ``records``, summarised per value of
    ``by`` (``task``, ``distance``, ...: a field of the records). Each one-token continuation reads every
    weight once, so the layer sweep (one per layer) is what costs: ``layer_points`` limits it to the first
    values of ``by`` and ``layer_pairs`` to the first pairs of each the model answers right (None: all)."""
    model.eval()
    groups = groups_of(model)
    pairs, skipped = encode_pairs(tok, records, model.cfg.vocab_size)
    if not pairs:
        raise ValueError(f"records: no usable pair (skipped: {skipped or 'none given'})")
    keys = sorted({x[by] for x in pairs})
    swept = set(keys if layer_points is None else keys[:layer_points])
    done: dict = {}
    rows = []
    for x in pairs:
        sweep = per_layer and x[by] in swept and (layer_pairs is None or done.get(x[by], 0) < layer_pairs)
        r = run_pair(model, x, groups, sweep, only_right)
        done[x[by]] = done.get(x[by], 0) + bool(r["layer"])
        rows.append({**r, by: x[by], "tokens": x["tokens"], "id": x["id"]})
    return {"probe": "group_swap", "by": by, "groups": {g: ls for g, ls in groups.items()}, "skipped": skipped,
            "points": {str(k): {"tokens": sum(r["tokens"] for r in rs) / len(rs),
                                **summarise(model, rs, chance, groups, boot=boot)}
                       for k, rs in sorted(split_by(rows, by).items())},
            "per_prompt": [{k: r[k] for k in ("id", by, "tokens", "ld_a", "ld_b", "right", "swap")} for r in rows]}
