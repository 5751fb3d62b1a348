"""What the probes share: which layers hold which store, and surgery on a model's cache.

A storelab model's cache is a list of ``LayerState`` (one per layer); ``.token`` is the
token mixer's state. The probes classify layers by their token store's kind:

* ``recurrent``: linear_attention, deltanet, gated_deltanet, kda (a fixed-size matrix);
* ``cache``: every other token store (attention, window, mla, dsa, msa, csa, ...): entries
  kept per token.

Surgery happens on copies: ``mix_states(model, base, donor, layers)`` returns ``base``
with the token states of ``layers`` taken from ``donor``; ``discard_states(model, base,
layers)`` gives those layers fresh, empty states. Both re-link what states share within
one call (a DSA group's ``SelectionShare``, a reader's view of another layer's latent
cache), so the patched cache runs like any other.

``answer(model, prefix_cache, last_BT)`` runs the prompt's last token on a (patched)
cache and returns its next-token logits: the prompt's stores are written by the prefix
runs, and the answer reads them.
"""

from __future__ import annotations

import copy
from typing import Iterable

import torch
from torch import Tensor

RECURRENT_KINDS = ("linear_attention", "deltanet", "gated_deltanet", "kda")


def layer_kinds(model) -> list[str]:
    return [lay.token.KIND for lay in model.cfg.layers]


def recurrent_layers(model) -> list[int]:
    return [i for i, k in enumerate(layer_kinds(model)) if k in RECURRENT_KINDS]


def cache_layers(model) -> list[int]:
    return [i for i, k in enumerate(layer_kinds(model)) if k not in RECURRENT_KINDS]


@torch.no_grad()
def prefill(model, prefix_BT: Tensor) -> list:
    """The cache after reading ``prefix_BT`` in one call."""
    _, cache = model(prefix_BT)
    return cache


@torch.no_grad()
def answer(model, cache: list, last_BT: Tensor) -> Tensor:
    """Next-token logits [B, V] after the last prompt token(s), read on a copy of ``cache``."""
    logits, _ = model(last_BT, copy.deepcopy(cache))
    return logits[:, -1].float()


def _relink(model, cache: list) -> list:
    """Give each selection group one fresh per-call share and each latent-cache reader its owner."""
    from storelab.models.model import SharedLatentCache

    fresh = model.new_cache()
    shares: dict[int, object] = {}
    for i, (f, st) in enumerate(zip(fresh, cache)):
        fs = getattr(f.token, "share", None)
        if fs is not None and st.token is not None and hasattr(st.token, "share"):
            st.token.share = shares.setdefault(id(fs), type(fs)())
    for i, st in enumerate(cache):
        if isinstance(st.token, SharedLatentCache):
            st.token.owner = cache[model.cfg.layers[i].cache_owner].token
    return cache


def mix_states(model, base: list, donor: list, layers: Iterable[int]) -> list:
    """A copy of ``base`` whose token states at ``layers`` are (copies of) ``donor``'s."""
    out = copy.deepcopy(base)
    for i in layers:
        out[i].token = copy.deepcopy(donor[i].token)
    return _relink(model, out)


def discard_states(model, base: list, layers: Iterable[int]) -> list:
    """A copy of ``base`` whose token states at ``layers`` are fresh (nothing read yet)."""
    out = copy.deepcopy(base)
    fresh = model.new_cache()
    for i in layers:
        out[i].token = fresh[i].token
    return _relink(model, out)


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
