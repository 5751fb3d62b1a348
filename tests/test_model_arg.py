"""One model argument everywhere (``storelab.checkpoint.source``): what a string names, the Hugging Face
cache built by hand in its published layout (``models--org--name/snapshots/<commit>/``, ``refs/<branch>``),
and the commands that take it. The network is never touched: the online path runs with
huggingface_hub's network functions replaced."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

import storelab
from storelab.checkpoint import source
from storelab.checkpoint.source import Source, resolve
from storelab.cli import app

CONFIGS = Path(__file__).parent / "fixtures" / "configs"
LLAMA = CONFIGS / "Llama-3.2-1B-Instruct.json"
C1, C2 = "1" * 40, "2" * 40


def run(*args: str):
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "300"})


def said(res) -> str:
    return " ".join(res.output.split())


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    """A storelab save of tiny-kimi-k3: config.json + model.safetensors."""
    import torch

    from storelab.checkpoint import save
    from storelab.models.model import Model
    from storelab.zoo import load_zoo

    torch.manual_seed(0)
    d = tmp_path_factory.mktemp("tiny") / "tiny-kimi"
    save(Model(load_zoo("kimi-k3", tiny=True)).eval(), d)
    return d


def snapshot(cache: Path, repo: str, commit: str, files: dict[str, Path | str], refs: tuple[str, ...] = ("main",)):
    """One snapshot of ``repo`` in the published layout: files copied in (a str: written as text), refs pointed."""
    folder = cache / ("models--" + repo.replace("/", "--"))
    snap = folder / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    for name, src in files.items():
        if isinstance(src, Path):
            shutil.copy(src, snap / name)
        else:
            (snap / name).write_text(src)
    for ref in refs:
        (folder / "refs").mkdir(exist_ok=True)
        (folder / "refs" / ref).write_text(commit)
    return snap


@pytest.fixture
def cache(tmp_path, monkeypatch, tiny_folder) -> Path:
    """HF_HUB_CACHE under tmp_path: org/tiny (config + safetensors), org/cfg (config.json alone; main at C1,
    dev at C2), org/gguf (two GGUF files), org/one-gguf (one), org/noref (a snapshot, no ref)."""
    c = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(c))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    snapshot(c, "org/tiny", C1, {p.name: p for p in tiny_folder.iterdir()})
    snapshot(c, "org/cfg", C1, {"config.json": LLAMA})
    snapshot(c, "org/cfg", C2, {"config.json": CONFIGS / "Qwen3-0.6B.json"}, refs=("dev",))
    snapshot(c, "org/gguf", C1, {"a-Q4_K_M.gguf": "x", "a-Q8_0-00001-of-00002.gguf": "x",
                                 "a-Q8_0-00002-of-00002.gguf": "x"})
    snapshot(c, "org/one-gguf", C1, {"m-00001-of-00002.gguf": "x", "m-00002-of-00002.gguf": "x"})
    snapshot(c, "org/noref", C1, {"config.json": LLAMA}, refs=())
    return c


# ------------------------------------------------------------------------------------ the resolver
def test_zoo_names_in_every_spelling():
    for text, tiny in (("kimi-k3", False), ("kimi-k3.tiny", True), ("tiny-kimi-k3", True), ("zoo:kimi-k3", False)):
        src = resolve(text)
        assert (src.kind, src.zoo, src.tiny, src.text) == (Source.ZOO, "kimi-k3", tiny, text)
    assert resolve("kimi-k3", tiny=True).tiny
    assert source.model_config(resolve("tiny-kimi-k3")).name == "kimi-k3.tiny"


def test_unknown_name_lists_what_was_tried(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    with pytest.raises(ValueError) as e:
        resolve("kimy-k3")
    assert "close: kimi-k3" in str(e.value) and str(Path("kimy-k3").resolve()) in str(e.value)
    with pytest.raises(ValueError, match="does not exist"):
        resolve(str(tmp_path / "nowhere"))
    with pytest.raises(ValueError, match=r"no zoo model 'kimy-k3'"):
        resolve("zoo:kimy-k3")


def test_local_paths(tmp_path, tiny_folder):
    assert resolve(str(tiny_folder)).kind is Source.FOLDER
    assert resolve(str(tiny_folder / "config.json")).kind is Source.CONFIG_JSON
    assert resolve(str(LLAMA)).kind is Source.CONFIG_JSON
    assert resolve("storelab/zoo/kimi-k3.tiny.toml").kind is Source.MODEL_FILE
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"extends": "kimi-k3.tiny", "name": "mine"}))
    assert resolve(str(mine)).kind is Source.MODEL_FILE
    assert source.model_config(resolve(str(mine))).name == "mine"
    (tmp_path / "odd.json").write_text(json.dumps({"hello": 1}))
    with pytest.raises(ValueError, match="neither a Hugging Face config.json"):
        resolve(str(tmp_path / "odd.json"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json and no .gguf"):
        resolve(str(tmp_path / "empty"))
    with pytest.raises(ValueError, match="--tiny: picks the tiny version"):
        resolve(str(tiny_folder), tiny=True)


def test_gguf_files_and_split_shards(tmp_path):
    (tmp_path / "m.gguf").write_text("x")
    assert resolve(str(tmp_path / "m.gguf")).kind is Source.GGUF
    for k in (1, 2):
        (tmp_path / f"s-0000{k}-of-00002.gguf").write_text("x")
    assert resolve(str(tmp_path / "s-00001-of-00002.gguf")).kind is Source.GGUF
    with pytest.raises(ValueError, match="give the first, s-00001-of-00002.gguf"):
        resolve(str(tmp_path / "s-00002-of-00002.gguf"))
    one = tmp_path / "one"
    one.mkdir()
    (one / "q.gguf").write_text("x")
    assert resolve(str(one)).path == one / "q.gguf"
    with pytest.raises(ValueError, match=r"holds 2 GGUF files \(m.gguf, s-00001-of-00002.gguf\)"):
        resolve(str(tmp_path))


def test_ambiguous_names(tmp_path, monkeypatch, cache):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "kimi-k3").mkdir()
    shutil.copy(LLAMA, tmp_path / "kimi-k3" / "config.json")
    with pytest.raises(ValueError, match=r"both a zoo model and a folder.*\./kimi-k3.*zoo:kimi-k3"):
        resolve("kimi-k3")
    assert resolve("./kimi-k3").kind is Source.FOLDER and resolve("zoo:kimi-k3").kind is Source.ZOO
    (tmp_path / "org" / "cfg").mkdir(parents=True)
    shutil.copy(LLAMA, tmp_path / "org" / "cfg" / "config.json")
    with pytest.raises(ValueError, match=r"both a path here.*hf://org/cfg"):
        resolve("org/cfg")
    assert resolve("hf://org/cfg").kind is Source.HUB and resolve("./org/cfg").kind is Source.FOLDER
    (tmp_path / "org" / "local").mkdir()   # a folder here that is no cached repo: the folder
    shutil.copy(LLAMA, tmp_path / "org" / "local" / "config.json")
    assert resolve("org/local").kind is Source.FOLDER


# -------------------------------------------------------------------------- the Hugging Face cache
def test_repo_from_the_cache(cache):
    full = resolve("org/tiny")
    assert full.kind is Source.HUB and full.path == cache / "models--org--tiny" / "snapshots" / C1
    assert full.repo.commit == C1 and full.repo.cache == cache
    assert source.weights_path(full) == full.path
    assert source.model_config(full).name == "tiny"   # the repo's name, not the commit folder's
    only = resolve("org/cfg")
    cfg = source.model_config(only)
    assert (cfg.name, cfg.title) == ("cfg", "cfg (llama)")
    with pytest.raises(ValueError, match=r"holds config.json but no weights.*`hf download org/cfg`"):
        source.weights_path(only)


def test_revision_by_branch_and_by_commit(cache):
    assert resolve("org/cfg@dev").path.name == C2
    assert resolve(f"org/cfg@{C1}").path.name == C1
    assert resolve(f"org/cfg@{C2}").path.name == C2
    assert source.model_config(resolve("org/cfg@dev")).title == "cfg (qwen3)"
    with pytest.raises(ValueError) as e:
        resolve("org/cfg@nope")
    assert "revision 'nope' is not there (refs: dev, main" in str(e.value) and str(cache) in str(e.value)


def test_missing_ref_and_offline_miss(cache):
    with pytest.raises(ValueError) as e:
        resolve("org/noref")
    assert "org/noref: not in the Hugging Face cache" in str(e.value) and "refs: none" in str(e.value)
    with pytest.raises(ValueError) as e:
        resolve("org/absent")
    msg = str(e.value)
    assert "org/absent" in msg and str(cache) in msg and "HF_HUB_OFFLINE" in msg and "hf download org/absent" in msg


def test_gguf_repos(cache):
    with pytest.raises(ValueError) as e:
        resolve("org/gguf")
    assert "2 GGUF files (a-Q4_K_M.gguf, a-Q8_0-00001-of-00002.gguf)" in str(e.value)
    assert "org/gguf/FILE.gguf" in str(e.value)
    src = resolve("org/gguf/a-Q4_K_M.gguf")
    assert src.kind is Source.HUB and src.path.name == "a-Q4_K_M.gguf" and src.repo.filename == "a-Q4_K_M.gguf"
    assert resolve("org/one-gguf").path.name == "m-00001-of-00002.gguf"
    with pytest.raises(ValueError, match="b.gguf is not in the cached snapshot"):
        resolve("org/gguf/b.gguf")


def test_resolution_writes_nothing(cache, tmp_path):
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for text in ("org/tiny", "org/cfg@dev", "org/one-gguf"):
        resolve(text)
    for text in ("org/absent", "org/noref"):
        with pytest.raises(ValueError):
            resolve(text)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_online_fetches_config_and_headers_only(cache, monkeypatch):
    """Online (no HF_HUB_OFFLINE): a repo not in the cache has config.json fetched (hf_hub_download) and
    its safetensors headers read (get_safetensors_metadata); both replaced here, no network."""
    monkeypatch.delenv("HF_HUB_OFFLINE")
    calls = []

    def download(repo_id, filename, *, revision=None, cache_dir=None, **kw):
        calls.append(("download", repo_id, filename))
        assert filename == "config.json"
        return str(snapshot(Path(cache_dir), repo_id, C1, {"config.json": LLAMA}) / "config.json")

    def headers(repo_id, *, revision=None, **kw):
        calls.append(("headers", repo_id))
        tensor = SimpleNamespace(dtype="BF16", shape=[1_235_814_400])   # the config's parameters, as bf16
        return SimpleNamespace(files_metadata={"model.safetensors": SimpleNamespace(tensors={"w": tensor})})

    monkeypatch.setattr(source, "hf_hub_download", download)
    monkeypatch.setattr(source, "get_safetensors_metadata", headers)
    src = resolve("org/remote")
    assert src.kind is Source.HUB and src.path is None and not calls   # resolution alone fetches nothing
    with pytest.raises(ValueError, match=r"not in the Hugging Face cache .* `hf download org/remote`"):
        source.weights_path(src)
    res = run("memory", "org/remote", "--context", "1000", "--budget", "8GiB", "--json")
    assert res.exit_code == 0, res.output
    rec = json.loads(res.stdout)["models"][0]
    assert rec["model"] == "remote"
    assert rec["budget"]["weights_format"] == "folder" and rec["budget"]["weights_by_dtype"] == {"BF16": 2_471_628_800}
    assert calls == [("download", "org/remote", "config.json"), ("headers", "org/remote")]
    res = run("memory", "org/other", "--offline", "--context", "1000")   # --offline: no fetch
    assert res.exit_code == 2 and "org/other: not in the Hugging Face cache" in said(res)
    assert len(calls) == 2


# ------------------------------------------------------------------------------------ the commands
def test_models_and_memory_take_any_model(cache, tiny_folder):
    for arg, name in ((str(tiny_folder), "tiny-kimi"), (str(LLAMA), "Llama-3.2-1B-Instruct"), ("org/cfg", "cfg"),
                      ("org/tiny", "tiny"), ("tiny-kimi-k3", "kimi-k3.tiny")):
        res = run("models", arg, "--json")
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)[0]["name"] == name
        res = run("memory", arg, "--context", "1000", "--json")
        assert res.exit_code == 0, res.output
        assert json.loads(res.stdout)["models"][0]["model"] == name
    res = run("models", "org/cfg", "--json")
    assert json.loads(res.stdout)[0]["title"] == "cfg (llama)" and "parts" in json.loads(res.stdout)[0]
    res = run("memory", "org/tiny", "--context", "1000", "--budget", "1GiB", "--json")
    bud = json.loads(res.stdout)["models"][0]["budget"]
    assert bud["weights_format"] == "folder"   # the cached shards' headers
    res = run("memory", "org/cfg", "--offline", "--context", "1000", "--budget", "8GiB", "--json")
    assert json.loads(res.stdout)["models"][0]["budget"]["weights_format"] == "bf16"   # no shards, offline
    # the flags as before, beside positional models
    res = run("models", "tiny-kimi-k3", "--checkpoint", str(LLAMA), "--json")
    assert [r["name"] for r in json.loads(res.stdout)] == ["kimi-k3.tiny", "Llama-3.2-1B-Instruct"]


def test_command_errors_exit_2(cache, tiny_folder):
    for args, msg in ((["models", "org/absent", "--offline"], f"org/absent: not in the Hugging Face cache {cache}"),
                      (["memory", "org/absent"], "hf download org/absent"),
                      (["memory", "kimy-k3"], "close: kimi-k3"),
                      (["models", str(tiny_folder), "--tiny"], "--tiny: picks the tiny version"),
                      (["memory", "org/gguf"], "pick one as org/gguf/FILE.gguf"),
                      (["generate", "org/cfg"], "holds config.json but no weights"),
                      (["generate", "org/absent"], "hf download org/absent"),
                      (["save", "org/cfg", str(cache.parent / "out")], "hf download org/cfg"),
                      (["probe", "state_swap", "org/cfg"], "hf download org/cfg"),
                      (["probe", "state_swap", "org/absent", "--checkpoint", "x"], "give the model once")):
        res = run(*args)
        assert res.exit_code == 2 and msg in said(res), (args, res.output)
        assert "Traceback" not in res.output
    assert not (cache.parent / "out").exists()


def test_generate_save_and_load_from_the_cache(cache, tmp_path):
    res = run("generate", "org/tiny", "--prompt-len", "4", "--new-tokens", "2", "--json")
    assert res.exit_code == 0, res.output
    assert len(json.loads(res.stdout)["tokens"]) == 2
    res = run("generate", "tiny-kimi-k3", "--prompt-len", "4", "--new-tokens", "1", "--json")
    assert res.exit_code == 0, res.output
    res = run("save", "org/tiny", str(tmp_path / "copy"), "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["source"] == "org/tiny" and (tmp_path / "copy" / "config.json").is_file()
    res = run("save", "kimi-k3.tiny", str(tmp_path / "zoo"), "--json")   # the tiny version said in the name
    assert res.exit_code == 0 and json.loads(res.stdout)["model"] == "kimi-k3.tiny", res.output
    net = storelab.load("org/tiny")
    assert net.checkpoint["path"] == str(cache / "models--org--tiny" / "snapshots" / C1)
    assert storelab.load(str(tmp_path / "copy")).cfg.n_layers == net.cfg.n_layers
    assert storelab.load("tiny-kimi-k3").cfg.name == "kimi-k3.tiny"   # random weights
    with pytest.raises(ValueError, match="hf download org/cfg"):
        storelab.load("org/cfg")


def test_probe_takes_the_model_positionally(cache):
    res = run("probe", "state_swap", "tiny-kimi-k3", "--n", "2", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["model"].startswith("kimi-k3")
    res = run("probe", "forgetting", "org/tiny", "--weights-only", "--json")
    assert res.exit_code == 0, res.output


def test_gguf_end_to_end(cache, tmp_path):
    """A .gguf path and a GGUF repo in the cache reach the GGUF reader as a folder path would."""
    from tests.family_harness import tiny_hf
    from tests.gguf_writer import write_gguf

    hf = tiny_hf("llama", dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                               vocab_size=128, intermediate_size=96, head_dim=16, max_position_embeddings=512))
    path = tmp_path / "tiny-llama.gguf"
    write_gguf(hf, "llama", path)
    snapshot(cache, "org/llama-gguf", C1, {"tiny-llama-Q8_0.gguf": path})
    for arg, name in ((str(path), "tiny-llama"), ("org/llama-gguf", "llama-gguf")):
        res = run("models", arg, "--json")
        assert res.exit_code == 0 and json.loads(res.stdout)[0]["name"] == name, res.output
        res = run("memory", arg, "--context", "100", "--json")
        assert res.exit_code == 0 and json.loads(res.stdout)["models"][0]["model"] == name, res.output
        res = run("generate", arg, "--prompt-len", "4", "--new-tokens", "1", "--json")
        assert res.exit_code == 0 and len(json.loads(res.stdout)["tokens"]) == 1, res.output
    assert storelab.load("org/llama-gguf").checkpoint["gguf"]["architecture"] == "llama"
