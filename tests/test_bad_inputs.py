"""Bad inputs through the CLI: each one exits 2 with a message naming the field, option or file,
never a traceback, and the user's files are byte-identical afterwards (issue 20).

Outputs (``storelab.outputs``): no command writes into a folder of another kind or over a file it
did not write, and a bad ``--out`` fails before the work. Model files, config.json and numeric
options: every bad value is named. (Python API cases: tests/test_bad_inputs_api.py.)
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from storelab.cli import app

BASE = """name = "m"
d_model = 32
vocab_size = 64
n_layers = {n}

[stores.attn]
kind = "attention"
n_heads = 2
head_dim = 16

[stores.ffn]
kind = "ffn"
d_ff = 64

[stores.res]
kind = "residual"

[[layers]]
at = "all"
token = "attn"
channel = "ffn"
depth = "res"
"""


@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    """No line wrapping in the error text, so that a message can be matched whole."""
    import typer.rich_utils

    from storelab.console import console, err_console

    monkeypatch.setattr(typer.rich_utils, "MAX_WIDTH", 2000)
    for c in (console, err_console):
        monkeypatch.setattr(c, "width", 2000)


def run(*args) -> tuple[int, str]:
    res = CliRunner().invoke(app, [str(a) for a in args])
    if res.exception is not None and not isinstance(res.exception, SystemExit):
        raise AssertionError(f"{args}: raised {type(res.exception).__name__}: {res.exception}\n{res.output}")
    return res.exit_code, " ".join(re.sub(r"[│╭╮╰╯─]", " ", res.output).split())


def refused(*args, says: tuple[str, ...]) -> str:
    code, out = run(*args)
    assert code == 2, f"{args}: exit {code}\n{out}"
    assert "Traceback" not in out
    for s in says:
        assert s in out, f"{args}: {s!r} not in the message:\n{out}"
    return out


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


# -- folders of each kind ------------------------------------------------------------------------------
@pytest.fixture
def hf_folder(tmp_path) -> Path:
    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 8}))
    (d / "model.safetensors").write_bytes(b"their weights")
    (d / "tokenizer.json").write_text("{}")
    return d


@pytest.fixture
def save_folder(tmp_path) -> Path:
    from storelab.checkpoint import save
    from storelab.models.model import Model
    from storelab.train.models import resolve_model

    d = tmp_path / "saved"
    save(Model(resolve_model("attention", 32, d_model=16, n_layers=1, n_heads=2, head_dim=8, d_ff=16)), d)
    return d


@pytest.fixture
def run_folder(tmp_path) -> Path:
    d = tmp_path / "run"
    d.mkdir()
    (d / "checkpoint.safetensors").write_bytes(b"forty steps of training")
    (d / "config.json").write_text(json.dumps({"step": 40, "train_config": {"model": "attention"}}))
    return d


def test_train_refuses_a_save_and_a_hugging_face_folder(save_folder, hf_folder):
    for d, kind in ((save_folder, "storelab save"), (hf_folder, "Hugging Face")):
        before = snapshot(d)
        refused("train", "--model", "attention", "--steps", "1", "--out", d, says=("--out", str(d), kind, "--force"))
        assert snapshot(d) == before


def test_save_refuses_a_hugging_face_folder_and_a_run(hf_folder, run_folder):
    before = snapshot(hf_folder)
    refused("save", hf_folder, hf_folder, "--checkpoint", says=("OUT", str(hf_folder), "Hugging Face"))
    assert snapshot(hf_folder) == before
    before = snapshot(run_folder)
    refused("save", "kimi-k3", run_folder, "--tiny", says=("OUT", str(run_folder), "train run"))
    assert snapshot(run_folder) == before


def test_save_converts_into_another_folder_but_not_into_itself(save_folder):
    before = snapshot(save_folder)
    refused("save", save_folder, save_folder, "--checkpoint", says=("OUT", "another folder"))
    assert snapshot(save_folder) == before


def test_a_file_the_command_did_not_write_is_kept_unless_force(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "recall.png").write_bytes(b"my own picture")
    (d / "notes.txt").write_text("keep me")
    before = snapshot(d)
    refused("recall", "--models", "attention", "--steps", "1", "--out", d, says=("--out", "recall.png", "--force"))
    assert snapshot(d) == before


def test_force_is_the_way_to_overwrite(hf_folder):
    code, out = run("save", "kimi-k3", hf_folder, "--tiny", "--force", "--json")
    assert code == 0, out
    from storelab.checkpoint import load

    assert load(hf_folder, device="meta").cfg.name == "kimi-k3.tiny"


def test_resaving_and_resuming_need_no_force(save_folder, tmp_path):
    code, out = run("save", "kimi-k3", save_folder, "--tiny", "--json")
    assert code == 0, out
    out_dir = tmp_path / "r"
    for _ in range(2):  # the second run resumes from the first one's folder
        code, out = run("train", "--model", "attention", "--steps", "2", "--eval-every", "2", "--out", out_dir, "--json")
        assert code == 0, out


@pytest.mark.parametrize("cmd", [
    ("train", "--model", "attention", "--steps", "1"),
    ("recall", "--models", "attention", "--steps", "1", "--widths", "16", "--pairs", "4"),
    ("report", "--quick"),
    ("capacity", "1", "--quick"),
    ("save", "kimi-k3", "--tiny"),
])
def test_a_bad_out_fails_before_the_work(cmd, tmp_path):
    f = tmp_path / "a_file"
    f.write_text("mine")
    opt = {"capacity": "--plot", "save": None}.get(cmd[0], "--out")
    for bad, says in ((f, "is a file"), (f / "below", "is a file")):
        args = [*cmd, bad] if opt is None else [*cmd, opt, bad]
        out = refused(*args, says=(opt or "OUT", says))
        assert "recall attention" not in out and "section" not in out  # no work was done
    assert f.read_text() == "mine"


def test_checkpoint_options_say_which_folder_they_take(save_folder, run_folder):
    # a storelab save is a model folder: probed on text, which needs its tokenizer.json
    refused("probe", "state_swap", "--checkpoint", save_folder, says=("tokenizer.json: missing",))
    refused("probe", "state_swap", "--checkpoint", save_folder, "--task", "dictionary",
            says=("task: dictionary", "vocabulary", "32"))
    refused("probe", "state_swap", "--checkpoint", run_folder, "--stream", says=("--stream reads a model folder",))
    refused("generate", "--checkpoint", run_folder, says=("train run folder, not a model folder", "probe"))


def test_a_report_is_not_written_into_a_run(run_folder):
    before = snapshot(run_folder)
    refused("report", "--quick", "--out", run_folder, says=("--out", "train run"))
    assert snapshot(run_folder) == before


# -- model files ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("change, says", [
    (("n_heads = 2", "n_heads = 4.5"), ("token store 'attn'", "n_heads: must be an integer, got 4.5")),
    (("d_ff = 64", "d_ff = true"), ("channel store 'ffn'", "d_ff: must be an integer, got true")),
    (("n_heads = 2", 'n_heads = "four"'), ("n_heads: must be an integer, got 'four'",)),
    (("d_model = 32", "d_model = 32.0"), ("d_model: must be an integer",)),
    (("vocab_size = 64", "vocab_size = true"), ("vocab_size: must be an integer",)),
    (('kind = "ffn"', "kind = 5"), ("kind: must be a store kind name",)),
    (("head_dim = 16", "head_dim = 16\nrope_theta = nan"), ("rope_theta: must be a finite number",)),
    (('at = "all"', 'at = "30:40"'), ("layers[0].at", "'30:40'", "24 layers")),
    (('at = "all"', 'at = "3:3"'), ("layers[0].at", "selects no layer")),
    (("n_layers = 24", "n_layers = 1000000000"), ("n_layers: at most",)),
    (("n_layers = 24", "n_layers = 24\nnorm_eps = -1"), ("norm_eps: must be a number > 0",)),
    (("n_layers = 24", "n_layers = 24\ncontext = -5"), ("context: must be an integer >= 0",)),
    (('at = "all"', "at = []"), ("layers[0].at", "selects no layer")),
    (('at = "all"', 'at = "all"\npattern = "KKKA"'), ("layers[0].pattern", "ignored")),
    (('token = "attn"', 'pattern = "AB"\ntoken = { A = "attn", C = "attn" }'), ("layers[0].token", "'C'")),
    (('token = "attn"', "token = 3"), ("layers[0].token", "must name a store")),
    (('depth = "res"', 'depth = "res"\ncache_owner = true'), ("layers[0].cache_owner",)),
    (('depth = "res"', 'depth = "res"\n\n[published]\nstored = "lots"'), ("published.stored",)),
])
def test_bad_model_files_are_named(change, says, tmp_path):
    f = tmp_path / "m.toml"
    f.write_text(BASE.format(n=24).replace(*change, 1))
    before = f.read_bytes()
    refused("generate", "--config", f, says=(str(f), *says))
    assert f.read_bytes() == before


@pytest.mark.parametrize("text, says", [
    ('[{"name": "m"}]', "top level"),
    ('{"name": "m", "d_model": 8, "vocab_size": 8, "n_layers": 1, "stores": [], "layers": []}', "stores: must be a table"),
    ('{"name": "m", "d_model": 8, "vocab_size": 8, "n_layers": 1, "stores": {}, "layers": ["all"]}', "layers[0]"),
])
def test_json_model_files_of_the_wrong_shape(text, says, tmp_path):
    f = tmp_path / "m.json"
    f.write_text(text)
    refused("generate", "--config", f, says=(str(f), says))


# -- config.json ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("config, says", [
    ({"hidden_size": "4096"}, "hidden_size: must be a positive integer, got '4096'"),
    ({"num_hidden_layers": 4, "layer_types": ["full_attention"] * 3}, "layer_types: has 3 entries, but num_hidden_layers is 4"),
    ({"num_attention_heads": 2.5}, "num_attention_heads"),
    ({"rms_norm_eps": "small"}, "rms_norm_eps"),
    ({"tie_word_embeddings": "no"}, "tie_word_embeddings"),
    ({"text_config": {"vocab_size": -1}}, "text_config.vocab_size"),
])
def test_bad_hugging_face_configs_are_named(config, says, tmp_path):
    d = tmp_path / "ckpt"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": "qwen3_next", **config}))
    before = snapshot(d)
    refused("generate", "--checkpoint", d, says=("config.json", says))
    assert snapshot(d) == before


# -- numeric options -----------------------------------------------------------------------------------
@pytest.mark.parametrize("args, option", [
    (("generate", "kimi-k3", "--tiny", "--chunk", "-4"), "--chunk"),
    (("generate", "kimi-k3", "--tiny", "--temperature", "nan"), "--temperature"),
    (("generate", "kimi-k3", "--tiny", "--temperature", "inf"), "--temperature"),
    (("generate", "kimi-k3", "--tiny", "--top-k", "-5"), "--top-k"),
    (("generate", "kimi-k3", "--tiny", "--seed", str(10**20)), "--seed"),
    (("generate", "kimi-k3", "--tiny", "--prompt-len", "0"), "--prompt-len"),
    (("generate", "kimi-k3", "--tiny", "--new-tokens", "-1"), "--new-tokens"),
    (("train", "--threads", "-1"), "--threads"),
    (("train", "--lr", "0"), "--lr"),
    (("train", "--lr", "nan"), "--lr"),
    (("train", "--steps", "0"), "--steps"),
    (("train", "--seed", "-1"), "--seed"),
    (("bench", "gdn", "--repeats", "-1"), "--repeats"),
    (("bench", "prefill", "--length", "-5"), "--length"),
    (("bench", "prefill", "--model", "kimi-k9", "--quick"), "--model"),
    (("probe", "selection", "--model", "tiny-kimi-k3", "--n", "0"), "--n"),
    (("probe", "selection", "--model", "tiny-kimi-k3", "--n", "-3"), "--n"),
    (("save", "kimi-k3", "x", "--tiny", "--max-shard-mb", "0"), "--max-shard-mb"),
    (("recall", "--widths", "abc"), "--widths"),
    (("recall", "--widths", "16,,x"), "--widths"),
    (("recall", "--pairs", "0"), "--pairs"),
    (("recall", "--models", "attention,nope"), "models"),
    (("train", "--model", "attention", "--task-opt", "mix=abc"), "mix"),
    (("train", "--model", "attention", "--task-opt", "vocab_size=4.5"), "vocab_size: must be an integer"),
    (("train", "--model", "attention", "--model-opt", "n_heads=4.5"), "n_heads: must be an integer"),
    (("train", "--model", "pattern:"), "pattern"),
])
def test_bad_numeric_options_are_named(args, option, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    refused(*args, says=(option,))
    assert not list(tmp_path.iterdir())  # nothing written


@pytest.mark.parametrize("args, says", [
    (("generate", "kimi-k3"), ("kimi-k3 is full scale", "--tiny")),
    (("train", "--model", "kimi-k3"), ("kimi-k3 is full scale", "tiny-kimi-k3")),
    (("save", "qwen3.8", "out"), ("qwen3.8 is full scale", "--tiny")),
    (("probe", "selection", "--model", "glm-5.3"), ("glm-5.3 is full scale", "tiny-glm-5.3")),
])
def test_full_scale_models_are_refused_up_front(args, says, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = refused(*args, says=(*says, "GiB"))
    assert "parameters" in out
    assert not list(tmp_path.iterdir())


def test_every_spelling_of_a_tiny_model_works():
    for args in (("generate", "tiny-qwen3.8"), ("generate", "qwen3.8.tiny"), ("generate", "qwen3.8", "--tiny")):
        code, out = run(*args, "--prompt-len", "4", "--new-tokens", "1", "--json")
        assert code == 0, out
