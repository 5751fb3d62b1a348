"""Bad inputs through the Python API, output safety's pieces, and output that misled (issue 20)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from storelab.outputs import (MANIFEST, OutputError, atomic_path, atomic_write, check_file, check_folder, folder_kind,
                              owned)


# -- outputs -------------------------------------------------------------------------------------------
def test_folder_kinds(tmp_path):
    assert folder_kind(tmp_path / "none") is None
    assert folder_kind(tmp_path) == "empty"
    cases = {"save": {"config.json": json.dumps({"model_type": "storelab"})},
             "run": {"checkpoint.safetensors": ""},
             "hf": {"config.json": json.dumps({"model_type": "llama"})},
             "hf2": {"pytorch_model.bin": ""},
             "report": {"report.json": "{}"},
             "recall": {"recall.json": "{}"},
             "capacity": {"capacity.json": "{}"},
             "other": {"notes.txt": "mine"}}
    for name, files in cases.items():
        d = tmp_path / name
        d.mkdir()
        for f, text in files.items():
            (d / f).write_text(text)
        assert folder_kind(d) == name.rstrip("2")


def test_check_folder_rules(tmp_path):
    d = tmp_path / "r"
    d.mkdir()
    (d / "report.json").write_text("{}")
    assert check_folder(d, "report") == d                        # its own kind: rewritten
    with pytest.raises(OutputError, match="report folder.*not a storelab train run"):
        check_folder(d, "run")
    assert check_folder(d, "run", force=True) == d               # --force
    assert check_folder(tmp_path / "new" / "deeper", "run")      # created later, nothing made now
    assert not (tmp_path / "new").exists()
    with pytest.raises(ValueError, match="kind"):
        check_folder(d, "nonsense")


def test_a_file_is_the_command_s_own_only_as_its_manifest_lists_it(tmp_path):
    """Ownership is proven by the manifest's hashes, never by a file's name (issue 38)."""
    d = tmp_path / "r"
    d.mkdir()
    (d / "report.html").write_text("<html>mine</html>")  # the marker's name, the user's content
    with pytest.raises(OutputError, match=f"report.html was not written by this command.*{MANIFEST}.*older"):
        check_folder(d, "report", ("report.html", "report.json"))
    assert check_folder(d, "report", ("report.html",), force=True) == d
    atomic_write(d / "report.html", "<html>ours</html>")        # now listed with its hash
    assert owned(d / "report.html") and check_folder(d, "report", ("report.html", "*.png")) == d
    (d / "report.html").write_text("<html>edited by hand</html>")  # changed since: the user's again
    assert not owned(d / "report.html")
    with pytest.raises(OutputError, match="changed since"):
        check_folder(d, "report", ("report.html",))
    (d / "notes.png").write_bytes(b"a user's figure")            # beside the command's own files
    atomic_write(d / "report.html", "<html>ours</html>")
    with pytest.raises(OutputError, match="notes.png was not written by this command"):
        check_folder(d, "report", ("report.html", "*.png"))
    sub = d / "capacity"
    sub.mkdir()
    with pytest.raises(OutputError, match="capacity holds files"):  # a folder storelab never wrote into
        check_folder(d, "report", ("report.html", "capacity"))
    atomic_write(sub / "capacity.json", "{}")
    assert check_folder(d, "report", ("report.html", "capacity")) == d


def test_check_file(tmp_path):
    f = tmp_path / "a.png"
    assert check_file(f) == f
    f.write_bytes(b"x")
    with pytest.raises(OutputError, match="exists"):
        check_file(f)
    assert check_file(f, force=True) == f
    with pytest.raises(OutputError, match="folder"):
        check_file(tmp_path)


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path):
    f = tmp_path / "x.json"
    atomic_write(f, "old")
    with pytest.raises(RuntimeError):
        with atomic_path(f) as tmp:
            tmp.write_text("half")
            raise RuntimeError("killed")
    assert f.read_text() == "old"
    assert sorted(os.listdir(tmp_path)) == [MANIFEST, "x.json"]  # no temporary left behind
    atomic_write(f, b"new")
    assert f.read_bytes() == b"new" and sorted(os.listdir(tmp_path)) == [MANIFEST, "x.json"]
    assert oct(f.stat().st_mode & 0o777) == oct(0o666 & ~_umask())  # as a plain write would leave it


def _umask() -> int:
    cur = os.umask(0)
    os.umask(cur)
    return cur


def test_save_api_refuses_another_kind(tmp_path):
    from storelab.checkpoint import save
    from storelab.models.model import Model
    from storelab.train.models import resolve_model

    d = tmp_path / "hf"
    d.mkdir()
    (d / "config.json").write_text('{"model_type": "llama"}')
    model = Model(resolve_model("attention", 32, d_model=16, n_layers=1, n_heads=2, head_dim=8, d_ff=16))
    with pytest.raises(OutputError, match="Hugging Face"):
        save(model, d)
    assert (d / "config.json").read_text() == '{"model_type": "llama"}'
    with pytest.raises(ValueError, match="max_shard_bytes"):
        save(model, tmp_path / "s", max_shard_bytes=0)


def test_resharding_removes_only_stale_shards(tmp_path):
    from storelab.checkpoint import load, save
    from storelab.models.model import Model
    from storelab.train.models import resolve_model

    model = Model(resolve_model("attention", 32, d_model=16, n_layers=2, n_heads=2, head_dim=8, d_ff=16))
    d = tmp_path / "s"
    many = save(model, d, max_shard_bytes=2_000)
    assert len(many) > 3
    one = save(model, d)
    assert sorted(p.name for p in d.iterdir() if p.name != MANIFEST) == sorted(p.name for p in one) == [
        "config.json", "model.safetensors"]
    load(d)


# -- ops and states ------------------------------------------------------------------------------------
def test_attention_ops_refuse_integer_and_numpy_inputs():
    from storelab.ops import attend, attend_causal

    x = torch.ones(1, 4, 2, 8)
    with pytest.raises(ValueError, match="attend_causal: q: must be a floating-point tensor, got torch.int64"):
        attend_causal(x.long(), x, x, scale=1.0)
    with pytest.raises(ValueError, match="attend: v: must be a torch.Tensor, got ndarray"):
        attend(x, x, np.ones((1, 4, 2, 8)), scale=1.0)


def test_a_state_of_another_kind_is_named():
    from storelab.state import StateKindError
    from storelab.stores import build_store

    att = build_store({"kind": "attention", "d_model": 16, "n_heads": 2, "head_dim": 8}).build()
    rec = build_store({"kind": "kda", "d_model": 16, "n_heads": 2, "head_k_dim": 8}).build()
    x = torch.randn(1, 3, 16)
    _, s_att = att(x)
    _, s_rec = rec(x)
    with pytest.raises(ValueError, match="KVCache has no field .*another store's kind"):
        rec(x, s_att)
    with pytest.raises(StateKindError, match="RecurrentState"):
        att(x, s_rec)
    assert getattr(s_att, "no_such_field", 7) == 7  # still an AttributeError for getattr with a default


def test_train_and_task_configs_are_typed():
    from storelab.tasks import make_task
    from storelab.train.loop import TrainConfig

    for kw, says in ((dict(steps="x"), "steps: must be an integer"), (dict(lr=float("nan")), "lr: must be a finite"),
                     (dict(task_options=[1]), "task_options: must be a table")):
        with pytest.raises(ValueError, match=says):
            TrainConfig(**kw)
    with pytest.raises(ValueError, match=r"mix: must be a list, each a list \[integer, integer\]"):
        make_task("mqar", "tiny", mix=[[64]])


def test_bench_errors_are_not_shown_as_the_peer(capsys):
    from storelab.commands.bench import failed, print_tables

    res = {"date": "d", "machine": {"cpus": 1, "torch": "t", "torch_threads": 1},
           "prefill": {"length": 8, "speed_length": 8, "chunk": 4,
                       "models": [{"model": "kimi-k3", "error": "ValueError: boom"}]}}
    print_tables(res)
    out = capsys.readouterr().out
    assert "prefill kimi-k3 failed" in out and failed(res)


# -- output that misled --------------------------------------------------------------------------------
def test_probe_selection_rows_keep_ours_in_our_column():
    from storelab.report.probe_rows import probe_rows as _rows

    r = {"miss_rate": 0.1, "top1_miss": 0.0, "mass_missed": 0.2, "first_block_rate": 0.9, "essay": {},
         "layers": [{"layer": 3, "kind": "dsa", "miss_rate": 0.25, "first_block_rate": 0.75}]}
    rows = _rows("selection", r)
    per_layer = [row for row in rows if row[0].startswith("layer 3")]
    assert [row[1] for row in per_layer] == [0.25, 0.75]
    assert all(row[2] == "-" for row in per_layer)


def test_zoo_notes_are_whole_sentences():
    from storelab.zoo import load_zoo, zoo_names

    for name in zoo_names():
        pub = load_zoo(name).published
        if pub is not None and pub.note:
            assert pub.note.rstrip().endswith((".", ")")), f"{name}: note ends {pub.note[-40:]!r}"


def test_report_compares_like_with_like_for_engram(tmp_path):
    from storelab.report.core import Context
    from storelab.report.memory import models_section

    res = models_section(Context(out=tmp_path, quick=True))
    t = res.tables[0]
    row = next(r for r in t.rows if r[0].startswith("deepseek-v4.1-flash"))
    cols = t.columns
    stored, published, ratio = row[cols.index("stored")], row[cols.index("published")], row[cols.index("ratio")]
    assert "without Engram" in row[0]
    assert stored / published == pytest.approx(ratio)


def test_stores_shows_the_kind(monkeypatch):
    from typer.testing import CliRunner

    from storelab.cli import app

    r = CliRunner().invoke(app, ["stores", "--json"])
    kinds = [c["kind"] for c in json.loads(r.stdout)]
    assert "kda" in kinds and "gated_deltanet" in kinds
    narrow = CliRunner().invoke(app, ["stores"]).stdout  # 80 columns: one block per store, no word cut
    assert "gated_deltanet: Gated DeltaNet" in narrow
    from storelab.console import console

    monkeypatch.setattr(console, "width", 200)
    wide = CliRunner().invoke(app, ["stores"]).stdout
    assert "Kind" in wide and "gated_deltaproduct" in wide
