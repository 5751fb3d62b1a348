"""Probes 1 and 2: which store carries the content, and which the settings.

1. ``state_swap`` (Lee et al., arXiv 2609.33093). Two prompts differ only in one stored
   value, the one the question asks for; their answers are ``a`` and ``b``. Run prompt A,
   but before it answers, replace all its recurrent states (or all its attention caches)
   by prompt B's. The answer's shift is measured by the logit difference
   ``ld = logit[b] - logit[a]``; the fraction a patch moves is
   ``(mean ld_patched - mean ld_A) / (mean ld_B - mean ld_A)``: 0 when the patched stores
   carry nothing of the value, 1 when they carry all of it.

2. ``keep_one`` (Afendulev et al., arXiv 2609.04434), on the dictionary-and-language
   task. After the prompt, keep only the attention caches (recurrent states emptied) or
   only the recurrent states (caches emptied) and let the model answer: retrieval (the
   right value, in any language) and compliance (the requested language, any value) for
   each. Then pair prompt 1's caches with prompt 2's states, where prompt 2 has other
   values and another language, and count where the answer's content and language come
   from.

Both prefill all but the prompt's last token, patch, then run the last token (the
question's final token) on the patched cache.

Neither divides an effect that is not there (``storelab.probes.validity``): ``state_swap``
reports its fractions only when the clean prompts are answered above the task's chance by
``MARGIN`` and the donor moves the logit difference by ``MIN_SHIFT``; ``keep_one`` its one-store
rates and paired shares only for a part (retrieval, compliance) the full model does above chance.
Otherwise those figures are None, and ``valid``, ``reason`` and ``validity`` say why.
"""

from __future__ import annotations

import torch
from torch import Tensor

from storelab.probes.common import answer, cache_layers, discard_states, mix_states, prefill, recurrent_layers
from storelab.probes.validity import all_of, learned, swap_effect
from storelab.tasks import IGNORE, MQAR, DictionaryLanguage

ESSAY_SWAP = {"source": "Lee et al., arXiv 2609.33093 (Qwen3.5-4B)", "recurrent_fraction": [0.002, 0.036],
              "cache_fraction": [0.96, 1.0]}
ESSAY_KEEP = {"source": "Afendulev et al., arXiv 2609.04434 (Qwen3.5-4B)",
              "retrieval": {"cache_only": 0.89, "state_only": 0.0},
              "compliance": {"cache_only": 0.01, "state_only": 0.70},
              "persona": {"cache_only": 0.14, "state_only": 0.49},
              "paired": "content from the cache's prompt, language from the state's prompt"}


# -- counterfactual prompts -------------------------------------------------------------------
def dictionary_pairs(task: DictionaryLanguage, n: int, seed: int) -> list[dict[str, Tensor]]:
    """Prompts A and B that differ only in the value of the first queried key (one batch)."""
    if task.pairs_max >= task.n_values:
        raise ValueError(f"pairs_max: the swap needs a value the dictionary does not hold "
                         f"({task.pairs_max} pairs, {task.n_values} values)")
    b = task.sample(n, seed)
    p0 = int(b.meta["answer_pos"][0, 0])  # prompts are left-padded: every first answer sits here
    prompt_a = b.inputs[:, :p0 + 1].clone()
    prompt_b = prompt_a.clone()
    g = torch.Generator().manual_seed(seed + 1)
    ans_a = b.targets[:, p0].clone()
    ans_b = torch.empty_like(ans_a)
    for i in range(n):
        key = prompt_a[i, p0 - 1]
        j = int((prompt_a[i, :p0 - 2] == key).nonzero()[0])  # the key in the dictionary
        used = set((prompt_a[i] - task.value_start).tolist())
        free = [v for v in range(task.n_values) if v not in used]
        new = free[int(torch.randint(len(free), (1,), generator=g))]
        prompt_b[i, j + 1] = task.value_start + new
        ans_b[i] = task.write(b.meta["language"][i], torch.tensor(new))
    return [{"prefix_a": prompt_a[:, :-1], "prefix_b": prompt_b[:, :-1], "last": prompt_a[:, -1:],
             "a": ans_a, "b": ans_b}]


def mqar_pairs(task: MQAR, n: int, seed: int) -> list[dict[str, Tensor]]:
    """For each sequence, its first query; B changes that key's stored value. Grouped by length."""
    b = task.sample(n, seed)
    half = task.vocab_size // 2
    g = torch.Generator().manual_seed(seed + 1)
    groups: dict[int, list] = {}
    for i in range(n):
        q = int((b.targets[i] != IGNORE).nonzero()[0])
        pa = b.inputs[i, :q + 1].clone()
        pairs = int(b.meta["pairs"][i])
        ctx = pa[:2 * pairs]
        j = int((ctx[0::2] == pa[q]).nonzero()[0]) * 2
        used = set(ctx.tolist())
        while True:
            new = half + int(torch.randint(task.vocab_size - half, (1,), generator=g))
            if new not in used:
                break
        pb = pa.clone()
        pb[j + 1] = new
        groups.setdefault(q + 1, []).append((pa, pb, b.targets[i, q], torch.tensor(new)))
    out = []
    for _, items in sorted(groups.items()):
        pa = torch.stack([x[0] for x in items])
        pb = torch.stack([x[1] for x in items])
        out.append({"prefix_a": pa[:, :-1], "prefix_b": pb[:, :-1], "last": pa[:, -1:],
                    "a": torch.stack([x[2] for x in items]), "b": torch.stack([x[3] for x in items])})
    return out


def counterfactual_pairs(task, n: int, seed: int) -> list[dict[str, Tensor]]:
    if isinstance(task, DictionaryLanguage):
        return dictionary_pairs(task, n, seed)
    if isinstance(task, MQAR):
        return mqar_pairs(task, n, seed)
    raise ValueError(f"task: the swap probes need a recall task (mqar or dictionary), got {task.NAME!r}")


# -- probe 1 -------------------------------------------------------------------------------------
def _ld(logits: Tensor, a: Tensor, b: Tensor) -> Tensor:
    idx = torch.arange(len(a))
    return logits[idx, b] - logits[idx, a]


@torch.no_grad()
def state_swap(model, task, *, n: int = 64, seed: int = 0) -> dict:
    """Fraction of the answer's shift moved by patching all recurrent states, or all caches."""
    model.eval()
    R, C = recurrent_layers(model), cache_layers(model)
    sums = {k: 0.0 for k in ("clean", "corrupt", "recurrent", "cache")}
    flips = {"recurrent": 0, "cache": 0}
    eligible = correct = total = 0
    for grp in counterfactual_pairs(task, n, seed):
        ca, cb = prefill(model, grp["prefix_a"]), prefill(model, grp["prefix_b"])
        a, b, last = grp["a"], grp["b"], grp["last"]
        out = {"clean": answer(model, ca, last), "corrupt": answer(model, cb, last)}
        out["recurrent"] = answer(model, mix_states(model, ca, cb, R), last) if R else out["clean"]
        out["cache"] = answer(model, mix_states(model, ca, cb, C), last) if C else out["clean"]
        for k, v in out.items():
            sums[k] += _ld(v, a, b).sum().item()
        ok = (out["clean"].argmax(-1) == a) & (out["corrupt"].argmax(-1) == b)
        eligible += int(ok.sum())
        correct += int((out["clean"].argmax(-1) == a).sum())
        total += len(a)
        for k in flips:
            flips[k] += int((ok & (out[k].argmax(-1) == b)).sum())
    mean = {k: v / total for k, v in sums.items()}
    effect = mean["corrupt"] - mean["clean"]
    check = swap_effect(correct / total, task.chance(), effect)

    def frac(k: str) -> float | None:
        if (k == "recurrent" and not R) or (k == "cache" and not C) or abs(effect) < 1e-9:
            return None
        return check.keep((mean[k] - mean["clean"]) / effect)

    return check.stamp({
        "probe": "state_swap", "examples": total, "answer_accuracy": correct / total, "chance": task.chance(),
        "recurrent_layers": R, "cache_layers": C, "logit_diff": mean,
        "recurrent_fraction": frac("recurrent"), "cache_fraction": frac("cache"),
        "answers_flipped": {k: check.keep(v / eligible if eligible else None) for k, v in flips.items()},
        "flip_eligible": eligible, "essay": ESSAY_SWAP})


# -- probe 2 -------------------------------------------------------------------------------------
def language_pairs(task: DictionaryLanguage, n: int, seed: int) -> dict[str, Tensor]:
    """Prompt 1 and prompt 2: same keys and question, other values and another language."""
    if task.n_languages < 2:
        raise ValueError("n_languages: keep_one needs at least two languages")
    b = task.sample(n, seed)
    p0 = int(b.meta["answer_pos"][0, 0])
    p1 = b.inputs[:, :p0 + 1].clone()
    p2 = p1.clone()
    g = torch.Generator().manual_seed(seed + 1)
    l1 = b.meta["language"]
    l2 = (l1 + 1 + torch.randint(task.n_languages - 1, (n,), generator=g)) % task.n_languages
    v1 = b.meta["value"][:, 0]
    v2 = torch.empty_like(v1)
    for i in range(n):
        is_val = (p1[i] >= task.value_start) & (p1[i] < task.value_start + task.n_values)
        pos = is_val.nonzero().flatten()
        while True:  # new values for the whole dictionary; the asked one must change
            new = torch.randperm(task.n_values, generator=g)[:len(pos)]
            j = int((p1[i, pos - 1] == p1[i, p0 - 1]).nonzero()[0])
            if int(new[j]) != int(v1[i]):
                break
        p2[i, pos] = task.value_start + new
        p2[i, (p1[i] == 1).nonzero()[0] + 1] = task.lang_start + l2[i]  # the token after BOS
        v2[i] = new[j]
    return {"prefix_1": p1[:, :-1], "prefix_2": p2[:, :-1], "last": p1[:, -1:], "l1": l1, "l2": l2, "v1": v1,
            "v2": v2}


@torch.no_grad()
def keep_one(model, task: DictionaryLanguage, *, n: int = 64, seed: int = 0) -> dict:
    """Retrieval and compliance with only the caches or only the recurrent states; then a paired swap."""
    if not isinstance(task, DictionaryLanguage):
        raise ValueError(f"task: keep_one needs the dictionary task, got {task.NAME!r}")
    model.eval()
    R, C = recurrent_layers(model), cache_layers(model)
    d = language_pairs(task, n, seed)
    c1, c2 = prefill(model, d["prefix_1"]), prefill(model, d["prefix_2"])
    last = d["last"]

    def decode(cache) -> tuple[Tensor, Tensor]:
        return task.decode(answer(model, cache, last).argmax(-1))

    def scores(cache) -> dict[str, float]:
        lang, val = decode(cache)
        return {"retrieval": (val == d["v1"]).float().mean().item(),
                "compliance": (lang == d["l1"]).float().mean().item()}

    chance = {"retrieval": 1 / task.n_values, "compliance": 1 / task.n_languages}
    full = scores(c1)
    checks = keep_checks(full, chance)
    lang, val = decode(mix_states(model, c1, c2, R))  # caches of prompt 1, recurrent states of prompt 2
    out = {"probe": "keep_one", "examples": n, "recurrent_layers": R, "cache_layers": C, "full": full,
           "cache_only": mask_keep(scores(discard_states(model, c1, R)), checks),
           "state_only": mask_keep(scores(discard_states(model, c1, C)), checks),
           "paired": {"content_from_cache": checks["retrieval"].keep((val == d["v1"]).float().mean().item()),
                      "content_from_state": checks["retrieval"].keep((val == d["v2"]).float().mean().item()),
                      "language_from_cache": checks["compliance"].keep((lang == d["l1"]).float().mean().item()),
                      "language_from_state": checks["compliance"].keep((lang == d["l2"]).float().mean().item())},
           "chance": chance, "checks": {k: v.as_dict() for k, v in checks.items()}, "essay": ESSAY_KEEP}
    return all_of(checks).stamp(out)


def keep_checks(full: dict[str, float | None], chance: dict[str, float]) -> dict:
    """keep_one's checks (``storelab.probes.validity``): retrieval and compliance with both stores, each
    above its chance; a part the full model does not do has no share to keep in one store."""
    return {w: learned(full[w], chance[w], what=f"{w} with both stores") for w in ("retrieval", "compliance")
            if full.get(w) is not None}


def mask_keep(rates: dict[str, float | None], checks: dict) -> dict[str, float | None]:
    """One condition's rates, each None where its check failed (a part without a check stays as is)."""
    return {w: (checks[w].keep(v) if w in checks else v) for w, v in rates.items()}
