"""Long context as interference (essay section 3): retrieval as the dictionary grows, random against
near-duplicate keys.

``retrieval_curve(model, tok, sizes=..., keys=("random", "near"))`` asks ``n`` dictionaries of each size
(``storelab.probes.real_tasks.dictionary_pairs``, list form) one entry each and scores the first
token of the value (a first digit, chance 1 in 9). Each point is a percentage with its Wilson
interval over the prompts; a point where the model is not above chance by ``MARGIN`` is marked as
not learned (``storelab.probes.validity``) rather than drawn as a figure of interference.
"""

from __future__ import annotations

import torch

from storelab.probes.group_swap import encode_pairs
from storelab.probes.real_tasks import VALUE_CHANCE, dictionary_pairs
from storelab.probes.store_groups import rate_share
from storelab.probes.validity import learned

__all__ = ["retrieval_curve"]

ESSAY_INTERFERENCE = ("Real long contexts are not random: they repeat entities, templates and phrasings, and no "
                      "sharpening separates near-duplicate keys.")


@torch.no_grad()
def retrieval_curve(model, tok, *, sizes: tuple[int, ...] = (4, 16, 64), keys: tuple[str, ...] = ("random", "near"),
                    n: int = 8, seeds: tuple[int, ...] = (0,), fmt: str = "list") -> dict:
    """Accuracy by dictionary size and kind of key, with intervals over ``n`` prompts per seed."""
    model.eval()
    rows = []
    for kind in keys:
        for size in sizes:
            recs = [r for s in seeds for r in dictionary_pairs(n, entries=size, fmt=fmt, keys=kind, seed=s)]
            pairs, _ = encode_pairs(tok, recs, model.cfg.vocab_size)
            hits = sum(int(model(torch.tensor([x["ia"]]), keep_logits=1)[0][0, -1].argmax()) == x["a"] for x in pairs)
            check = learned(hits / len(pairs), VALUE_CHANCE) if pairs else None
            rows.append({"keys": kind, "entries": size, "prompts": len(pairs),
                         "tokens": sum(x["tokens"] for x in pairs) / max(1, len(pairs)),
                         "accuracy": rate_share(hits, len(pairs)).as_dict() if pairs else None,
                         "valid": bool(check and check.valid), "reason": check.reason if check else "no prompt"})
    return {"probe": "retrieval_curve", "format": fmt, "chance": {"percent": round(100 * VALUE_CHANCE, 2)},
            "points": rows, "essay": ESSAY_INTERFERENCE}
