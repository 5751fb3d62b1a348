"""What the probes share: which layers hold which store, and surgery on a model's cache.

A storelab model's cache is a list of ``LayerState`` (one per layer); ``.token`` is the
token mixer's state. The probes classify layers by what their token store's config says
(``RECURRENT``):

* ``recurrent``: a fixed-size matrix per head (linear attention, the delta rules, ...);
* ``cache``: every other token store (attention, window, mla, dsa, msa, csa, ...): entries
  kept per token.

Surgery happens on copies (``clone()``): ``mix_states(model, base, donor, layers)`` returns
``base`` with the token states of ``layers`` taken from ``donor``; ``discard_states(model,
base, layers)`` gives those layers fresh, empty states. Both end with ``model.relink``, which
links again what states share within one call (a selection group's share, a reader's view
of another layer's cache), so the patched cache runs like any other.

``answer(model, prefix_cache, last_BT)`` runs the prompt's last token on a (patched)
cache and returns its next-token logits: the prompt's stores are written by the prefix
runs, and the answer reads them.

``document_inputs(documents, context, batch)`` lays token-id documents end to end (repeated as
needed) into ``batch`` rows of ``context`` tokens: the probes' input on real text.
"""

from __future__ import annotations

from typing import Iterable

import torch
from torch import Tensor


def recurrent_layers(model) -> list[int]:
    """Layers whose token store keeps a fixed-size state."""
    return [i for i, lay in enumerate(model.cfg.layers) if lay.token.RECURRENT]


def cache_layers(model) -> list[int]:
    """Layers whose token store keeps entries per token."""
    return [i for i, lay in enumerate(model.cfg.layers) if not lay.token.RECURRENT]


def copy_cache(model, cache: list) -> list:
    """A copy of ``cache`` that runs on its own: every state cloned, then linked to the copies."""
    return model.relink([st.clone() for st in cache])


@torch.no_grad()
def prefill(model, prefix_BT: Tensor) -> list:
    """The cache after reading ``prefix_BT`` in one call."""
    _, cache = model(prefix_BT)
    return cache


@torch.no_grad()
def answer(model, cache: list, last_BT: Tensor) -> Tensor:
    """Next-token logits [B, V] after the last prompt token(s), read on a copy of ``cache``."""
    logits, _ = model(last_BT, copy_cache(model, cache))
    return logits[:, -1].float()


def mix_states(model, base: list, donor: list, layers: Iterable[int]) -> list:
    """A copy of ``base`` whose token states at ``layers`` are (copies of) ``donor``'s."""
    out = [st.clone() for st in base]
    for i in layers:
        out[i].token = None if donor[i].token is None else donor[i].token.clone()
    return model.relink(out)


def discard_states(model, base: list, layers: Iterable[int]) -> list:
    """A copy of ``base`` whose token states at ``layers`` are fresh (nothing read yet)."""
    out = [st.clone() for st in base]
    fresh = model.new_cache()
    for i in layers:
        out[i].token = fresh[i].token
    return model.relink(out)


def group_by_length(prompts: list[Tensor]) -> dict[int, list[int]]:
    """Indices of the prompts, grouped by length (each group runs as one batch)."""
    out: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        out.setdefault(len(p), []).append(i)
    return out


def spearman(a: Tensor, b: Tensor) -> float:
    """Spearman rank correlation of two 1-D tensors (ties broken by order)."""
    ra = torch.argsort(torch.argsort(a)).double()
    rb = torch.argsort(torch.argsort(b)).double()
    ra, rb = ra - ra.mean(), rb - rb.mean()
    den = (ra.norm() * rb.norm()).item()
    return float((ra @ rb).item() / den) if den > 0 else 1.0


def document_inputs(documents: list[list[int]], context: int, batch: int = 1) -> Tensor:
    """[batch, context] token ids: the documents concatenated in order, repeated until long enough;
    row b starts at document b (mod their number), so rows differ."""
    docs = [list(d) for d in documents if len(d)]
    if not docs:
        raise ValueError("documents: none with any token")
    rows = []
    for b in range(batch):
        out: list[int] = []
        j = b % len(docs)
        while len(out) < context:
            out += docs[j]
            j = (j + 1) % len(docs)
        rows.append(out[:context])
    return torch.tensor(rows, dtype=torch.long)
