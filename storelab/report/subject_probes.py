"""The probes of sections 7 and 8, run on the trained subjects (``storelab.subjects``) seed by seed.

Each probe runs on every seed of a subject; a figure is summarised over the seeds whose check passed
(``storelab.probes.validity``) as mean, lowest and highest, with how many seeds that is. A seed whose
model did not learn, or whose swap moved nothing, adds its reason instead of a figure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from storelab.probes.validity import NOT_LEARNED

__all__ = ["Subjects", "spread", "show", "combined"]


def spread(values: list[float | None]) -> dict[str, Any] | None:
    """Mean, lowest, highest over the figures present (a failed seed's figure is None); None if none is."""
    xs = [float(x) for x in values if x is not None]
    if not xs:
        return None
    return {"mean": sum(xs) / len(xs), "min": min(xs), "max": max(xs), "seeds": len(xs), "of": len(values)}


def show(s: dict[str, Any] | None, verdict: str = NOT_LEARNED, pct: bool = True) -> str:
    """"0.93 [0.91, 0.95], 3 of 3 seeds" (percent when ``pct``), or the verdict where no seed measured it."""
    if s is None:
        return verdict
    f = (lambda x: f"{x:.0%}") if pct else (lambda x: f"{x:.3g}")
    rng = "" if s["seeds"] == 1 else f" [{f(s['min'])}, {f(s['max'])}]"
    return f"{f(s['mean'])}{rng}, {s['seeds']} of {s['of']} seeds"


def combined(checks: list[dict]) -> dict:
    """One check for a figure summarised over seeds: valid where at least one seed's is; its reason lists
    the seeds that failed (each figure is still averaged over the valid seeds only)."""
    good = [c for c in checks if c["valid"]]
    bad = [(i, c) for i, c in enumerate(checks) if not c["valid"]]
    reason = "; ".join(f"seed {i}: {c['reason']}" for i, c in bad)
    if good:
        return {"valid": True, "verdict": "measured", "reason": reason or good[0]["reason"]}
    return {"valid": False, "verdict": checks[0]["verdict"] if checks else NOT_LEARNED,
            "reason": reason or "no seed"}


class Subjects:
    """The subjects of one folder, loaded once, probed per seed. Only the seeds that learned (their recipe's
    check, ``storelab.subjects.learned``) are probed; the others are listed with their verdicts
    (``left_out``). ``quick``: the first seed that learned only."""

    def __init__(self, folder: str | Path | None = None, *, quick: bool = False):
        from storelab.subjects import DATA

        self.folder = Path(folder) if folder is not None else DATA
        self.quick = quick
        self._cache: dict[tuple[str, int], tuple] = {}

    def get(self, name: str, seed: int):
        from storelab.subjects import load_subject

        if (name, seed) not in self._cache:
            self._cache[(name, seed)] = load_subject(name, seed, self.folder)
        return self._cache[(name, seed)]

    def metas(self, name: str) -> list[dict]:
        """Every shipped seed's recipe, learned or not."""
        from storelab.subjects import recipe

        return [self.get(name, s)[2] for s in recipe(name).seeds]

    def seeds(self, name: str) -> list[int]:
        """The seeds probed: those that learned (the first of them with ``quick``)."""
        good = [m["seed"] for m in self.metas(name) if m["learned"]]
        return good[:1] if self.quick else good

    def left_out(self, name: str) -> list[dict]:
        """The seeds that did not learn: seed and verdict (their figures are in no summary)."""
        return [{"seed": m["seed"], "verdict": m["verdict"]} for m in self.metas(name) if not m["learned"]]

    def each(self, name: str, probe: Callable[[Any, Any, int], dict]) -> list[dict]:
        """``probe(model, task, seed)`` on every probed seed of ``name``."""
        out = []
        for s in self.seeds(name):
            model, task, _ = self.get(name, s)
            out.append(probe(model, task, s))
        return out

    def at(self, name: str, entries: int, probe: Callable[..., dict], **kw) -> list[dict]:
        """``probe(model, task_with_that_many_entries, **kw)`` on every probed seed of ``name``."""
        from storelab.subjects import sized

        return self.each(name, lambda m, t, s: probe(m, sized(t, entries), **kw))
