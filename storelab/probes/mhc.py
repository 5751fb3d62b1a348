"""Probe 4: does the mHC stream mixing matter, and where (after Zhao et al., arXiv 2609.05309)?

mHC (arXiv 2512.24880) updates its streams as ``X_{l+1} = B_l X_l + C_l F_l(A_l X_l)`` with a
token-dependent, nearly doubly stochastic mix ``B_l``. The probe replaces ``B_l`` (only B;
A and C stay) in the mixers of the first or the second half of the layers by

* ``identity``: no mixing between streams;
* ``average``:  its average over every token of the evaluation batch (a fixed mix);

and reports the loss and the perplexity change of each of the four against the model as
trained, where the model as trained has learned (``storelab.probes.validity``: its top-1
next-token accuracy on the same batch above chance; the changes are None otherwise, the
losses and perplexities kept). The replacement is done per mixer instance, on top of ``MHCMixer.coefficients``,
and undone afterwards.

On documents (``mhc_documents(model, documents, context=..., n=...)``; token ids, text through the
folder's tokenizer first): the documents concatenated (and repeated) into ``n`` rows of ``context``
tokens, perplexity = exp(mean next-token NLL) over every predicted token, the baseline's and each
condition's, and the relative change ppl / ppl_base - 1 (= exp(loss change) - 1).
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from storelab.probes.common import document_inputs
from storelab.probes.validity import learned, next_token_accuracy
from storelab.stores.depth import MHCConfig
from storelab.tasks import IGNORE, Batch

ESSAY_MHC = {"source": "Zhao et al., arXiv 2609.05309 (DeepSeek-V4-Flash), perplexity change",
             "identity_second_half": 0.019, "identity_first_half": 0.414, "average": 0.002}


def mhc_mixers(model, half: str) -> list:
    """The mHC mixers (token and channel sublayers) of the layers in the ``first`` or ``second`` half."""
    n = len(model.blocks)
    layers = range(0, n // 2) if half == "first" else range(n // 2, n)
    return [m for i in layers if isinstance(model.cfg.layers[i].depth, MHCConfig)
            for m in (model.blocks[i].depth_token, model.blocks[i].depth_channel)]


@contextmanager
def replaced_mix(mixers: list, make_mix):
    """Within the block, each mixer's B is ``make_mix(mixer, mix_BTNN)`` (A and C unchanged)."""
    for m in mixers:
        orig = type(m).coefficients.__get__(m)

        def coef(streams, m=m, orig=orig):
            pre, post, mix = orig(streams)
            return pre, post, make_mix(m, mix)
        m.coefficients = coef  # an instance attribute shadows the class's method
    try:
        yield
    finally:
        for m in mixers:
            del m.coefficients


@torch.no_grad()
def _loss(model, inputs, targets, *, accuracy: bool = False):
    """Mean next-token NLL over the scored targets; with ``accuracy``, (loss, top-1 accuracy)."""
    logits, _ = model(inputs)
    loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE).item()
    return (loss, next_token_accuracy(logits, targets, IGNORE)) if accuracy else loss


@torch.no_grad()
def mhc_ablation(model, task=None, *, batch=None, n: int = 32, seed: int = 0) -> dict:
    """Loss change when B is replaced by the identity or its token average, in either half of the layers.

    ``batch`` (documents; ``mhc_documents``) is checked against a uniform guess over the vocabulary,
    a task's batch against the task's ``chance()``."""
    model.eval()
    chance = 1 / model.cfg.vocab_size if batch is not None or task is None else task.chance()
    if batch is None:
        batch = task.sample(n, seed)
    if not mhc_mixers(model, "first") + mhc_mixers(model, "second"):
        raise ValueError("model: has no mHC depth mixer (depth = 'mhc')")
    base, acc = _loss(model, batch.inputs, batch.targets, accuracy=True)
    check = learned(acc, chance, what="next-token accuracy")
    # the average mix of each mixer over the batch's tokens
    means: dict[int, torch.Tensor] = {}
    every = mhc_mixers(model, "first") + mhc_mixers(model, "second")

    def record(m, mix):
        means[id(m)] = mix.mean(dim=(0, 1))
        return mix
    with replaced_mix(every, record):
        model(batch.inputs)
    out = {"probe": "mhc", "base_loss": base, "conditions": {}}
    for half in ("first", "second"):
        mixers = mhc_mixers(model, half)
        for name, fn in (("identity", lambda m, mix: torch.eye(mix.shape[-1], dtype=mix.dtype, device=mix.device).expand_as(mix)),
                         ("average", lambda m, mix: means[id(m)].expand_as(mix))):
            with replaced_mix(mixers, fn):
                loss = _loss(model, batch.inputs, batch.targets)
            out["conditions"][f"{name}_{half}_half"] = {
                "loss": loss, "loss_change": check.keep(loss - base),
                "perplexity_change": check.keep(math.exp(loss - base) - 1), "mixers": len(mixers)}
    out.update(essay=ESSAY_MHC, base_perplexity=math.exp(base), accuracy=acc, chance=chance)
    for cond in out["conditions"].values():
        cond["perplexity"] = math.exp(cond["loss"])
    return check.stamp(out)


@torch.no_grad()
def mhc_documents(model, documents: list[list[int]], *, context: int = 512, n: int = 8) -> dict:
    """``mhc_ablation`` on documents: perplexity of the next token over ``n`` rows of ``context`` tokens."""
    if context < 2:
        raise ValueError(f"context: needs at least 2 tokens (one to predict), got {context}")
    rows = document_inputs(documents, context + 1, n)
    out = mhc_ablation(model, batch=Batch(inputs=rows[:, :-1], targets=rows[:, 1:]))
    out.update(documents=len(documents), rows=n, context=context, tokens=n * context)
    return out
