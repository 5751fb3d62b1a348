"""Options and inputs the CLI used to take into nonsense, hang on or name wrongly (issue 38, items 4, 6, 8
and 9): each exits 2 with one line naming the option, file or field, and no traceback."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from storelab.cli import app

FIXTURES = Path(__file__).parent / "fixtures" / "configs"
runner = CliRunner()


def _run(args: list[str]):
    return runner.invoke(app, [str(a) for a in args])


def _refused(r, *said: str) -> None:
    out = r.output
    assert r.exit_code == 2, out
    assert "Traceback" not in out, out
    for s in said:
        assert s in out, out


@pytest.fixture
def qwen3(tmp_path) -> Path:
    folder = tmp_path / "qwen3"
    folder.mkdir()
    shutil.copy(FIXTURES / "Qwen3-8B.json", folder / "config.json")
    return folder


# -- item 4: options without bounds -----------------------------------------------------------------
@pytest.mark.parametrize("engine, option, said", [
    ("llama.cpp", "n_ubatch=1" + "0" * 30, "n_ubatch: must be a whole number from 1 to 2,147,483,647"),
    ("llama.cpp", "n_ubatch=1e30", "n_ubatch"),
    ("vllm", "block_size=12", "block_size: must be one of 1, 8, 16"),
    ("vllm", "max_num_batched_tokens=0", "max_num_batched_tokens"),
])
def test_engine_option_bounded_by_what_the_engine_takes(qwen3, engine, option, said):
    _refused(_run(["memory", "--checkpoint", qwen3, "--engine", engine, "--engine-option", option]), said)


def test_a_budget_past_the_model_context_is_said_in_words(qwen3):
    r = _run(["memory", "--checkpoint", qwen3, "--budget", "1" + "0" * 24 + "TiB"])
    assert r.exit_code == 0, r.output
    assert "every context up to its 40,960" in r.output
    assert "beyond its" not in r.output and ",444,444," not in r.output


# -- item 8: engine figures for formats the engine does not have -------------------------------------------------
@pytest.mark.parametrize("engine, cache", [("llama.cpp", "fp4"), ("llama.cpp", "fp8"), ("vllm", "q4_0"),
                                           ("transformers", "fp8")])
def test_a_cache_format_the_engine_has_not_is_refused(qwen3, engine, cache):
    _refused(_run(["memory", "--checkpoint", qwen3, "--engine", engine, "--cache-dtype", cache]),
             f"--cache-dtype {cache}: {engine} keeps no {cache} cache")


def test_a_cache_format_the_engine_has_is_taken(qwen3):
    r = _run(["memory", "--checkpoint", qwen3, "--engine", "llama.cpp", "--cache-dtype", "q8_0"])
    assert r.exit_code == 0, r.output


# -- item 9: errors that name the wrong thing -------------------------------------------------------------
def test_model_dtype_named_as_itself(qwen3):
    r = _run(["memory", "--checkpoint", qwen3, "--engine", "vllm", "--engine-option", "model_dtype=int8"])
    _refused(r, "engine option model_dtype: unknown 'int8'")
    assert "state dtype" not in r.output
