"""The report's machinery: sections that may fail alone, claims, and the ledger.

A section is a function ``run(ctx) -> SectionResult``. Each runs inside its own
try/except: an exception marks that section failed (with its traceback) and the
others still render. Sections add ``Claim`` rows; the claim ledger is the union of
them. A claim carries the essay's wording and value (the only things typed in by
hand) and the value the code computed or measured; its status is derived here.
A trained model's claim (``checked_claim``) is decided only from a figure its probe
checked (``storelab.probes.validity``); otherwise it is "not measured", with the reason.
"""

from __future__ import annotations

import math
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

REPRODUCED, DIFFERS, NOT_CHECKABLE, FAILED = "reproduced", "differs", "not checkable", "failed"
NOT_MEASURED = "not measured"   # a trained model's claim whose probe found no effect to measure
STATUSES = (REPRODUCED, DIFFERS, NOT_CHECKABLE, NOT_MEASURED, FAILED)
TRAINED_TOLERANCE = 0.25        # relative, for a trained model's figure where the essay gives one value


@dataclass
class Claim:
    """One quantitative claim of the essay beside what the code computed."""

    section: str
    claim: str                    # the essay's wording (short)
    essay: float | str | None     # the essay's value
    measured: float | str | None  # computed or measured by the code (None when not checkable)
    tolerance: float = 0.03       # relative tolerance for "reproduced"
    reason: str = ""              # why it differs / why it is not checkable / how measured
    status: str = ""
    within: tuple[float, float] | None = None  # the essay's range, where it gives one: reproduced inside it

    def __post_init__(self) -> None:
        if self.status:
            return
        if self.measured is None:
            self.status = NOT_CHECKABLE
        elif self.within is not None and isinstance(self.measured, (int, float)):
            lo, hi = self.within
            self.status = REPRODUCED if lo <= float(self.measured) <= hi else DIFFERS
        elif isinstance(self.essay, (int, float)) and isinstance(self.measured, (int, float)):
            ok = math.isclose(float(self.measured), float(self.essay), rel_tol=self.tolerance, abs_tol=1e-9)
            self.status = REPRODUCED if ok else DIFFERS
        else:
            self.status = REPRODUCED if str(self.measured) == str(self.essay) else DIFFERS

    @property
    def ratio(self) -> float | None:
        if isinstance(self.essay, (int, float)) and isinstance(self.measured, (int, float)) and self.essay:
            return float(self.measured) / float(self.essay)
        return None

    def as_dict(self) -> dict[str, Any]:
        return {"section": self.section, "claim": self.claim, "essay": self.essay, "measured": self.measured,
                "ratio": self.ratio, "status": self.status, "reason": self.reason}


def checked_claim(section: str, claim: str, essay: float, measured: float | None, check: dict | None, *,
                  within: tuple[float, float] | None = None, tolerance: float = TRAINED_TOLERANCE,
                  reason: str = "") -> Claim:
    """A claim on a trained model's figure, decided (reproduced or differs) only from a checked figure:
    inside the essay's range ``within`` where it gives one, else within ``tolerance`` of ``essay``.

    ``check``: the probe's ``validity`` (``storelab.probes.validity.Validity.as_dict``). Where it failed
    the claim is NOT_MEASURED, its reason the check's ("not measured: model did not learn (...)");
    without a check (the probe did not run) a missing figure is NOT_CHECKABLE, as for any claim."""
    if check is not None and not check["valid"]:
        why = "model did not learn" if check.get("verdict") == "not learned" else "no effect to divide"
        return Claim(section, claim, essay, None, tolerance, f"not measured: {why} ({check['reason']})",
                     status=NOT_MEASURED, within=within)
    return Claim(section, claim, essay, measured, tolerance, reason, within=within)


@dataclass
class Table:
    title: str
    columns: list[str]
    rows: list[list[Any]]


@dataclass
class SectionResult:
    text: str = ""                                        # a paragraph of prose (plain text)
    tables: list[Table] = field(default_factory=list)
    figures: list[Path] = field(default_factory=list)     # PNG files written into the output folder
    claims: list[Claim] = field(default_factory=list)
    data: Any = None                                      # JSON-able data for report.json


@dataclass
class Section:
    key: str
    title: str
    run: Callable[["Context"], SectionResult]


@dataclass
class Context:
    out: Path
    quick: bool
    seed: int = 0
    checkpoint: Path | None = None   # a model folder: the checkpoint section runs the probes on it
    stream: bool = False             # read its layers' weights during their calls
    device: str = "cpu"              # where the checkpoint's model runs (storelab report --device)
    dtype: str | None = None         # its parameters' dtype (None: the checkpoint's own)
    subjects: Path | None = None     # the trained subjects sections 7 and 8 probe (None: the shipped ones)
    full: bool = False               # the large sizes (storelab report --full): section 9's real-model probes


@dataclass
class SectionOutcome:
    section: Section
    ok: bool
    seconds: float
    result: SectionResult | None = None
    error: str = ""


def run_sections(sections: list[Section], ctx: Context, on_start: Callable[[Section], None] | None = None,
                 on_end: Callable[[SectionOutcome], None] | None = None) -> list[SectionOutcome]:
    outcomes = []
    for s in sections:
        if on_start:
            on_start(s)
        t0 = time.perf_counter()
        try:
            res = s.run(ctx)
            oc = SectionOutcome(s, True, time.perf_counter() - t0, res)
        except Exception:  # a failing experiment must not take the report down
            oc = SectionOutcome(s, False, time.perf_counter() - t0, error=traceback.format_exc())
        outcomes.append(oc)
        if on_end:
            on_end(oc)
    return outcomes


def ledger(outcomes: list[SectionOutcome]) -> list[Claim]:
    return [c for oc in outcomes if oc.ok and oc.result for c in oc.result.claims]
