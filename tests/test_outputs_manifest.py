"""A folder is the command's own only by its manifest (issue 38, item 0): a file that bears a marker's
name (``report.html``, ``probe.json``, ``capacity.json``, ``recall.json``, ``subjects.json``, a run's
``checkpoint.json``) but that the command did not write, or that changed since, is refused before
any work unless ``--force``; ``train --fresh`` is not ``--force``."""

from __future__ import annotations

import json

import pytest

from storelab.outputs import MANIFEST
from tests.test_bad_inputs import refused, run, snapshot, wide_console  # noqa: F401 (an autouse fixture)

SMALL = ("--model-opt", "d_model=16", "--model-opt", "n_layers=1", "--model-opt", "n_heads=2",
         "--model-opt", "head_dim=8", "--model-opt", "d_ff=16")
MARKERS = {
    "report.html": ("report", "--quick", "--out"),
    "probe.json": ("probe", "forgetting", "--model", "tiny-kimi-k3", "--out"),
    "capacity.json": ("capacity", "1", "--quick", "--plot"),
    "recall.json": ("recall", "--models", "attention", "--steps", "1", "--widths", "16", "--pairs", "4", "--out"),
    "subjects.json": ("subjects", "train", "--all", "--out"),
}


@pytest.mark.parametrize("marker", sorted(MARKERS))
def test_a_user_s_file_with_the_marker_s_name_is_kept(tmp_path, marker):
    u = tmp_path / "u"
    u.mkdir()
    (u / marker).write_text("<html>mine</html>" if marker.endswith(".html") else '{"mine": true}')
    before = snapshot(tmp_path)
    refused(*MARKERS[marker], u, says=(str(u / marker), "not written by this command", MANIFEST, "--force"))
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("fresh", [(), ("--fresh",)])
def test_train_fresh_is_not_force(tmp_path, fresh):
    u = tmp_path / "u5"
    u.mkdir()
    (u / "checkpoint.json").write_text('{"mine": 1}')
    (u / "config.json").write_text('{"train_config": "mine"}')
    before = snapshot(tmp_path)
    refused("train", "--model", "attention", "--steps", "1", "--batch-size", "4", *SMALL, "--out", u, *fresh,
            says=("--out", "checkpoint.json", "not written by this command", "--force"))
    assert snapshot(tmp_path) == before


def test_a_run_resumes_and_a_file_changed_since_is_the_user_s(tmp_path):
    u = tmp_path / "r"
    args = ("train", "--model", "attention", "--steps", "2", "--batch-size", "4", "--eval-every", "2",
            "--checkpoint-every", "2", *SMALL, "--out", u, "--json")
    code, out = run(*args)
    assert code == 0, out
    listed = json.loads((u / MANIFEST).read_text())["files"]
    assert set(listed) == {"checkpoint.json", "config.json"}
    code, out = run(*args, "--fresh")  # its own files: started over without --force
    assert code == 0, out
    cfg = json.loads((u / "config.json").read_text())
    cfg["note"] = "edited by hand"
    (u / "config.json").write_text(json.dumps(cfg))
    before = snapshot(tmp_path)
    refused(*args[:-1], "--fresh", says=(str(u / "config.json"), "changed since", "--force"))
    assert snapshot(tmp_path) == before


def test_recall_rewrites_its_own_folder(tmp_path):
    u = tmp_path / "rc"
    args = ("recall", "--models", "attention", "--steps", "1", "--widths", "16", "--pairs", "4", "--out", u, "--json")
    for _ in range(2):
        code, out = run(*args)
        assert code == 0, out
    assert {"recall.json", "recall.png"} <= set(json.loads((u / MANIFEST).read_text())["files"])
