"""``storelab.keep_freed_memory``: glibc keeps freed blocks for reuse, so a training step's tensors stop
faulting in fresh pages (``storelab/allocator.py``). Each case runs in a fresh interpreter: the setting is
the process's."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

PROBE = r"""
import json, resource, torch
from storelab.allocator import keep_freed_memory
kept = keep_freed_memory()
faults = []
for _ in range(4):  # eight 4 MiB tensors made, written and freed, as a step's activations are
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    xs = [torch.empty(1 << 20).fill_(1.0) for _ in range(8)]
    del xs
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"kept": kept, "faults": faults}))
"""


def _probe(**env: str) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, check=True,
                         env={**os.environ, **env}, timeout=120)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_freed_blocks_are_reused_without_page_faults():
    kept, plain = _probe(), _probe(STORELAB_KEEP_FREED_MEMORY="0")
    pages = (32 << 20) // os.sysconf("SC_PAGE_SIZE")
    assert kept["kept"] is True and plain["kept"] is False
    # without it glibc unmaps or trims the freed 32 MiB and the second step faults it all in again, page by
    # page (its adaptive thresholds catch up with a pattern this regular only later); with it only the first
    assert plain["faults"][1] >= pages // 2, plain
    assert max(kept["faults"][1:]) <= pages // 4, kept  # (the kernel may still reclaim a few idle pages)


def test_the_training_loop_and_the_bench_keep_freed_memory(monkeypatch):
    from typer.testing import CliRunner

    import storelab.allocator
    from storelab.cli import app
    from storelab.train import loop
    from storelab.train.loop import TrainConfig

    calls = []
    monkeypatch.setattr(loop, "keep_freed_memory", lambda: calls.append("train") or True)
    loop.train(TrainConfig(model="pattern:KA", model_options=dict(d_model=16), task="mqar", task_preset="tiny",
                           steps=1, batch_size=2, eval_every=1, eval_examples=2, threads=1))
    assert calls == ["train"]
    monkeypatch.setattr(storelab.allocator, "keep_freed_memory", lambda: calls.append("bench") or True)
    res = CliRunner().invoke(app, ["bench", "gdn", "--quick", "--json"])
    assert res.exit_code == 0, res.output
    assert calls == ["train", "bench"]


def test_generate_and_probe_keep_freed_memory(monkeypatch):
    """Inference faults its activations in as training does (a SmolLM2 prefill of 1,024 tokens: 180,000-200,000
    minor faults each time, none with the setting): ``generate`` and ``probe`` set it too."""
    from typer.testing import CliRunner

    import storelab.allocator
    from storelab.cli import app

    calls = []
    monkeypatch.setattr(storelab.allocator, "keep_freed_memory", lambda: calls.append("kept") or True)
    res = CliRunner().invoke(app, ["generate", "qwen3.8", "--tiny", "--prompt-len", "2", "--new-tokens", "1", "--json"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(app, ["probe", "no-such-probe", "--model", "qwen3.8"])
    assert res.exit_code == 2
    assert calls == ["kept", "kept"]
