"""Shared pieces of the capacity lab: rows, curves, seeded sampling, load search, theory helpers.

Every experiment returns a ``Result``: table rows (one per criterion and size) and curves
(measured points beside a theory line) for the plots. A row's ``measured`` is always a
measurement: the load where a criterion crosses, found by bisection over the load with a few
seeds (``bisect_mean`` for averaged statistics such as the interference-to-signal ratio,
``bisect_last_ok`` per seed for all-or-nothing criteria such as "every stored value wins").

Shape legend: M stored pairs, Q queries, d key/value width, N neurons or bits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch
from torch import Tensor


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed))


def unit_rows(n: int, d: int, g: torch.Generator, dtype: torch.dtype = torch.float32) -> Tensor:
    """n random vectors, uniform on the unit sphere of R^d (normalized Gaussians)."""
    x = torch.randn(n, d, generator=g, dtype=dtype)
    return x / x.norm(dim=-1, keepdim=True)


def signs(n: int, d: int, g: torch.Generator, dtype: torch.dtype = torch.float32) -> Tensor:
    """n random +-1 patterns of N=d bits."""
    return torch.randint(0, 2, (n, d), generator=g).to(dtype) * 2 - 1


# ----------------------------------------------------------------------------------- rows


def row(experiment: str, d: int, criterion: str, theory: float | None, essay: float | None,
        measured: float | None, note: str = "") -> dict:
    """One table row; ``ratio`` is measured/essay (None where the essay gives no number)."""
    ratio = None
    if measured is not None and essay not in (None, 0):
        ratio = measured / essay
    return {"experiment": experiment, "d": int(d), "criterion": criterion, "theory": _num(theory),
            "essay": _num(essay), "measured": _num(measured), "ratio": _num(ratio), "note": note}


def _num(x):
    return None if x is None else float(x)


@dataclass
class Curve:
    """Measured points and a theory line, drawn into one panel of an experiment's figure."""

    title: str
    xlabel: str
    ylabel: str
    series: list[dict] = field(default_factory=list)  # {"label", "x", "y", "kind": "measured"|"theory"}
    logx: bool = False
    logy: bool = False
    hline: float | None = None

    def measured(self, label: str, x: Sequence[float], y: Sequence[float]) -> "Curve":
        self.series.append({"label": label, "x": list(map(float, x)), "y": list(map(float, y)), "kind": "measured"})
        return self

    def theory(self, label: str, x: Sequence[float], y: Sequence[float]) -> "Curve":
        self.series.append({"label": label, "x": list(map(float, x)), "y": list(map(float, y)), "kind": "theory"})
        return self


@dataclass
class Result:
    rows: list[dict] = field(default_factory=list)
    curves: list[Curve] = field(default_factory=list)


# ----------------------------------------------------------------------------- load search


def bisect_mean(stat: Callable[[int], float], lo: int, hi: int, *, target: float = 1.0,
                rel_tol: float = 0.01, points: list | None = None) -> float:
    """The load M where an increasing averaged statistic crosses ``target``.

    ``stat(M)`` must already average over seeds. Bisection is geometric (the bracket may span
    decades); once the bracket is tight the crossing is interpolated linearly between its ends.
    Every evaluation is appended to ``points`` as (M, stat).
    """
    pts = points if points is not None else []
    f_lo, f_hi = stat(lo), stat(hi)
    pts += [(lo, f_lo), (hi, f_hi)]
    while f_hi < target:  # widen upwards
        lo, f_lo, hi = hi, f_hi, hi * 2
        f_hi = stat(hi)
        pts.append((hi, f_hi))
    while f_lo >= target and lo > 1:
        hi, f_hi, lo = lo, f_lo, max(1, lo // 2)
        f_lo = stat(lo)
        pts.append((lo, f_lo))
    while hi - lo > 1 and hi / lo - 1 > rel_tol:
        mid = int(round(math.sqrt(lo * hi)))
        mid = min(max(mid, lo + 1), hi - 1)
        f = stat(mid)
        pts.append((mid, f))
        if f >= target:
            hi, f_hi = mid, f
        else:
            lo, f_lo = mid, f
    if f_hi == f_lo:
        return float(hi)
    return lo + (target - f_lo) * (hi - lo) / (f_hi - f_lo)


def bisect_last_ok(ok: Callable[[int], bool], lo: int, hi: int, *, rel_tol: float = 0.01) -> int:
    """The largest M in [lo, hi] with ``ok(M)`` true, assuming ok is true then false.

    Widens the bracket downwards if ``ok(lo)`` fails and upwards while ``ok(hi)`` holds.
    """
    while not ok(lo) and lo > 1:
        hi, lo = lo, max(1, lo // 2)
    while ok(hi):
        lo, hi = hi, hi * 2
    while hi - lo > 1 and hi / lo - 1 > rel_tol:
        mid = min(max(int(round(math.sqrt(lo * hi))), lo + 1), hi - 1)
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return lo


# ---------------------------------------------------------------------------------- theory


def solve_n_log_n(c: float) -> float:
    """The n with n ln n = c, by Newton's method (Barnfield et al., arXiv 2605.05189)."""
    n = max(c / max(math.log(max(c, 3.0)), 1.0), 2.0)
    for _ in range(100):
        step = (n * math.log(n) - c) / (math.log(n) + 1)
        n -= step
        if abs(step) < 1e-10 * n:
            break
    return n


def sphere_moment(d: int, k: int) -> float:
    """E[s^k] for the overlap s of two independent random unit vectors in R^d (k even)."""
    if k % 2:
        return 0.0
    out = 1.0
    for i in range(k // 2):
        out *= (2 * i + 1) / (d + 2 * i)
    return out


def sphere_log_mgf(d: int, t: float) -> float:
    """ln E[exp(t s)] for the overlap s of two random unit vectors in R^d.

    s has density proportional to (1 - s^2)^((d-3)/2) on [-1, 1]; integrated numerically in
    log space (Gaussian approximation: t^2 / (2d)).
    """
    s = np.linspace(-1.0, 1.0, 400_001)[1:-1]
    logw = 0.5 * (d - 3) * np.log1p(-s * s)
    a = logw + t * s
    m0, m1 = logw.max(), a.max()
    return float(m1 + np.log(np.exp(a - m1).sum()) - m0 - np.log(np.exp(logw - m0).sum()))


def normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2))


def normal_quantile(p: float) -> float:
    """Inverse of the standard normal CDF, by bisection on erfc (no scipy needed)."""
    lo, hi = -40.0, 40.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if normal_cdf(mid) < p:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def solve_increasing(f: Callable[[float], float], target: float, lo: float, hi: float, iters: int = 200) -> float:
    """x in [lo, hi] with f(x) = target for increasing f, by bisection (geometric if lo > 0)."""
    for _ in range(iters):
        mid = math.sqrt(lo * hi) if lo > 0 else 0.5 * (lo + hi)
        if f(mid) < target:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def fit_exponent(x: Sequence[float], y: Sequence[float]) -> float:
    """Least-squares slope of log y against log x."""
    lx, ly = np.log(np.asarray(x, float)), np.log(np.asarray(y, float))
    return float(np.polyfit(lx, ly, 1)[0])
