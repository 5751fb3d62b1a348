"""No fraction from a model that has not learned (issue 29): the probes' check, in the API, the JSON, the
tables and the report's sections.

Two kinds of subject: untrained tiny models (the check must fail: "not learned", no fraction anywhere), and
models whose answers are right by construction, so the check passes and the figures are known:

* ``Oracle``: a stand-in for a trained hybrid on the dictionary task (the probes' model protocol:
  ``cfg.layers[i].token.RECURRENT``, ``new_cache``, ``relink``, ``__call__(ids, cache)``). Its
  "recurrent" layer keeps the requested language, its "cache" layer the dictionary, exactly the essay's
  division: the caches move the whole shift, the states none; the language survives with the state alone.
* ``copier``: a real storelab model whose LM head is its (scaled) embedding, so it predicts that each
  token repeats: on documents of repeated tokens its next-token accuracy is 1 (forgetting, mHC).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

from storelab.cli import app
from storelab.models.model import LayerState, Model
from storelab.probes import forgetting, keep_one, mhc_ablation, mhc_documents, state_swap
from storelab.probes.validity import MARGIN, MIN_SHIFT, NO_EFFECT, NOT_LEARNED, all_of, learned, swap_effect
from storelab.report.core import NOT_MEASURED, Claim, Context, checked_claim
from storelab.report.probe_figures import write_figures
from storelab.report.probe_rows import probe_rows
from storelab.tasks import make_task, task_dict, tiny_dictionary
from storelab.train.models import resolve_model

SMALL = dict(d_model=32, n_heads=2, head_dim=16, d_ff=64)
FRACTIONS = ("recurrent_fraction", "cache_fraction")


# -- subjects -------------------------------------------------------------------------------------
class Tape:
    """The Oracle's per-layer state: every token id its layer has read, [B, T]."""

    def __init__(self, ids: torch.Tensor | None = None):
        self.ids = ids

    def clone(self) -> "Tape":
        return Tape(None if self.ids is None else self.ids.clone())


class Oracle:
    """Answers the dictionary task right: the value of the asked key read from layer 1's tape (a cache),
    written in the language read from layer 0's (a recurrent state); ``confidence`` is the answer's logit."""

    def __init__(self, task, confidence: float = 10.0):
        self.task, self.confidence = task, confidence
        layers = [SimpleNamespace(token=SimpleNamespace(RECURRENT=rec, KIND=kind))
                  for rec, kind in ((True, "tape-state"), (False, "tape-cache"))]
        self.cfg = SimpleNamespace(layers=layers, n_layers=2, vocab_size=task.vocab_size, name="oracle")

    def eval(self):
        return self

    def new_cache(self) -> list[LayerState]:
        return [LayerState(token=Tape()), LayerState(token=Tape())]

    def relink(self, cache):
        return cache

    def _answer(self, state: torch.Tensor, kept: torch.Tensor) -> int:
        t = self.task
        langs = state[(state >= t.lang_start) & (state < t.lang_start + t.n_languages)]
        lang = int(langs[0]) - t.lang_start if len(langs) else 0
        value = 0                                    # without the dictionary: a fixed guess
        if len(kept) >= 3:                           # ... QUERY key ANSWER
            where = (kept[:-2] == kept[-2]).nonzero().flatten()
            if len(where) and t.value_start <= int(kept[where[0] + 1]) < t.value_start + t.n_values:
                value = int(kept[where[0] + 1]) - t.value_start
        return int(t.write(torch.tensor(lang), torch.tensor(value)))

    def __call__(self, ids_BT: torch.Tensor, cache=None):
        cache = self.new_cache() if cache is None else cache
        for st in cache:
            st.token.ids = ids_BT if st.token.ids is None else torch.cat([st.token.ids, ids_BT], dim=1)
        logits = torch.zeros(*ids_BT.shape, self.cfg.vocab_size)
        for b in range(ids_BT.shape[0]):
            logits[b, -1, self._answer(cache[0].token.ids[b], cache[1].token.ids[b])] = self.confidence
        return logits, cache


def untrained(name: str, task, **opts) -> Model:
    torch.manual_seed(0)
    return Model(resolve_model(name, task.vocab_size, **{**SMALL, **opts})).eval()


def copier(name: str, vocab: int, **opts) -> Model:
    """A model that predicts its input token again (LM head = 100 x the embedding)."""
    torch.manual_seed(0)
    m = Model(resolve_model(name, vocab, **opts)).eval()
    with torch.no_grad():
        m.embed.weight.mul_(100.0)
        m.lm_head.weight.copy_(m.embed.weight)
    return m


@pytest.fixture(scope="module")
def dic():
    return tiny_dictionary()


def no_fraction_in(rows: list[list]) -> None:
    """No row that names a fraction, a share or a rate of one store holds a number."""
    for figure, ours, *_ in rows:
        if any(w in figure for w in ("moved", "alone", "flipped", "only", "paired", "half-life", "Spearman",
                                     "mixing", "perplexity change")):
            assert not isinstance(ours, float), (figure, ours)


# -- the check itself -----------------------------------------------------------------------------
def test_the_check_on_constructed_figures():
    v = learned(0.0117, 0.012)
    assert not v.valid and v.verdict == NOT_LEARNED and v.keep(1.93) is None
    assert v.reason == f"not learned: answer accuracy 0.0117 vs chance 0.012 (needs >= chance + {MARGIN:g})"
    assert v.thresholds == {"margin": MARGIN, "min_accuracy": pytest.approx(0.012 + MARGIN)}
    assert learned(0.012 + MARGIN, 0.012).valid and not learned(0.011 + MARGIN, 0.012).valid   # the edge
    e = swap_effect(0.98, 0.012, 0.5)
    assert not e.valid and e.verdict == NO_EFFECT and e.reason.startswith("no effect to divide: the donor moved")
    assert e.figures == {"accuracy": 0.98, "chance": 0.012, "shift": 0.5} and e.thresholds["min_shift"] == MIN_SHIFT
    ok = swap_effect(0.98, 0.012, 9.0)
    assert ok.valid and ok.keep(0.97) == 0.97 and "learned" in ok.reason and "9" in ok.reason
    assert swap_effect(0.0, 0.012, 9.0).verdict == NOT_LEARNED     # learned is checked first
    both = all_of({"retrieval": ok, "compliance": v})
    assert not both.valid and both.reason.startswith("compliance: not learned") and "retrieval" not in both.reason
    d = ok.stamp({"probe": "x"})
    assert d["valid"] is True and d["reason"] == ok.reason and d["validity"]["verdict"] == "measured"


# -- untrained: not learned, no fraction ----------------------------------------------------------
def test_untrained_hybrid_swap_and_keep_one_say_not_learned(dic):
    m = untrained("hybrid", dic)
    s = state_swap(m, dic, n=12, seed=0)
    assert s["valid"] is False and s["reason"].startswith("not learned: answer accuracy")
    assert s["validity"]["figures"]["chance"] == s["chance"] == dic.chance()
    assert all(s[k] is None for k in FRACTIONS) and set(s["answers_flipped"].values()) == {None}
    assert set(s["logit_diff"]) == {"clean", "corrupt", "recurrent", "cache"}      # the raw figures stay
    k = keep_one(m, dic, n=16, seed=0)
    assert k["valid"] is False and "not learned" in k["reason"]
    assert k["full"]["retrieval"] is not None and k["chance"]["retrieval"] == 1 / dic.n_values
    for c in ("cache_only", "state_only"):
        assert k[c] == {"retrieval": None, "compliance": None}
    assert set(k["paired"].values()) == {None}
    for name, r in (("state_swap", s), ("keep_one", k)):
        rows = probe_rows(name, r)
        assert rows[0][0].startswith("check") and "not learned" in rows[0][1]
        assert "not learned" in [row[1] for row in rows]
        no_fraction_in(rows)


def test_untrained_forgetting_and_mhc_say_not_learned(dic):
    f = forgetting(untrained("gated_deltanet", dic, n_layers=2), dic, n=4)
    assert f["valid"] is False and f["median_half_life"] is None and f["ranking_stability"] is None
    assert f["heads"] and all(h["half_life"] > 0 for h in f["heads"])        # each head's figure is kept
    no_fraction_in(probe_rows("forgetting", f))
    r = mhc_ablation(untrained("pattern:KA", dic, depth="mhc"), dic, n=4)
    assert r["valid"] is False and r["chance"] == dic.chance()
    assert all(c["perplexity_change"] is None and c["loss_change"] is None and c["loss"] > 0
               for c in r["conditions"].values())
    no_fraction_in(probe_rows("mhc", r))


def test_cli_json_has_the_check_per_result(dic):
    res = CliRunner().invoke(app, ["probe", "all", "--model", "hybrid", "--task", "dictionary", "--n", "4",
                                   "--json"])
    assert res.exit_code == 0, res.output
    results = json.loads(res.stdout)["results"]
    assert {"state_swap", "keep_one", "forgetting"} <= set(results)
    for name, r in results.items():
        if name == "selection":
            continue
        assert r["valid"] is False and r["reason"].startswith(("not learned", "retrieval: not learned",
                                                                 "compliance: not learned")), (name, r["reason"])
        thresholds = r["checks"]["retrieval"]["thresholds"] if name == "keep_one" else r["validity"]["thresholds"]
        assert thresholds["margin"] == MARGIN
    assert results["state_swap"]["recurrent_fraction"] is None and results["state_swap"]["cache_fraction"] is None
    text = CliRunner().invoke(app, ["probe", "state_swap", "--model", "hybrid", "--task", "dictionary",
                                    "--n", "4"], env={"COLUMNS": "300"})
    assert text.exit_code == 0 and "not learned" in text.output


# -- learned by construction: the check passes, the figures are the known ones --------------------
def test_oracle_passes_and_shows_the_essays_division(dic):
    o = Oracle(dic)
    s = state_swap(o, dic, n=16, seed=0)
    assert s["valid"] is True and s["answer_accuracy"] == 1.0, s["reason"]
    assert s["validity"]["figures"]["shift"] == pytest.approx(20.0)
    assert s["cache_fraction"] == pytest.approx(1.0) and s["recurrent_fraction"] == pytest.approx(0.0)
    assert s["answers_flipped"] == {"recurrent": 0.0, "cache": 1.0}
    k = keep_one(o, dic, n=16, seed=0)
    assert k["valid"] is True and k["full"] == {"retrieval": 1.0, "compliance": 1.0}, k["reason"]
    assert k["cache_only"]["retrieval"] == 1.0 and k["state_only"]["compliance"] == 1.0
    assert k["paired"]["content_from_cache"] == 1.0 and k["paired"]["language_from_state"] == 1.0
    assert k["paired"]["content_from_state"] == 0.0 and k["paired"]["language_from_cache"] < 1.0
    rows = probe_rows("state_swap", s)
    assert rows[0] == ["check", "measured", ""] and ["shift moved by all attention caches", 1.0, "96% to 100%"] in rows
    shy = state_swap(Oracle(dic, confidence=0.2), dic, n=8, seed=0)   # right answers, a shift of 0.4 nats
    assert shy["valid"] is False and shy["validity"]["verdict"] == NO_EFFECT and shy["cache_fraction"] is None
    assert "no effect to divide" in [row[1] for row in probe_rows("state_swap", shy)]


def test_copier_passes_forgetting_and_mhc():
    docs = torch.tensor([[5] * 16, [9] * 16, [11] * 16])
    f = forgetting(copier("gated_deltanet", 64, n_layers=2, **SMALL), inputs=docs)
    assert f["valid"] is True and f["accuracy"] == 1.0 and f["median_half_life"] > 0, f["reason"]
    r = mhc_documents(copier("tiny-deepseek-v4-pro", 256), [[7] * 40, [3] * 40], context=16, n=2)
    assert r["valid"] is True and r["accuracy"] == 1.0, r["reason"]
    assert all(isinstance(c["perplexity_change"], float) for c in r["conditions"].values())


def test_figures_only_for_checked_results(dic, tmp_path):
    k_bad = keep_one(untrained("hybrid", dic), dic, n=8, seed=0)
    k_good = keep_one(Oracle(dic), dic, n=8, seed=0)
    assert write_figures({"keep_one": k_bad}, tmp_path) == []
    assert write_figures({"keep_one": k_good}, tmp_path) == ["keep_one.png"]


# -- the report -----------------------------------------------------------------------------------
def test_checked_claim():
    bad = learned(0.01, 0.012).as_dict()
    c = checked_claim("s", "caches carry it", 0.98, None, bad, within=(0.96, 1.0))
    assert c.status == NOT_MEASURED and c.measured is None
    assert c.reason.startswith("not measured: model did not learn (not learned: answer accuracy 0.01")
    ok = swap_effect(0.9, 0.01, 5.0).as_dict()
    assert checked_claim("s", "x", 0.98, 0.97, ok, within=(0.96, 1.0)).status == "reproduced"
    assert checked_claim("s", "x", 0.019, 0.1, ok, within=(0.002, 0.036)).status == "differs"   # outside the range
    assert checked_claim("s", "x", 0.98, None, None).status == "not checkable"                # the probe did not run
    assert Claim("s", "x", 0.019, 0.03, within=(0.002, 0.036)).status == "reproduced"


class StateOracle(Oracle):
    """The Oracle with its stores' kinds swapped: the dictionary in the recurrent layer, the language in the cache."""

    def __init__(self, task, confidence: float = 10.0):
        super().__init__(task, confidence)
        for lay, rec in zip(self.cfg.layers, (False, True)):
            lay.token.RECURRENT = rec


def fake_subjects(monkeypatch, make, forgetting_too: bool = False):
    """Sections 7 and 8 read ``make(name, task)`` in place of every shipped subject (each seed)."""
    from storelab import subjects as S
    from storelab.report import subject_probes, sweep_section

    def get(self, name, seed):
        cfg = S.train_config(name, seed)
        task = make_task(cfg.task, cfg.task_preset, **cfg.task_options)
        held = {str(k): {"retrieval": 1.0, "compliance": 1.0} for k in S.SIZES}
        meta = {"name": name, "seed": seed, "params": 0, "learned": True, "verdict": "learned", "steps": 0,
                "seconds": 0.0, "held_out": held}
        return make(name, task), task, meta

    monkeypatch.setattr(subject_probes.Subjects, "get", get)
    if not forgetting_too:
        monkeypatch.setattr(sweep_section, "forgetting_rows", lambda subs, n: (
            [], {k: {"ranking_stability": None, "check": learned(0.0, 0.1).as_dict()}
                 for k in ("kda-hybrid", "gdn-hybrid", "recurrent")}, []))


@pytest.mark.parametrize("learns", [False, True])
def test_trained_section_writes_only_checked_figures(monkeypatch, tmp_path, learns):
    from storelab.report.trained_section import trained_section

    fake_subjects(monkeypatch, (lambda name, task: Oracle(task)) if learns else
                  (lambda name, task: untrained("hybrid", task)))
    res = trained_section(Context(out=tmp_path, quick=True))
    claims = {c.claim: c for c in res.claims if c.section == "trained kda-hybrid"}
    assert len(res.claims) == 2 * len(claims) == 10 and {c.section for c in res.claims} == {"trained kda-hybrid",
                                                                                           "trained gdn-hybrid"}
    probes = res.tables[1].rows
    if not learns:
        assert "The state swap measured nothing in kda-hybrid (seed 0: not learned" in res.text and "%" not in res.text
        assert {c.status for c in res.claims} == {NOT_MEASURED}
        assert all("model did not learn" in c.reason for c in res.claims)
        no_fraction_in([[r[0], r[1]] for r in probes])
        assert "not learned" in [r[1] for r in probes]
    else:
        assert "the caches 100% (mean of 1 seeds): the stored value went through the attention caches" in res.text
        assert "survived best with its states alone" in res.text
        by = {k.split(" (")[0]: c.status for k, c in claims.items()}
        assert by["exact recall runs through the attention caches"] == "reproduced"
        assert by["the recurrent states carry almost none of it"] == "differs"        # 0 %: below the essay's 0.2
        assert by["with the caches alone the value is retrieved"] == "reproduced"     # 100 % against 89 %: in 25 %
        assert by["with the state alone the value is never retrieved"] == "reproduced"
        assert by["the recurrent state carries the answer's language"] == "differs"   # 100 % against 70 %
        assert ["state swap: shift moved by the attention caches", "100%, 1 of 1 seeds", "96 to 100 %"] in probes


def test_sweep_section_leaves_out_points_that_did_not_learn(monkeypatch, tmp_path):
    from storelab.report import sweep_section as sweep
    from storelab.subjects import SIZES

    def make(name, task):   # the GDN hybrid did not learn; kda-small keeps its dictionary in its state
        if name == "gdn-hybrid":
            return untrained("hybrid", task)
        return StateOracle(task) if name == "kda-small" else Oracle(task)

    fake_subjects(monkeypatch, make)
    res = sweep.sweep_section(Context(out=tmp_path, quick=True))
    kda, gdn = res.tables[0], res.tables[1]
    assert [r[0] for r in kda.rows] == list(SIZES) and all(r[4:6] == ["0%, 1 of 1 seeds", "100%, 1 of 1 seeds"]
                                                          for r in kda.rows)
    assert all(r[4:6] == ["not learned", "not learned"] for r in gdn.rows)
    assert "kda-hybrid: At every measured size, 1 to 32 entries, the larger share of the answer's shift went " \
           "through the caches" in res.text
    assert "gdn-hybrid: No size measured anything" in res.text
    div = res.data["division"]
    assert div["answer"].startswith("learned: at 1 to 4 entries")
    (c,) = [c for c in res.claims if "division" in c.claim]
    assert c.status == "reproduced"
    assert (tmp_path / "sweep_shares.png").is_file()
    none = [{"entries": n, "recurrent_fraction": None, "cache_fraction": None} for n in (4, 8)]
    assert sweep.crossing(none, 8).startswith("No size measured anything")


def test_division_says_capacity_when_both_read_the_state(monkeypatch, tmp_path):
    from storelab.report import sweep_section as sweep

    fake_subjects(monkeypatch, lambda name, task: StateOracle(task))
    res = sweep.sweep_section(Context(out=tmp_path, quick=True))
    assert res.data["division"]["answer"].startswith("capacity, not training: both read small dictionaries "
                                                    "through their states")
    (c,) = [c for c in res.claims if "division" in c.claim]
    assert c.status == "differs"


def test_sweep_section_on_untrained_models_measures_nothing(monkeypatch, tmp_path):
    from storelab.report import sweep_section as sweep

    fake_subjects(monkeypatch, lambda name, task: untrained("pattern:KKKA", task, n_layers=4), forgetting_too=True)
    res = sweep.sweep_section(Context(out=tmp_path, quick=True))
    assert res.data["division"]["answer"].startswith("not measured")
    assert {c.status for c in res.claims} == {NOT_MEASURED}
    assert all(r[1:] == ["not learned"] * 3 for r in res.tables[-1].rows)      # forgetting: no half-life printed


def test_report_says_what_was_not_measured(tmp_path, monkeypatch):
    import storelab.report.build as build
    from storelab.report.core import Section, SectionResult

    bad = learned(0.01, 0.012).as_dict()
    section = Section("trained", "7. trained", lambda ctx: SectionResult(
        text="t", claims=[checked_claim("trained hybrid", "caches carry it", 0.98, None, bad, within=(0.96, 1.0))]))
    monkeypatch.setattr(build, "default_sections", lambda checkpoint=None: [section])
    res = CliRunner().invoke(app, ["report", "--quick", "--out", str(tmp_path), "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["claims"] == {NOT_MEASURED: 1}
    md = (tmp_path / "report.md").read_text()
    assert "1 not measured. 1 trained-model claims are not measured: the model probed did not learn" in md
    assert "not measured: model did not learn (not learned: answer accuracy 0.01 vs chance 0.012" in md
