"""Issue 38, item 8: options that would be ignored and figures that would be silently wrong end in exit 2,
naming what is wrong."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from storelab.cli import app


def test_prompt_len_with_a_prompt_is_refused():
    res = CliRunner().invoke(app, ["generate", "tiny-qwen3.8", "--prompt", "hi", "--prompt-len", "5"])
    assert res.exit_code == 2 and "--prompt-len" in res.output and "--prompt" in res.output


def test_a_damaged_subjects_index_is_named(tmp_path):
    (tmp_path / "subjects.json").write_text("garbage")
    res = CliRunner().invoke(app, ["subjects", "--dir", str(tmp_path)])
    assert res.exit_code == 2 and "subjects.json: not a subjects index" in res.output
    (tmp_path / "subjects.json").write_text('{"format": "other"}')
    res = CliRunner().invoke(app, ["subjects", "--dir", str(tmp_path)])
    assert res.exit_code == 2 and "subjects.json" in res.output


def test_generate_refuses_non_finite_logits():
    """fp16 weights that overflow: NaN argmaxes to token 0, which must not be printed as generated."""
    from storelab.models.model import Model, generate
    from storelab.zoo import load_zoo

    torch.manual_seed(0)
    model = Model(load_zoo("qwen3.8", tiny=True)).eval()
    with torch.no_grad():
        model.lm_head.weight.fill_(float("inf"))
    with pytest.raises(ValueError, match="not finite"):
        generate(model, torch.randint(0, 100, (1, 5)), 3)


def test_one_tensor_in_two_unindexed_files_is_refused(tmp_path):
    from safetensors.torch import save_file

    from storelab.checkpoint.shards import CheckpointError, Shards

    save_file({"w": torch.zeros(2)}, str(tmp_path / "a.safetensors"))
    save_file({"w": torch.ones(2)}, str(tmp_path / "b.safetensors"))
    with pytest.raises(CheckpointError, match=r"'w' is in both a.safetensors and b.safetensors"):
        Shards(tmp_path)
