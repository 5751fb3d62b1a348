"""Sizes held against the machine before the work (issue 38, item 3): a config whose layer count, vocabulary,
expert count or sizes cannot be represented, or would take gigabytes just to describe, is refused naming the
field, before anything is built (``storelab.checkpoint.families._reader.check_sizes``)."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import pytest
from typer.testing import CliRunner

from storelab.checkpoint import CheckpointError, read_model_config
from storelab.cli import app

FIXTURES = Path(__file__).parent / "fixtures" / "configs"


@pytest.mark.parametrize("base, where, field, value", [
    ("Qwen3-8B", (), "num_hidden_layers", 1_000_000_000),
    ("Qwen3-8B", (), "vocab_size", 10**12),
    ("Qwen3-8B", (), "hidden_size", 10**30),
    ("Qwen3-30B-A3B", (), "num_experts", 10**9),
    ("Qwen3.5-0.8B-Base", ("text_config",), "num_hidden_layers", 10**9),
    ("Kimi-Linear-48B-A3B-Instruct", ("linear_attn_config",), "num_heads", 2**70),
])
def test_a_config_beyond_any_machine_is_refused_before_anything_is_built(tmp_path, base, where, field, value):
    hf = json.loads((FIXTURES / f"{base}.json").read_text())
    d = hf
    for k in where:
        d = d[k]
    d[field] = value
    f = tmp_path / "config.json"
    f.write_text(json.dumps(hf))
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError) as e:
            read_model_config(f)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert str(f) in str(e.value) and (field in str(e.value) or "experts" in str(e.value)), str(e.value)
    assert peak < 20 * 2**20, f"{peak / 2**20:.0f} MiB held before the refusal"
    for cmd in ("models", "memory"):
        r = CliRunner().invoke(app, [cmd, "--checkpoint", str(f)], env={"COLUMNS": "400"})
        assert r.exit_code == 2 and r.exception is None or isinstance(r.exception, SystemExit), r.output
        assert r.exit_code == 2 and str(f) in " ".join(r.output.split()), r.output


def test_layers_times_experts_is_bounded_too(tmp_path):
    hf = dict(json.loads((FIXTURES / "Qwen3-30B-A3B.json").read_text()), num_experts=60_000, num_hidden_layers=1_000)
    f = tmp_path / "config.json"
    f.write_text(json.dumps(hf))
    with pytest.raises(CheckpointError, match=r"1,000 layers x 60,000 experts"):
        read_model_config(f)


def test_every_published_config_is_within_the_bounds():
    from storelab.checkpoint.families._reader import check_sizes

    for f in sorted(FIXTURES.glob("*.json")):
        check_sizes(json.loads(f.read_text()), str(f))
