"""The synthetic task generators: seeded, well formed, and their targets are what the docstrings say."""

import pytest
import torch

from storelab.tasks import IGNORE, MQAR, DictionaryLanguage, Parity, SelectiveCopy, make_task, task_dict, tiny_dictionary
from storelab.tasks.base import batch_seed


@pytest.mark.parametrize("name", ["mqar", "dictionary", "parity", "selective_copy"])
def test_seeded_and_in_vocab(name):
    t = make_task(name, "tiny")
    a, b, c = t.sample(6, 1), t.sample(6, 1), t.sample(6, 2)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.targets, b.targets)
    assert not torch.equal(a.inputs, c.inputs)
    assert a.inputs.shape == a.targets.shape and a.inputs.dtype == torch.long
    assert 0 <= a.inputs.min() and a.inputs.max() < t.vocab_size
    scored = a.targets[a.targets != IGNORE]
    assert scored.numel() > 0 and 0 <= scored.min() and scored.max() < t.vocab_size
    # round trip of the resolved config
    d = task_dict(t)
    assert task_dict(make_task(d.pop("name"), **d)) == task_dict(t)


def test_mqar_zoology_layout():
    t = MQAR(vocab_size=64, mix=((48, 6),), random_noise=False)
    b = t.sample(20, 0)
    half = 32
    for x, y in zip(b.inputs, b.targets):
        keys, vals = x[0:12:2], x[1:12:2]
        assert (keys >= 1).all() and (keys < half).all() and (vals >= half).all()
        assert len(set(keys.tolist())) == 6
        pos = (y != IGNORE).nonzero().flatten()
        assert len(pos) == 6 and (pos >= 12).all()
        table = dict(zip(keys.tolist(), vals.tolist()))
        for p in pos.tolist():  # the token at a scored position is a queried key; the target its value
            assert table[int(x[p])] == int(y[p])


def test_mqar_gaps_follow_power_law():
    # power 0.01: most queries land in the first free slots
    t = MQAR(vocab_size=512, mix=((256, 4),), random_noise=False)
    b = t.sample(200, 3)
    pos = (b.targets != IGNORE).nonzero()[:, 1].float() - 8
    assert (pos < 124 / 4).float().mean() > 0.5


def test_mqar_defaults_and_validation():
    t = MQAR()
    assert t.vocab_size == 8192 and min(m for _, m in t.mix) == 4 and max(m for _, m in t.mix) == 64
    with pytest.raises(ValueError, match="mix"):
        MQAR(mix=((16, 8),))
    with pytest.raises(ValueError, match="power_a"):
        MQAR(power_a=0)
    with pytest.raises(ValueError, match="bogus"):
        make_task("mqar", bogus=1)
    with pytest.raises(ValueError, match="preset"):
        make_task("mqar", "huge")


def test_dictionary_answer_is_value_in_language():
    t = DictionaryLanguage(n_languages=3, n_keys=20, n_values=20, pairs_min=15, pairs_max=18, n_queries=2)
    b = t.sample(16, 5)
    for i in range(16):
        x = b.inputs[i]
        start = int((x == 1).nonzero()[0])  # BOS
        assert int(x[start + 1]) - t.lang_start == int(b.meta["language"][i])
        pairs = {}
        j = start + 2
        while int(x[j]) != 2:  # until QUERY
            pairs[int(x[j])] = int(x[j + 1]) - t.value_start
            j += 2
        assert 15 <= len(pairs) <= 18
        for q in range(2):
            p = int(b.meta["answer_pos"][i, q])
            assert int(x[p]) == 3  # ANSWER
            value = pairs[int(x[p - 1])]
            assert value == int(b.meta["value"][i, q])
            lang, val = t.decode(b.targets[i, p])
            assert int(lang) == int(b.meta["language"][i]) and int(val) == value
    assert (b.targets != IGNORE).sum() == 32


def test_dictionary_languages_are_fixed_mappings():
    t = tiny_dictionary()
    assert t.vocab_size == 4 + 2 + 16 + 16 + 2 * 16
    v = torch.arange(16)
    for lang in range(2):
        toks = t.write(torch.full_like(v, lang), v)
        assert len(set(toks.tolist())) == 16
        dl, dv = t.decode(toks)
        assert (dl == lang).all() and torch.equal(dv, v)
    assert t.decode(torch.tensor([0, t.value_start]))[0].tolist() == [-1, -1]
    fixed = t.sample(4, 0, language=torch.tensor([1, 1, 0, 0]))
    assert fixed.meta["language"].tolist() == [1, 1, 0, 0]


def test_dictionary_scores_retrieval_and_compliance_apart():
    t = tiny_dictionary()
    b = t.sample(8, 0)
    logits = torch.zeros(8, b.inputs.shape[1], t.vocab_size)
    for q in range(t.n_queries):
        lang, val = b.meta["language"], b.meta["value"][:, q]
        pos = b.meta["answer_pos"][:, q]
        logits[torch.arange(8), pos, t.write(1 - lang, val)] = 1.0  # right value, wrong language
    s = t.score(logits, b)
    assert s == {"retrieval": 1.0, "compliance": 0.0}


def test_parity_and_copy_targets():
    p = Parity(len_min=4, len_max=8, eval_len=20)
    b = p.sample(5, 0)
    for x, y in zip(b.inputs, b.targets):
        m = y != IGNORE
        assert torch.equal(y[m], (x.cumsum(0) % 2)[m]) and 4 <= m.sum() <= 8
    assert p.sample_eval(3, 0).inputs.shape == (3, 20)
    c = SelectiveCopy(seq_len=10, n_data=3, vocab_size=8)
    b = c.sample(4, 0)
    for x, y in zip(b.inputs, b.targets):
        data = x[:10][x[:10] != 0]
        assert len(data) == 3 and int(x[10]) == 1
        assert torch.equal(y[10:], data)


def test_batch_seeds_differ_by_split_and_step():
    seeds = {batch_seed(0, s, k) for s in ("train", "eval", "test") for k in range(50)}
    assert len(seeds) == 150


def test_mqar_length_generalisation_split():
    t = make_task("mqar", "tiny")
    train_len = t.sample(4, 0).inputs.shape[1]
    test = t.sample_test(4, 0)
    assert test.inputs.shape[1] > train_len
    assert set(test.meta["pairs"].tolist()) == {4, 8}
    full = MQAR()
    assert max(T for T, _ in full.test_mix) > max(T for T, _ in full.mix)
