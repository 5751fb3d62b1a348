"""The trained subjects (issue 29, item 2): recipes as data, training that writes and reads back, the shipped
files checked against their recipes, and the command's errors."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from typer.testing import CliRunner

import storelab.subjects as S
from storelab.cli import app
from storelab.outputs import folder_kind
from storelab.tasks import make_task
from storelab.tasks.base import generator

runner = CliRunner()


@pytest.fixture
def quick_recipes(monkeypatch):
    """Every recipe at 3 steps: the machinery, not the learning."""
    quick = {n: dataclasses.replace(r, steps=3, warmup=1) for n, r in S.RECIPES.items()}
    monkeypatch.setattr(S, "RECIPES", quick)
    return quick


def test_recipes_span_d_over_8_to_4d():
    assert S.SIZES[0] * 8 == S.HEAD_DIM and S.SIZES[-1] == 4 * S.HEAD_DIM
    for name, r in S.RECIPES.items():
        cfg = S.train_config(name, 0)
        assert cfg.model == f"pattern:{r.pattern}" and cfg.model_options["head_dim"] == S.HEAD_DIM
        task = make_task(cfg.task, cfg.task_preset, **cfg.task_options)
        assert abs(sum(p[0] for p in r.mix) - 1) < 1e-9 and task.n_values == S.N_SYMBOLS
        assert set(r.must_learn) <= set(S.SIZES)
    mix = S.RECIPES["kda-hybrid"].mix
    far_above = sum(p[0] for p in mix if p[1] >= 2 * S.HEAD_DIM)
    far_below = sum(p[0] for p in mix if p[2] <= S.HEAD_DIM // 2)
    assert far_above > 0.5 and far_below > 0.2     # "most far above the state's capacity, some far below"


def test_mixture_of_sizes_and_repeated_queries():
    t = make_task("dictionary", "small", n_keys=40, n_values=40, pairs_min=1, pairs_max=32, n_queries=4,
                  queries_repeat=True, pairs_mix=[[0.25, 1, 4], [0.75, 16, 32]])
    n = t.draw_pairs(20000, generator(0))
    assert int(n.min()) == 1 and int(n.max()) == 32 and not bool(((n > 4) & (n < 16)).any())
    assert abs(float((n <= 4).float().mean()) - 0.25) < 0.02
    b = t.sample(64, 3)
    lang, val = t.decode(b.targets.gather(1, b.meta["answer_pos"]))
    assert bool((val == b.meta["value"]).all()) and bool((lang == b.meta["language"][:, None]).all())
    with pytest.raises(ValueError, match="pairs_mix"):
        make_task("dictionary", "small", pairs_min=1, pairs_max=8, n_queries=1, pairs_mix=[[0.5, 1, 4]])
    with pytest.raises(ValueError, match="pairs_mix"):
        make_task("dictionary", "small", pairs_min=1, pairs_max=8, n_queries=1, pairs_mix=[[1.0, 1, 9]])
    with pytest.raises(ValueError, match="n_queries"):
        make_task("dictionary", "small", pairs_min=1, pairs_max=8, n_queries=4)
    log = make_task("dictionary", "small", pairs_min=2, pairs_max=32, n_queries=2, pairs_dist="log")
    m = log.draw_pairs(20000, generator(1))
    assert abs(float((m < 8).float().mean()) - float((m >= 8).float().mean())) < 0.05   # 2-8 as likely as 8-32


def test_sized_task_keeps_the_vocabulary():
    cfg = S.train_config("kda-hybrid", 0)
    task = make_task(cfg.task, cfg.task_preset, **cfg.task_options)
    for n in S.SIZES:
        t = S.sized(task, n)
        assert (t.pairs_min, t.pairs_max, t.vocab_size) == (n, n, task.vocab_size)
        assert torch.equal(t._perm, task._perm)


def test_train_writes_and_loads(tmp_path, quick_recipes):
    meta = S.train_subject("kda-hybrid", 1, tmp_path)
    weights, recipe = S.paths("kda-hybrid", 1, tmp_path)
    assert weights.is_file() and recipe.is_file()
    assert meta["steps"] == 3 and meta["learned"] is False and meta["verdict"].startswith("below 0.9 at 1 entries")
    assert set(meta["held_out"]) == {str(k) for k in S.SIZES} and meta["command"].endswith("kda-hybrid --seed 1")
    S.write_index(tmp_path)
    assert folder_kind(tmp_path) == "subjects" and S.shipped(tmp_path) == [("kda-hybrid", 1)]
    model, task, read = S.load_subject("kda-hybrid", 1, tmp_path)
    assert read["held_out"] == meta["held_out"]
    assert S.score_sizes(model, task, seed=1, sizes=(4,)) == {"4": meta["held_out"]["4"]}   # the same weights
    # a run is reproducible: the same recipe and seed give the same weights
    S.train_subject("kda-hybrid", 1, tmp_path / "again")
    again, _, _ = S.load_subject("kda-hybrid", 1, tmp_path / "again")
    for (k, a), b in zip(model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), k


def test_damaged_subject_files_are_named(tmp_path, quick_recipes):
    S.train_subject("recurrent", 0, tmp_path)
    weights, recipe = S.paths("recurrent", 0, tmp_path)
    with pytest.raises(FileNotFoundError, match="attention seed 0 is not in"):
        S.load_subject("attention", 0, tmp_path)
    with pytest.raises(ValueError, match="seed: recurrent ships seeds 0, 1, 2, 3; got 5"):
        S.load_subject("recurrent", 5, tmp_path)
    with pytest.raises(ValueError, match="no subject 'nope'"):
        S.load_subject("nope", 0, tmp_path)
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ValueError, match="recurrent-seed0.safetensors cannot be read"):
        S.load_subject("recurrent", 0, tmp_path)
    recipe.write_text("{")
    with pytest.raises(ValueError, match="recurrent-seed0.json cannot be read as JSON"):
        S.load_subject("recurrent", 0, tmp_path)


def test_cli_errors(tmp_path, quick_recipes):
    for args, says in ((["train", "nope"], "no subject 'nope'"), (["train"], "give a subject"),
                       (["train", "kda-hybrid", "--seed", "7"], "seed: kda-hybrid ships seeds 0, 1, 2, 3"),
                       (["train", "kda-hybrid", "--all"], "not both"),
                       (["--dir", str(tmp_path / "none")], "is not a folder")):
        r = runner.invoke(app, ["subjects", *args])
        assert r.exit_code == 2 and says in r.output, (args, r.output)
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "config.json").write_text('{"model_type": "llama"}')
    r = runner.invoke(app, ["subjects", "train", "kda-hybrid", "--out", str(hf)])
    assert r.exit_code == 2 and "Hugging Face model folder" in r.output
    assert json.loads((hf / "config.json").read_text()) == {"model_type": "llama"}
    if S.shipped():
        r = runner.invoke(app, ["subjects", "train", *S.shipped()[0][:1], "--seed", str(S.shipped()[0][1])])
        assert r.exit_code == 2 and "ships with storelab: refusing to replace it" in r.output


def test_cli_trains_into_a_folder(tmp_path, quick_recipes):
    out = tmp_path / "subjects"
    r = runner.invoke(app, ["subjects", "train", "attention", "--seed", "2", "--out", str(out), "--json"])
    assert r.exit_code == 1     # three steps do not learn: the command says so by its exit code
    got = json.loads(r.output)
    assert got["trained"][0]["name"] == "attention" and got["trained"][0]["learned"] is False
    listed = json.loads(runner.invoke(app, ["subjects", "--dir", str(out), "--json"]).output)
    assert [(s["name"], s["seed"]) for s in listed["subjects"]] == [("attention", 2)]


# -- the shipped subjects ---------------------------------------------------------------------------
SHIPPED = S.shipped()


def test_every_subject_ships_and_three_seeds_of_each_learned():
    assert SHIPPED == S.every()
    total = sum(p.stat().st_size for n, s in SHIPPED for p in S.paths(n, s))
    assert total < 20 * 2**20
    for name in S.RECIPES:
        # measured, not chosen: the one-head recurrent control learned the small dictionaries in 1 of its 4 seeds
        # within its 5,000 steps (the others stall at 0.57-0.87 on 2 to 4 entries); every seed fails far above d
        need = 1 if name == "recurrent" else 3
        assert sum(S.read_meta(name, s)["learned"] for s in S.RECIPES[name].seeds) >= need, name
    index = json.loads((S.DATA / "subjects.json").read_text())
    assert [(r["name"], r["seed"]) for r in index["subjects"]] == SHIPPED


@pytest.mark.parametrize("name,seed", SHIPPED)
def test_shipped_subject_is_what_its_recipe_says(name, seed):
    """The recipe that ships is the code's; its verdict follows from its figures; re-scored live, the weights
    give the recipe's figures (the same prompts: equal to the last digit)."""
    model, task, meta = S.load_subject(name, seed)
    assert meta["train_config"] == S.train_config(name, seed).to_dict()
    assert (meta["learned"], meta["verdict"]) == S.learned(meta)
    if meta["learned"]:
        for k in S.RECIPES[name].must_learn:
            assert min(meta["held_out"][str(k)].values()) >= S.PASS
    k = max(S.RECIPES[name].must_learn)
    assert S.score_sizes(model, task, seed=seed, sizes=(k,)) == {str(k): meta["held_out"][str(k)]}


def test_recurrent_control_fails_far_above_d():
    for seed in S.RECIPES["recurrent"].seeds:
        meta = S.read_meta("recurrent", seed)
        assert meta["held_out"][str(4 * S.HEAD_DIM)]["retrieval"] < 0.5


def test_train_command_is_the_recipe():
    import shlex

    from storelab.commands.train import parse_options

    for name in S.RECIPES:
        cfg = S.train_config(name, 2)
        words = shlex.split(S.train_command(name, 2))
        pick = lambda flag: [words[i + 1] for i, w in enumerate(words) if w == flag]  # noqa: E731
        assert parse_options(pick("--model-opt"), "m") == cfg.model_options
        assert parse_options(pick("--task-opt"), "t") == cfg.task_options
        assert pick("--model") == [cfg.model] and pick("--steps") == [str(cfg.steps)] and pick("--seed") == ["2"]
        assert pick("--lr") == [str(cfg.lr)] and pick("--warmup") == [str(cfg.warmup)]


def test_report_refuses_bad_subject_options(tmp_path):
    out = tmp_path / "rep"
    for args, says in ((["--subjects", str(tmp_path / "none")], "is not a folder"),
                       (["--subjects", str(tmp_path)], "lacks kda-hybrid seed 0"),
                       (["--retrain", "--subjects", str(tmp_path)], "not both")):
        r = runner.invoke(app, ["report", "--out", str(out), *args])
        assert r.exit_code == 2 and says in r.output, (args, r.output)
        assert not out.exists()          # refused before any work
