"""Probe 3: how fast the recurrent heads forget.

On real inputs (after GateSight, arXiv 2610.14754). Each step a Gated DeltaNet head
multiplies its state by ``exp(g_t)`` (one g per head), a KDA head each key channel by its
own ``exp(g_t,k)``. A head's per-token log retention on a document is the mean of g over
its tokens (and channels, for KDA: the geometric mean of what it keeps), and its half-life
is ``ln 2 / -mean g`` tokens: after that many tokens half of its contents is left (the
delta writes aside). Reported: each head's half-life on each document, the median over
heads, and how stable the ranking of heads from fast to slow is across documents (the mean
Spearman correlation between every pair of documents; 1 = the same order every time,
fixed by the weights). These summaries are of what a model learned to forget, so they are
reported only where it learned (``storelab.probes.validity``: next-token accuracy on the same
inputs above chance, the task's or 1 / vocabulary on documents); each head's half-life is kept.

From the weights alone (after DASC, arXiv 2608.30386), for the layers whose decay is per
key channel (KDA; found from the gates themselves, [B, T, H, K] rather than [B, T, H]): drop
the input-dependent part of the gate (f = 0, the gate's value at x = 0), so each channel's
log retention is its bias term, for KDA ``g_k = lb * sigmoid(exp(A_log) * dt_bias_k)``
(Kimi K3's bounded gate) or ``-exp(A_log) * softplus(dt_bias_k)``. A channel fades to a
thousandth within 64 tokens when ``64 g_k <= ln 1e-3``; a head *mixes* when it has such a
channel and one that lasts longer. Reported: the fraction of those heads that mix
(``kda_mixing_fraction``). The same estimate, and each head's half-life at x = 0, straight
from a checkpoint's gate tensors without building the model: ``storelab.probes.gate_weights``.
"""

from __future__ import annotations

import math

import torch

from storelab.probes.common import recurrent_layers, spearman
from storelab.probes.validity import learned, next_token_accuracy
from storelab.tasks import IGNORE

ESSAY_FORGET = {"source": "GateSight, arXiv 2610.14754 (Qwen3.8-27B); DASC, arXiv 2608.30386 (Kimi K3)",
                "median_half_life_tokens": 24, "ranking": "almost the same for every document",
                "kda_mixing_fraction": 0.98}

FADE, WITHIN = 1e-3, 64


@torch.no_grad()
def decay_gates(model, inputs_BT: torch.Tensor, *, at_rest: dict | None = None
                ) -> tuple[dict[int, torch.Tensor], torch.Tensor]:
    """Per recurrent layer, its log decays on these inputs: [B, T, H] or [B, T, H, K] (g <= 0); and the
    run's logits [B, T, V] (the check that the model learned reads them).

    Each layer's gate is computed in a hook on its store, inside the layer's call, while its
    weights are at hand (a streamed model, ``storelab.checkpoint.stream``, holds them only then).
    ``at_rest``: a dict to fill with each such layer's gate at x = 0 (``rest_log_decay``)."""
    model.eval()
    seen: dict[int, torch.Tensor] = {}
    hooks = []
    for i in recurrent_layers(model):
        store = model.blocks[i].token

        def grab(mod, args, i=i):
            g = mod._log_decay(args[0])
            if g is not None:
                seen[i] = g.float()
                if at_rest is not None:
                    at_rest[i] = rest_log_decay(mod)
        hooks.append(store.register_forward_pre_hook(grab))
    try:
        logits_BTV, _ = model(inputs_BT)
    finally:
        for h in hooks:
            h.remove()
    return seen, logits_BTV


def half_lives(g: torch.Tensor) -> torch.Tensor:
    """Half-life in tokens per (document, head) from log decays [B, T, H(, K)] -> [B, H]."""
    per_tok = g.mean(dim=(1, 3)) if g.dim() == 4 else g.mean(dim=1)
    return math.log(2.0) / (-per_tok).clamp_min(1e-12)


@torch.no_grad()
def rest_log_decay(store) -> torch.Tensor:
    """A store's gate at x = 0, the bias term alone: [H] (a decay per head) or [H, K] (per key channel)."""
    w = next(store.parameters())
    zero_11D = torch.zeros(1, 1, store.cfg.d_model, device=w.device, dtype=w.dtype)
    return store._log_decay(zero_11D)[0, 0].float()


def channel_mixing(g_HK: torch.Tensor) -> dict:
    """Which channels fade to a thousandth within 64 tokens, and which heads mix such a channel
    with one that lasts longer, from the f = 0 log retentions [H, K]."""
    fades = WITHIN * g_HK <= math.log(FADE)
    return {"fades": fades, "mixes": fades.any(-1) & (~fades).any(-1)}


@torch.no_grad()
def kda_weight_estimate(store) -> dict:
    """Per head of one layer with a decay per key channel (KDA): the f = 0 log retention of each
    channel (its gate at x = 0, the bias term alone) and whether the head mixes."""
    g_HK = rest_log_decay(store)                                  # H K
    return {"log_retention": g_HK, **channel_mixing(g_HK)}


@torch.no_grad()
def forgetting(model, task=None, *, inputs=None, n: int = 8, seed: int = 0) -> dict:
    """Half-lives per recurrent head on ``n`` documents of ``task`` (or on ``inputs``) and the KDA estimate."""
    if inputs is None:
        if task is None:
            raise ValueError("task: forgetting needs a task or inputs")
        batch = task.sample(n, seed)
        inputs, targets, chance = batch.inputs, batch.targets, task.chance()
    else:       # documents: each token's target is the next one
        targets = torch.cat([inputs[:, 1:], torch.full_like(inputs[:, :1], IGNORE)], dim=1)
        chance = 1 / model.cfg.vocab_size
    at_rest: dict[int, torch.Tensor] = {}
    gates, logits_BTV = decay_gates(model, inputs, at_rest=at_rest)
    check = learned(next_token_accuracy(logits_BTV, targets, IGNORE), chance, what="next-token accuracy")
    heads = []      # (layer, head)
    cols = []
    for i, g in sorted(gates.items()):
        hl = half_lives(g)                                        # B H
        cols.append(hl)
        heads += [(i, h) for h in range(hl.shape[1])]
    out: dict = {"probe": "forgetting", "documents": int(inputs.shape[0]), "recurrent_layers": recurrent_layers(model)}
    if cols:
        hl_BN = torch.cat(cols, dim=1)                            # documents x heads
        per_head = hl_BN.median(dim=0).values
        rhos = [spearman(hl_BN[a], hl_BN[b]) for a in range(len(hl_BN)) for b in range(a + 1, len(hl_BN))]
        out.update({
            "heads": [{"layer": i, "head": h, "half_life": float(per_head[k])} for k, (i, h) in enumerate(heads)],
            "median_half_life": check.keep(float(per_head.median())),
            "ranking_stability": check.keep(float(sum(rhos) / len(rhos))) if rhos and len(heads) > 1 else None,
            "ranking_stability_min": check.keep(float(min(rhos))) if rhos and len(heads) > 1 else None,
        })
    else:
        out.update({"heads": [], "median_half_life": None, "ranking_stability": None})
    per_channel = [i for i, g in sorted(gates.items()) if g.dim() == 4]   # a decay per key channel (KDA)
    mixes = [channel_mixing(at_rest[i])["mixes"] for i in per_channel]
    if mixes:
        m = torch.cat(mixes)
        out["kda_heads"] = int(m.numel())
        out["kda_mixing_fraction"] = check.keep(float(m.float().mean()))
    else:
        out["kda_heads"], out["kda_mixing_fraction"] = 0, None
    out.update(accuracy=check.figures["accuracy"], chance=chance, essay=ESSAY_FORGET)
    return check.stamp(out)
