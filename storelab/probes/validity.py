"""Is there an effect to measure? The check every probe makes before it reports a fraction of one.

A probe that divides (the share of an answer's shift a swap moves, retrieval with one store kept,
the perplexity change of an ablation, the half-lives of what a model learned to forget) measures
what a *trained* model does. On a model that has not learned its task the division is noise: a
hybrid at chance retrieval whose "recurrent states moved 193 % of the answer's shift" measured
nothing (issue 29). So each such probe first checks, here, in one place:

1. **learned**: the base model answers above chance by ``MARGIN`` (absolute):
   ``accuracy >= chance + MARGIN``;
2. **an effect to divide** (swaps only): the donor moves the answer, the mean logit difference
   ``logit[b] - logit[a]`` of the donor's run minus the base's, by at least ``MIN_SHIFT`` nats
   (a factor e ~ 2.7 in the odds of b against a).

The result is a ``Validity``: ``valid``, a ``verdict`` (``MEASURED``, ``NOT_LEARNED``,
``NO_EFFECT``), a ``reason`` that states the figures beside the thresholds, e.g.
``"not learned: answer accuracy 0.012 vs chance 0.012 (needs >= chance + 0.2)"``, and the
figures and thresholds themselves. ``stamp(result)`` writes ``valid``, ``reason`` and
``validity`` into a probe's result (what ``storelab probe --json`` prints). Where the check fails
the probe reports ``None`` for every fraction and keeps the figures that show why (accuracy,
chance, the raw logit differences, losses); the report and ``storelab probe`` print the verdict in
the fraction's place.

What each probe checks (``accuracy``, ``chance``):

==============  ================================================  =================================
probe           accuracy                                          chance
==============  ================================================  =================================
state_swap      the clean prompt's answer token is right          the task's ``chance()`` (text:
                (and the shift above)                             1 / vocabulary)
keep_one        retrieval and compliance with both stores, each   1 / values and 1 / languages
                checked alone (paired: both)                      (text: the candidates' share)
forgetting,     next-token accuracy on the probe's own inputs     the task's ``chance()``
mhc             (the task's scored tokens, or the documents')     (documents: 1 / vocabulary)
==============  ================================================  =================================

The thresholds are read when a check runs, so a caller may state others (tests pass every check by
setting them out of reach, to read the arithmetic under it on untrained models).

The weights-only forgetting estimate (``gate_weights``) runs no model and so has no answer to
check; the report reads it as measured only where the same model's forgetting probe on text is.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["MARGIN", "MIN_SHIFT", "MEASURED", "NOT_LEARNED", "NO_EFFECT", "Validity", "learned", "swap_effect",
           "all_of", "next_token_accuracy"]

MARGIN = 0.2      # the base model's accuracy must exceed chance by this much (absolute)
MIN_SHIFT = 1.0   # the donor must move the mean logit difference by this many nats

MEASURED, NOT_LEARNED, NO_EFFECT = "measured", "not learned", "no effect to divide"


def _g(x: float) -> str:
    return f"{x:.3g}"


@dataclass(frozen=True)
class Validity:
    """Whether a probe's fractions measure something, with the figures and thresholds that decide it."""

    valid: bool
    verdict: str                                   # MEASURED, NOT_LEARNED or NO_EFFECT
    reason: str                                    # the figures beside the thresholds, in words
    figures: dict[str, Any] = field(default_factory=dict)      # accuracy, chance, shift (by part: ``all_of``)
    thresholds: dict[str, Any] = field(default_factory=dict)   # margin, min_accuracy, min_shift (the same)

    def as_dict(self) -> dict:
        return asdict(self)

    def keep(self, value):
        """``value`` where the check passed, else None (no fraction of an effect that is not there)."""
        return value if self.valid else None

    def stamp(self, result: dict) -> dict:
        """``result`` with ``valid``, ``reason`` and ``validity`` (this, as a dict) written in; returned."""
        result.update(valid=self.valid, reason=self.reason, validity=self.as_dict())
        return result


def learned(accuracy: float, chance: float, *, what: str = "answer accuracy", margin: float | None = None) -> Validity:
    """Valid when ``accuracy >= chance + margin`` (default ``MARGIN``, read at the call)."""
    margin = MARGIN if margin is None else margin
    figures = {"accuracy": accuracy, "chance": chance}
    thresholds = {"margin": margin, "min_accuracy": chance + margin}
    said = f"{what} {_g(accuracy)} vs chance {_g(chance)} (needs >= chance + {_g(margin)})"
    if accuracy >= chance + margin - 1e-12:
        return Validity(True, MEASURED, f"learned: {said}", figures, thresholds)
    return Validity(False, NOT_LEARNED, f"{NOT_LEARNED}: {said}", figures, thresholds)


def swap_effect(accuracy: float, chance: float, shift: float, *, what: str = "answer accuracy",
                margin: float | None = None, min_shift: float | None = None) -> Validity:
    """Learned (``learned``), and the donor moves the mean logit difference by ``shift >= min_shift``
    (default ``MIN_SHIFT``, read at the call)."""
    min_shift = MIN_SHIFT if min_shift is None else min_shift
    base = learned(accuracy, chance, what=what, margin=margin)
    figures = {**base.figures, "shift": shift}
    thresholds = {**base.thresholds, "min_shift": min_shift}
    if not base.valid:
        return Validity(False, NOT_LEARNED, base.reason, figures, thresholds)
    said = f"the donor moved the logit difference by {_g(shift)} (needs >= {_g(min_shift)})"
    if shift >= min_shift:
        return Validity(True, MEASURED, f"{base.reason}; {said}", figures, thresholds)
    return Validity(False, NO_EFFECT, f"{NO_EFFECT}: {said}", figures, thresholds)


def all_of(checks: dict[str, Validity]) -> Validity:
    """One verdict for several checks (keep_one's retrieval and compliance): valid when each is; the
    reason names each failing part (or each part, when all pass); figures and thresholds by part."""
    if not checks:
        return Validity(False, NOT_LEARNED, f"{NOT_LEARNED}: nothing the model was asked could be scored")
    bad = {k: v for k, v in checks.items() if not v.valid}
    shown = bad or checks
    reason = "; ".join(f"{k}: {v.reason}" for k, v in shown.items())
    verdict = MEASURED if not bad else next(iter(bad.values())).verdict
    return Validity(not bad, verdict, reason, {k: v.figures for k, v in checks.items()},
                    {k: v.thresholds for k, v in checks.items()})


def next_token_accuracy(logits_BTV, targets_BT, ignore: int) -> float:
    """Top-1 accuracy over the scored positions (targets other than ``ignore``); 0 when none."""
    scored = targets_BT != ignore
    if not bool(scored.any()):
        return 0.0
    return float((logits_BTV.argmax(-1) == targets_BT)[scored].float().mean())
