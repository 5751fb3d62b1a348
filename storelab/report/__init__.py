"""``storelab report``: the essay's claims beside what the code measures."""

from storelab.report.build import build_report

__all__ = ["build_report"]
