"""Patching at a chosen position: swap recurrent states, caches, or one layer's either, at token t.

A swap is *position-aligned* (Lee et al., arXiv 2609.33093; Afendulev et al., arXiv 2609.04434):

1. the donor sequence runs to position ``t`` (tokens ``0..t``): its per-layer states after token t;
2. the base sequence runs to the same position, and the token states of the patched ``layers``
   are replaced by (copies of) the donor's;
3. the base's remaining tokens (``t+1 ..``) continue from the patched cache.

A recurrent layer's state after token t summarises every token up to t, so swapping it swaps
what the layer carries about the donor's prefix; an attention layer's cache holds one entry per
token, and swapping it swaps the entries of positions ``<= t`` (the entries of later positions
are the base's own, written by step 3). Donor and base must be at least ``t + 1`` tokens long and
share the batch size: a ``ValueError`` naming ``t`` otherwise.

Prefill and decoding are the same call with another segmentation: ``prompt_len = P`` runs the
first ``P`` tokens in one call (a prefill, cut at t when ``t < P``) and feeds the rest one token
per call (decoding steps), on both sides; ``prompt_len=None`` prefills everything. A swap at t
during decoding therefore sees the states the decoding loop holds after token t. ``generate``
decodes greedily from a base prompt and swaps when the decoding passes position t.

The effect on an answer is the logit difference ``ld = logit[b] - logit[a]`` at the sequence's
last position (``logit_diff``); ``swap_fraction`` is the share of the donor's effect a patch moves,
``(ld_patched - ld_base) / (ld_donor - ld_base)``, and ``layer_sweep`` patches one layer at a time.

``Swap(t, layers)`` names the patch; ``layers_of(model, "recurrent" | "cache" | "all")`` gives the
layers by what their token store's config declares (``RECURRENT``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from storelab.probes.common import cache_layers, copy_cache, mix_states, recurrent_layers

__all__ = ["Swap", "layers_of", "run_to", "continue_from", "patched_logits", "clean_logits", "generate",
           "logit_diff", "swap_fraction", "layer_sweep"]


@dataclass(frozen=True)
class Swap:
    """Replace the token states of ``layers`` by the donor's after token ``t`` (0-based)."""

    t: int
    layers: tuple[int, ...]


def layers_of(model, which: str) -> list[int]:
    """``recurrent``: fixed-size states; ``cache``: entries per token; ``all``: every layer."""
    if which == "recurrent":
        return recurrent_layers(model)
    if which == "cache":
        return cache_layers(model)
    if which == "all":
        return list(range(model.cfg.n_layers))
    raise ValueError(f"layers: one of recurrent, cache, all, got {which!r}")


def _segments(start: int, end: int, prompt_len: int | None) -> list[tuple[int, int]]:
    """Calls covering tokens [start, end): one call up to the prompt's end, then one token per call."""
    p = end if prompt_len is None else max(start, min(prompt_len, end))
    out = [(start, p)] if p > start else []
    return out + [(i, i + 1) for i in range(p, end)]


@torch.no_grad()
def _run(model, ids_BT: Tensor, cache: list, start: int, end: int, prompt_len: int | None):
    """Run tokens [start, end) on ``cache`` (updated in place); the logits of every token run [B, n, V]."""
    outs = []
    for s, e in _segments(start, end, prompt_len):
        logits, cache = model(ids_BT[:, s:e], cache)
        outs.append(logits.float())
    return torch.cat(outs, dim=1), cache


def _check(t: int, *seqs: Tensor) -> None:
    for x in seqs:
        if x.dim() != 2:
            raise ValueError(f"ids: expected token ids [B, T], got shape {list(x.shape)}")
        if not 0 <= t < x.shape[1]:
            raise ValueError(f"t: position {t} is outside a sequence of {x.shape[1]} tokens (position-aligned "
                             f"swaps need donor and base to reach t)")
    if len({x.shape[0] for x in seqs}) > 1:
        raise ValueError(f"ids: donor and base batch sizes differ ({', '.join(str(x.shape[0]) for x in seqs)})")


def run_to(model, ids_BT: Tensor, t: int, *, prompt_len: int | None = None) -> list:
    """The cache after token ``t`` of ``ids_BT`` (tokens 0..t run, segmented as ``prompt_len`` says)."""
    _check(t, ids_BT)
    model.eval()
    return _run(model, ids_BT, model.new_cache(), 0, t + 1, prompt_len)[1]


def continue_from(model, ids_BT: Tensor, cache: list, t: int, *, prompt_len: int | None = None) -> Tensor:
    """Logits [B, T - t - 1, V] of the tokens after ``t``, run on a copy of ``cache`` (the state after t)."""
    if t + 1 >= ids_BT.shape[1]:
        raise ValueError(f"t: position {t} leaves no token to continue with in a sequence of {ids_BT.shape[1]} "
                         f"(the answer is read after t: t <= {ids_BT.shape[1] - 2})")
    return _run(model, ids_BT, copy_cache(model, cache), t + 1, ids_BT.shape[1], prompt_len)[0]


def clean_logits(model, base_BT: Tensor, t: int, *, prompt_len: int | None = None) -> Tensor:
    """The base run segmented as a patched one (cut at t), nothing swapped: the exact reference."""
    return continue_from(model, base_BT, run_to(model, base_BT, t, prompt_len=prompt_len), t, prompt_len=prompt_len)


def patched_logits(model, base_BT: Tensor, donor_BT: Tensor, swap: Swap, *, prompt_len: int | None = None,
                   base_cache: list | None = None, donor_cache: list | None = None) -> Tensor:
    """Logits [B, T - t - 1, V] of the base's tokens after ``swap.t``, with ``swap.layers`` patched.

    ``base_cache`` / ``donor_cache``: the caches after token t when already computed (``run_to``);
    they are not modified, so one pair of runs serves many swaps."""
    _check(swap.t, base_BT, donor_BT)
    bad = [i for i in swap.layers if not 0 <= i < model.cfg.n_layers]
    if bad:
        raise ValueError(f"layers: layer {bad[0]} does not exist (the model has {model.cfg.n_layers})")
    cb = base_cache if base_cache is not None else run_to(model, base_BT, swap.t, prompt_len=prompt_len)
    cd = donor_cache if donor_cache is not None else run_to(model, donor_BT, swap.t, prompt_len=prompt_len)
    return continue_from(model, base_BT, mix_states(model, cb, cd, swap.layers), swap.t, prompt_len=prompt_len)


@torch.no_grad()
def generate(model, prompt_BT: Tensor, new_tokens: int, swap: Swap | None = None, donor_BT: Tensor | None = None
             ) -> Tensor:
    """Greedy decoding of ``new_tokens`` after the base prompt; with ``swap``, the donor's states replace
    the patched layers' once the base has run token ``swap.t`` (in the prompt or among the generated
    tokens; the donor sequence must reach t). Returns the new ids [B, new_tokens]."""
    P = prompt_BT.shape[1]
    if swap is not None:
        if donor_BT is None:
            raise ValueError("donor: a swap needs the donor's token ids")
        if swap.t >= P + new_tokens - 1:
            raise ValueError(f"t: position {swap.t} is past the last token that feeds another ({P + new_tokens - 2})")
        _check(swap.t, donor_BT)
        donor = run_to(model, donor_BT, swap.t, prompt_len=P)
    model.eval()
    cache, out = model.new_cache(), []
    cut = swap.t + 1 if swap is not None and swap.t < P else P
    logits, cache = _run(model, prompt_BT, cache, 0, cut, None)
    ids = prompt_BT
    pos = cut - 1                                                 # the last token run
    while len(out) < new_tokens:
        if swap is not None and pos == swap.t:
            cache = mix_states(model, cache, donor, swap.layers)
        if pos + 1 < P:                                           # the rest of the prompt, after a swap inside it
            logits, cache = _run(model, ids, cache, pos + 1, P, None)
            pos = P - 1
            continue
        nxt = logits[:, -1].argmax(-1, keepdim=True)
        out.append(nxt)
        ids = torch.cat([ids, nxt], dim=1)
        if len(out) == new_tokens:
            break
        logits, cache = model(nxt, cache)
        logits, pos = logits.float(), pos + 1
    return torch.cat(out, dim=1) if out else prompt_BT[:, :0]


def logit_diff(logits_BV: Tensor, a_B: Tensor, b_B: Tensor) -> Tensor:
    """``logit[b] - logit[a]`` per example [B]."""
    idx = torch.arange(len(a_B))
    return logits_BV[idx, b_B] - logits_BV[idx, a_B]


def swap_fraction(ld_patched: Tensor, ld_base: Tensor, ld_donor: Tensor) -> float | None:
    """Share of the donor's effect the patch moves (means over examples); None when there is no effect."""
    effect = float(ld_donor.mean() - ld_base.mean())
    if abs(effect) < 1e-9:
        return None
    return float(ld_patched.mean() - ld_base.mean()) / effect


@torch.no_grad()
def layer_sweep(model, base_BT: Tensor, donor_BT: Tensor, t: int, a_B: Tensor, b_B: Tensor, *,
                prompt_len: int | None = None) -> list[dict]:
    """One swap per layer (that layer alone): each layer's kind and the logit difference it moves to,
    summed over the batch (``ld_sum``), with the clean and donor sums, for pooling across batches."""
    cb = run_to(model, base_BT, t, prompt_len=prompt_len)
    cd = run_to(model, donor_BT, t, prompt_len=prompt_len)
    ld_base = logit_diff(continue_from(model, base_BT, cb, t, prompt_len=prompt_len)[:, -1], a_B, b_B)
    ld_donor = logit_diff(continue_from(model, donor_BT, cd, t, prompt_len=prompt_len)[:, -1], a_B, b_B)
    rec = set(recurrent_layers(model))
    out = []
    for i in range(model.cfg.n_layers):
        lg = patched_logits(model, base_BT, donor_BT, Swap(t, (i,)), prompt_len=prompt_len, base_cache=cb,
                            donor_cache=cd)[:, -1]
        out.append({"layer": i, "kind": model.cfg.layers[i].token.KIND,
                    "store": "recurrent" if i in rec else "cache",
                    "ld_sum": float(logit_diff(lg, a_B, b_B).sum()), "ld_base_sum": float(ld_base.sum()),
                    "ld_donor_sum": float(ld_donor.sum()), "examples": int(len(a_B))})
    return out
