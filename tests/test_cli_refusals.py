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


# -- item 6: files that are not the expected kind ------------------------------------------------------------
def test_config_json_that_is_a_folder(tmp_path):
    (tmp_path / "m" / "config.json").mkdir(parents=True)
    _refused(_run(["memory", "--checkpoint", tmp_path / "m"]), "config.json: a folder, not a file")


def test_json_nested_thousands_deep(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000 + "]" * 100_000)
    _refused(_run(["models", deep]), f"{deep}: JSON nested too deep to read")
    _refused(_run(["memory", "--config", deep]), f"{deep}: JSON nested too deep to read")
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": ' + "[" * 100_000 + "]" * 100_000 + "}")
    _refused(_run(["memory", "--checkpoint", folder]), "config.json: JSON nested too deep to read")


def test_a_fifo_is_refused_before_it_is_opened(tmp_path):
    import os

    for name in ("fifo", "fifo.json"):
        os.mkfifo(tmp_path / name)
    _refused(_run(["memory", "--checkpoint", tmp_path / "fifo"]), "fifo: a FIFO, not a regular file")
    _refused(_run(["models", tmp_path / "fifo.json"]), "fifo.json: a FIFO, not a regular file")
    _refused(_run(["probe", "forgetting", "--checkpoint", tmp_path / "fifo"]), "fifo: a FIFO, not a regular file")


def test_a_chat_template_that_loops_is_named():
    from storelab.text import Tokenizer, TokenizerError

    for template in ("{% for i in range(10**9) %}x{% endfor %}",
                     "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}"):
        tok = Tokenizer(backend=None, path=Path("/m/tokenizer.json"), chat_template=template, specials={},
                        add_bos=False, template_from="/m/tokenizer_config.json: chat_template")
        with pytest.raises(TokenizerError, match="chat template of /m"):
            tok.render([{"role": "user", "content": "hi"}])


# -- item 9 (rest): errors that name nothing --------------------------------------------------------------
def test_a_text_file_as_checkpoint_is_called_a_file(tmp_path):
    f = tmp_path / "notes.txt"
    f.write_text("hello")
    _refused(_run(["probe", "forgetting", "--checkpoint", f]), f"{f} is a file, not a model folder")


def test_a_folder_named_tokenizer_json(tmp_path):
    from storelab.text import Tokenizer, TokenizerError

    (tmp_path / "tokenizer.json").mkdir()
    with pytest.raises(TokenizerError, match="tokenizer.json: a folder, not a file"):
        Tokenizer.from_folder(tmp_path)
