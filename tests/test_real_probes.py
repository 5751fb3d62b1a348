"""The probes of the report's section on real language models (issue 37).

On tiny random models with a tokenizer trained here (the arithmetic, the units, the checks), on planted
models whose answer is known (only one layer's cache can carry the value; a sink built into layer 0),
and on the real subjects when installed (skipped otherwise; loaded once per module)."""

from __future__ import annotations

import pytest
import torch

from storelab.models.config import ModelConfig
from storelab.models.model import Model
from storelab.probes.group_swap import group_swap
from storelab.probes.interference import retrieval_curve
from storelab.probes.real_tasks import VALUE_CHANCE, copy_pairs, dictionary_pairs, distance_pairs
from storelab.probes.reads import attention_reads, head_weights
from storelab.probes.store_groups import GLOBAL, RECURRENT, WINDOW, Share, groups_of, rate_share, ratio_share, store_group
from storelab.probes.topk_reads import topk_accuracy, topk_reads
from tests.helpers import write_tokenizer
from tests.test_probes import unchecked  # noqa: F401  (a fixture)

W_TOKENS = 6


def tiny(seed: int = 0) -> Model:
    """4 layers: window, global, window, global; SwiGLU FFNs; no RoPE scaling oddities."""
    d = {"name": "tiny-real", "d_model": 32, "vocab_size": 400, "n_layers": 4,
         "stores": {"g": {"kind": "attention", "n_heads": 2, "n_kv_heads": 1, "head_dim": 16},
                    "w": {"kind": "window", "window": W_TOKENS, "n_heads": 2, "n_kv_heads": 1, "head_dim": 16},
                    "f": {"kind": "ffn", "d_ff": 64}, "r": {"kind": "residual"}},
         "layers": [{"at": "all", "token": "w", "channel": "f", "depth": "r"}, {"at": [1, 3], "token": "g"}]}
    torch.manual_seed(seed)
    return Model(ModelConfig.from_dict(d)).eval()


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    from storelab.text import Tokenizer

    text = " ".join(r[k] for r in dictionary_pairs(30, entries=8) + dictionary_pairs(10, entries=8, keys="near")
                    + dictionary_pairs(10, entries=8, fmt="prose") + copy_pairs(10)
                    for k in ("prompt_a", "prompt_b"))
    d = tmp_path_factory.mktemp("tok")
    write_tokenizer(d, text + " 0123456789", vocab=400)
    return Tokenizer.load(d)


def count_of(tok):
    return lambda s: len(tok.encode(s, special=False))


# -- the generator ---------------------------------------------------------------------------------
def test_generator_is_seeded_and_pairs_differ_in_one_value(tok):
    a, b = dictionary_pairs(3, entries=6, seed=4), dictionary_pairs(5, entries=6, seed=4)
    assert a == b[:3]                                     # sizes scale without changing what was seen
    for r in a:
        assert r["answer_a"] != r["answer_b"] and r["prompt_a"] != r["prompt_b"]
        diff = [(x, y) for x, y in zip(r["prompt_a"].split("\n"), r["prompt_b"].split("\n")) if x != y]
        assert len(diff) == 1
    near = dictionary_pairs(2, entries=20, keys="near")[0]["prompt_a"].splitlines()
    assert len({ln.split("-")[0] for ln in near}) == 1    # one stem: near-duplicate keys
    d = distance_pairs(2, distance=60, count=count_of(tok))
    assert all(r["distance"] >= 60 for r in d)
    with pytest.raises(ValueError, match="keys"):
        dictionary_pairs(1, entries=3, keys="odd")


def test_groups_come_from_the_configs():
    m = tiny()
    assert groups_of(m) == {WINDOW: [0, 2], GLOBAL: [1, 3]}
    assert store_group(m.cfg.layers[0].token) == WINDOW


def test_shares_are_percentages_with_intervals():
    s = ratio_share([1.0, 1.0, 1.0], [0.0, 0.0, 0.0], [2.0, 2.0, 2.0])
    assert isinstance(s, Share) and s.percent == pytest.approx(50) and s.low == pytest.approx(50)
    assert str(s) == "50 % [50, 50]"
    r = rate_share(3, 4)
    assert r.percent == 75 and 0 < r.low < 75 < r.high <= 100
    assert ratio_share([1.0], [1.0], [1.0]) is None   # no effect to divide


# -- planted: only one layer's cache carries the value ------------------------------------------------
def only_through(m: Model, layer: int) -> Model:
    """Every token store but ``layer``'s writes nothing: the prompt reaches the answer through that cache only."""
    for i, b in enumerate(m.blocks):
        if i != layer:
            b.token.o_proj.weight.data.zero_()
    return m


def test_group_swap_on_a_planted_model(tok, unchecked):  # noqa: F811
    m = only_through(tiny(1), 3)
    recs = dictionary_pairs(4, entries=4, seed=1)
    for r in recs:
        r["point"] = 0
    out = group_swap(m, tok, recs, by="point", chance=VALUE_CHANCE, only_right=False)
    pt = out["points"]["0"]
    assert pt["groups"][GLOBAL]["swap_share"]["percent"] == pytest.approx(100, abs=1e-3)
    assert pt["groups"][WINDOW]["swap_share"]["percent"] == pytest.approx(0, abs=1e-3)
    assert pt["groups"][RECURRENT] == {"layers": [], "applies": False, "why": "no recurrent layers"}
    shares = [r["swap_share"]["percent"] for r in pt["layers"]]
    assert shares[3] == pytest.approx(100, abs=1e-3) and max(abs(x) for x in shares[:3]) < 1e-3
    assert set(pt["groups"][GLOBAL]["swap_share"]) >= {"percent", "interval", "text"}


def test_group_swap_withholds_what_an_untrained_model_did_not_do(tok):
    out = group_swap(tiny(2), tok, dictionary_pairs(3, entries=4), chance=VALUE_CHANCE, per_layer=False)
    pt = out["points"]["list"]
    assert not pt["valid"] and "not learned" in pt["reason"]
    assert pt["groups"][GLOBAL]["swap_share"] is None and pt["groups"][WINDOW]["keep_retrieval"] is None


# -- planted: a sink in layer 0 ---------------------------------------------------------------------
def with_sink(m: Model, tok) -> tuple[Model, int]:
    """Layer 0's heads score the first token far above every other (its embedding alone has channel 0)."""
    first = tok.encode("x")[0]
    with torch.no_grad():
        m.embed.weight[:, 0] = 0.0
        m.embed.weight[first, 0] = 10.0
        st = m.blocks[0].token
        st.q_proj.weight.zero_()
        st.k_proj.weight.zero_()
        # queries constant through a bias-free path: every token's normalised embedding has some channel 1
        m.embed.weight[:, 1] = 1.0
        st.q_proj.weight[:, 1] = 3.0
        st.k_proj.weight[:, 0] = 3.0
    return m, first


def test_sinks_and_the_miss_on_a_planted_model(tok):
    m, _ = with_sink(tiny(3), tok)
    m.cfg.layers[0].token.partial_rotary  # RoPE on: the planted score survives at small positions only
    docs = [tok.encode(r["prompt_a"]) for r in dictionary_pairs(4, entries=8)]
    out = attention_reads(m, docs, context=48, stride=1, contexts=(16, 48), ks=(2, 8), queries=4)
    l0 = out["layers"][0]
    assert l0["group"] == WINDOW and l0["first_token_share"]["percent"] > 60
    assert "past_window" in l0 and l0["past_window"]["uniform_percent"] == pytest.approx(100 / (W_TOKENS + 1), abs=1e-2)
    miss = [x for x in out["miss"] if x["layer"] == 1]
    assert {(x["context"], x["k"]) for x in miss} == {(16, 2), (16, 8), (48, 2), (48, 8)}
    by = {(x["context"], x["k"]): x["mass_missed"]["percent"] for x in miss}
    assert by[(48, 8)] <= by[(48, 2)] + 1e-6 and 0 <= by[(16, 8)] <= 100
    f = out["ffn_keys"]
    assert len(f["layers"]) == 4 and f["layers"][0]["units"] == 64 and "text" in f["overall"]


def test_head_weights_rows_sum_to_one_and_respect_the_window(tok):
    m = tiny(4)
    x = torch.randn(1, 20, 32)
    with torch.no_grad():
        w = head_weights(m.blocks[0].token, x, torch.arange(20))
    assert torch.allclose(w.sum(-1), torch.ones(2, 20), atol=1e-5)
    assert float(w[:, 15, :15 - W_TOKENS].abs().max()) == 0.0


def test_topk_reads_at_full_k_change_nothing_and_small_k_does(tok):
    m = tiny(5)
    ids = torch.tensor([tok.encode(dictionary_pairs(1, entries=8)[0]["prompt_a"])])
    ref = m(ids, keep_logits=1)[0]
    with topk_reads(m, ids.shape[1]) as layers:
        same = m(ids, keep_logits=1)[0]
    with topk_reads(m, 1):
        other = m(ids, keep_logits=1)[0]
    assert layers == [1, 3]
    assert torch.allclose(ref, same, atol=1e-4) and not torch.allclose(ref, other, atol=1e-4)
    out = topk_accuracy(m, tok, distance_pairs(2, distance=30, count=count_of(tok)), ks=(2,), chance=VALUE_CHANCE)
    pt = next(iter(out["points"].values()))
    assert not pt["valid"] and pt["topk"]["2"] is None     # untrained: not printed


def test_retrieval_curve_reports_percentages(tok):
    out = retrieval_curve(tiny(6), tok, sizes=(2, 4), n=3)
    assert [(p["keys"], p["entries"]) for p in out["points"]] == [("random", 2), ("random", 4), ("near", 2),
                                                                   ("near", 4)]
    assert all(0 <= p["accuracy"]["percent"] <= 100 and 1 <= p["accuracy"]["n"] <= 3 for p in out["points"])


# -- the real subjects --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gemma():
    from storelab.subjects.real import SubjectError, real_subject

    try:
        real_subject("gemma3-270m").path()
    except SubjectError as e:
        pytest.skip(str(e))
    from storelab.report.real_section import open_subject

    m, t, _ = open_subject("gemma3-270m")
    return m, t


def test_gemma_window_and_global_groups_and_its_answer(gemma):
    m, t = gemma
    g = groups_of(m)
    assert len(g[WINDOW]) == 15 and len(g[GLOBAL]) == 3
    recs = dictionary_pairs(2, entries=6, seed=3)
    for r in recs:
        r["point"] = 0
    out = group_swap(m, t, recs, by="point", chance=VALUE_CHANCE, per_layer=False)
    pt = out["points"]["0"]
    assert pt["accuracy"]["percent"] >= 50 and "text" in pt["accuracy"]
    if pt["valid"]:   # the value goes through the caches: the two groups together move about all of it
        s = pt["groups"][GLOBAL]["swap_share"]["percent"] + pt["groups"][WINDOW]["swap_share"]["percent"]
        assert s > 50


# -- the section and the listing without the real extra --------------------------------------------------
def test_section_says_how_to_install_when_the_subjects_are_missing(tmp_path, monkeypatch):
    from storelab.report.core import Context
    from storelab.report.real_section import real_section
    from storelab.subjects import real

    def missing(self):
        raise real.SubjectError(f"the package {self.packages[0]} is not installed: {real.INSTALL}")

    monkeypatch.setattr(real.RealSubject, "path", missing)
    res = real_section(Context(out=tmp_path, quick=True))
    assert not res.data["installed"] and real.INSTALL in res.text and not res.figures


def test_subjects_lists_the_real_ones():
    from storelab.commands.subjects import real_rows

    rows = real_rows()
    assert [r["name"] for r in rows] == ["smollm2-135m", "gemma3-270m"]
    assert all({"source", "licence", "format", "installed"} <= set(r) for r in rows)
