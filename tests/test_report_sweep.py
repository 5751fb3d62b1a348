"""The dictionary hybrid's training options (``storelab.train.budget``), and section 8's sentence on which store
carries the value at each size (a point that measured nothing is left out and named)."""

from __future__ import annotations

import pytest

from storelab.report import sweep_section as sweep
from storelab.report.core import Context
from storelab.tasks import make_task
from storelab.train.budget import REPORT_PAIRS, dictionary_config, dictionary_task_options

def test_dictionary_task_options():
    assert dictionary_task_options() == {}
    assert dictionary_task_options((24, 73)) == dict(pairs_min=24, pairs_max=73, n_keys=81, n_values=81)
    assert dictionary_task_options((4, 4))["n_values"] == 32  # at least the preset's vocabulary
    assert dictionary_task_options((4, 4), n_symbols=72)["n_keys"] == 72
    with pytest.raises(ValueError, match="pairs"):
        dictionary_task_options((5, 4))
    with pytest.raises(ValueError, match="n_symbols"):
        dictionary_task_options((8, 8), n_symbols=8)


def test_report_run_is_four_times_the_context():
    before = make_task("dictionary", "small")
    cfg = dictionary_config(0, pairs=REPORT_PAIRS)
    after = make_task(cfg.task, cfg.task_preset, **cfg.task_options)
    t0, t1 = before.sample(2, 0).inputs.shape[1], after.sample(2, 0).inputs.shape[1]
    assert (t0, t1) == (41, 163) and t1 >= 4 * t0 - 1
    assert cfg.model_options == dictionary_config(0).model_options  # the same hybrid, the same budget


def test_crossing_sentence():
    def row(n, r, c):
        f = (lambda x: None if x is None else {"mean": x, "min": x, "max": x, "seeds": 3, "of": 3})
        return {"entries": n, "recurrent_fraction": f(r), "cache_fraction": f(c)}

    rows = [row(1, 0.7, 0.2), row(8, 0.4, 0.5), row(32, 0.1, 0.9)]
    said = sweep.crossing(rows, 8)
    assert said == "The store carrying the larger share, by entries: 1 (0.12 d): states; 8 (1 d): caches; 32 (4 d): caches."
    assert "At every measured size, 8 to 32 entries" in sweep.crossing(rows[1:], 8)
    said = sweep.crossing([rows[0], row(4, None, None), rows[1]], 8)      # a point not measured is left out, and said so
    assert said.endswith("Left out (no seed measured anything): 4 entries.") and "4 (0.5 d)" not in said
