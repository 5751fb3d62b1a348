"""The report's trained hybrid at a longer context, and section 8's sweep of dictionary entries against the
recurrent state's capacity, at tiny sizes (seconds of training: the structure, not what is learned; a point
that did not learn keeps no fraction, ``storelab.probes.validity``)."""

from __future__ import annotations

import math

import pytest

from storelab.report import sweep_section as sweep
from storelab.report.core import Context
from storelab.tasks import make_task
from storelab.train.budget import REPORT_PAIRS, dictionary_config, dictionary_task_options

TINY = dict(task_preset="tiny", threads=1, batch_size=8, eval_examples=8)


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


def test_capacity_sweep_rows():
    rows = sweep.capacity_sweep((4, 8), seconds_each=1.0, n_probe=8, **TINY)
    assert [r["entries"] for r in rows] == [4, 8]
    for r in rows:
        assert r["d"] == 32 and r["entries_over_d"] == r["entries"] / 32
        assert r["prompt_tokens"] == 2 * r["entries"] + 17  # BOS LANG, n pairs, 4 query blocks
        assert r["steps"] >= 1 and 0 <= r["retrieval"] <= 1
        assert 0 <= r["answer_accuracy"] <= 1 and r["chance"] > 0
        if r["valid"]:     # a second of training rarely learns; then the check withholds the fractions
            assert math.isfinite(r["recurrent_fraction"]) and math.isfinite(r["cache_fraction"])
        else:
            assert r["recurrent_fraction"] is None and r["cache_fraction"] is None
            assert r["reason"].startswith(("not learned", "no effect to divide"))
    assert rows[0]["params"] == rows[1]["params"]  # one vocabulary for every point


def test_sweep_section_renders(monkeypatch, tmp_path):
    monkeypatch.setattr(sweep, "QUICK_ENTRIES", (4, 40))
    monkeypatch.setattr(sweep, "QUICK_SECONDS_EACH", 1.0)
    res = sweep.sweep_section(Context(out=tmp_path, quick=True))
    (table,) = res.tables
    assert [row[0] for row in table.rows] == [4, 40] and len(table.columns) == len(table.rows[0])
    assert "d = 32" in res.text and ("At every point" in res.text or "between 4 and 40" in res.text
                                     or "No point measured anything" in res.text)
    assert [r["entries"] for r in res.data["rows"]] == [4, 40]


def test_crossing_sentence():
    rows = [{"entries": 4, "entries_over_d": 0.125, "recurrent_fraction": 0.7, "cache_fraction": 0.2, "valid": True},
            {"entries": 64, "entries_over_d": 2.0, "recurrent_fraction": 0.1, "cache_fraction": 0.9, "valid": True}]
    assert "from the states to the caches between 4 and 64" in sweep._crossing(rows)
    assert "the attention caches" in sweep._crossing(rows[1:])
    lost = {"entries": 32, "entries_over_d": 1.0, "recurrent_fraction": None, "cache_fraction": None, "valid": False,
            "reason": "not learned: answer accuracy 0.01 vs chance 0.02 (needs >= chance + 0.2)"}
    said = sweep._crossing([rows[0], lost, rows[1]])       # a point that did not learn is left out, and said so
    assert "between 4 and 64" in said and "The points at 32 entries are left out: not learned" in said
