"""Stores by what they are: a model's layers partitioned by their token store's config, and the report's units.

``store_group(cfg)`` reads only what a store config declares (``RECURRENT``, ``cache_window()``,
``cache_chunk()``, ``SELECTS``, ``CACHE_SHARING``), never a list of kind names, so a kind added later
falls into its group by what it says of itself:

==============  ====================================================================
group           the layers whose token store ...
==============  ====================================================================
recurrent st.   keeps a fixed-size state (``RECURRENT``)
window caches   keeps the last W entries (``cache_window() > 0``)
chunk caches    keeps the entries of its chunk (``cache_chunk() > 0``)
selected c.     keeps every entry, reads a selection (``SELECTS``)
latent caches   keeps a latent entry per token that readers share (``CACHE_SHARING == "latent"``)
global caches   keeps an entry for every token and reads them all
==============  ====================================================================

``AXES`` are the groups every report row states, present or not ("no recurrent layers"): the two
the essay's measurements oppose (window against global caches; recurrent states against caches).

The units the probes speak in: a share is a percentage with its 95 % interval (``Share``), never a
bare float; ``ratio_share`` bootstraps the interval of a swap's share of the answer's shift over the
prompts; ``rate_share`` gives a rate's Wilson interval.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

__all__ = ["RECURRENT", "WINDOW", "CHUNK", "SELECTED", "LATENT", "GLOBAL", "GROUP_WORDS", "AXES", "store_group", "groups_of", "Share", "ratio_share", "rate_share"]

RECURRENT, WINDOW, CHUNK, SELECTED, LATENT, GLOBAL = ("recurrent states", "window caches", "chunk caches",
                                                     "selected caches", "latent caches", "global caches")
GROUP_WORDS = {g: g for g in (RECURRENT, WINDOW, CHUNK, SELECTED, LATENT, GLOBAL)}
AXES = (WINDOW, GLOBAL, RECURRENT)


def store_group(cfg) -> str:
    """The group of a layer's token store config (see the module docstring)."""
    if cfg.RECURRENT:
        return RECURRENT
    if cfg.cache_window():
        return WINDOW
    if cfg.cache_chunk():
        return CHUNK
    if cfg.SELECTS:
        return SELECTED
    if cfg.CACHE_SHARING == "latent":
        return LATENT
    return GLOBAL


def groups_of(model) -> dict[str, list[int]]:
    """The model's layers by group, in layer order (only the groups it has)."""
    out: dict[str, list[int]] = {}
    for i, lay in enumerate(model.cfg.layers):
        out.setdefault(store_group(lay.token), []).append(i)
    return out


@dataclass(frozen=True)
class Share:
    """A share in percent with its 95 % interval (``low``, ``high``, percent) and how many it counts."""

    percent: float
    low: float
    high: float
    n: int

    def __str__(self) -> str:
        return f"{self.percent:.0f} % [{self.low:.0f}, {self.high:.0f}]"

    def as_dict(self) -> dict:
        return {"percent": round(self.percent, 2), "interval": [round(self.low, 2), round(self.high, 2)],
                "n": self.n, "text": str(self)}


def _ratio(p: list[float], a: list[float], b: list[float], idx: list[int]) -> float | None:
    mp, ma, mb = (sum(x[i] for i in idx) / len(idx) for x in (p, a, b))
    return None if abs(mb - ma) < 1e-9 else (mp - ma) / (mb - ma)


def ratio_share(patched: list[float], base: list[float], donor: list[float], *, boot: int = 1000,
                seed: int = 0) -> Share | None:
    """``(mean patched - mean base) / (mean donor - mean base)`` in percent, its interval the 2.5th and 97.5th
    percentiles over ``boot`` resamplings of the prompts (each prompt's three logit differences together)."""
    n = len(patched)
    if n == 0:
        return None
    mid = _ratio(patched, base, donor, list(range(n)))
    if mid is None:
        return None
    r = random.Random(seed)
    xs = sorted(v for v in (_ratio(patched, base, donor, [r.randrange(n) for _ in range(n)]) for _ in range(boot))
                if v is not None)
    lo, hi = (xs[int(0.025 * (len(xs) - 1))], xs[int(0.975 * (len(xs) - 1))]) if xs else (mid, mid)
    return Share(100 * mid, 100 * lo, 100 * hi, n)


def rate_share(hits: int, n: int) -> Share | None:
    """``hits / n`` in percent with its Wilson 95 % interval."""
    if n == 0:
        return None
    z, p = 1.96, hits / n
    den = 1 + z * z / n
    c = (p + z * z / (2 * n)) / den
    h = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return Share(100 * p, 100 * max(0.0, c - h), 100 * min(1.0, c + h), n)
