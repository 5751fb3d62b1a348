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


def test_budget_refuses_weights_of_another_model(tmp_path):
    """A config.json describing a large model beside the shards of a tiny one: the budget is not planned."""
    import json

    from safetensors.torch import save_file

    hf = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
          "num_key_value_heads": 8, "intermediate_size": 14336, "vocab_size": 128256}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    save_file({"model.embed_tokens.weight": torch.zeros(16, 8)}, str(tmp_path / "model.safetensors"))
    res = CliRunner().invoke(app, ["memory", str(tmp_path), "--budget", "24GiB", "--context", "4096"])
    assert res.exit_code == 2 and "different models" in res.output, res.output


@pytest.mark.parametrize("args", [["state_swap", "--model", "tiny-qwen3.8", "--decode"],
                                  ["state_swap", "--model", "tiny-qwen3.8", "--position", "5"],
                                  ["keep_one", "--model", "tiny-qwen3.8", "--position", "3"]])
def test_state_swap_text_options_elsewhere_are_refused(args):
    res = CliRunner().invoke(app, ["probe", *args])
    assert res.exit_code == 2 and ("--decode" in res.output or "--position" in res.output), res.output


def test_n_on_selection_over_text_is_refused(tmp_path):
    """selection on a checkpoint's text reads every document; an --n would be ignored."""
    import json

    from storelab.checkpoint import save
    from storelab.models.model import Model
    from storelab.zoo import load_zoo

    torch.manual_seed(0)
    folder = tmp_path / "m"
    save(Model(load_zoo("qwen3.8", tiny=True)).eval(), folder)
    (folder / "tokenizer.json").write_text(json.dumps({"version": "1.0"}))   # never read: refused before
    res = CliRunner().invoke(app, ["probe", "selection", "--checkpoint", str(folder), "--n", "3"])
    assert res.exit_code == 2 and "--n" in res.output, res.output
