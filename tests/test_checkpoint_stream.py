"""Streamed checkpoints (storelab.checkpoint.stream): each layer's weights read from the shards for the
length of its call. The streamed model gives the loaded model's logits and cache bit for bit (every
family: mHC, IndexShare groups, hash routing, sinks; ours: AttnRes, encoder-decoder), decoding steps
included; the probes run on it unchanged; and a ~1.9 GB checkpoint runs in under a third of its size.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from storelab.checkpoint import load, save
from storelab.checkpoint.stream import stream, streamed_forward
from storelab.cli import app
from storelab.models.model import Model, generate
from storelab.probes import forgetting, state_swap
from storelab.tasks import make_task
from storelab.train.models import resolve_model
from tests.test_checkpoint import tiny_hf

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """model_type -> a tiny random transformers checkpoint folder, each written once."""
    made: dict[str, Path] = {}

    def get(model_type: str) -> Path:
        if model_type not in made:
            made[model_type] = tmp_path_factory.mktemp(model_type)
            tiny_hf(model_type).save_pretrained(made[model_type])
        return made[model_type]

    return get


def _same_run(a, b, ids: torch.Tensor) -> None:
    """Prefill and one decoding step give identical logits and cache sizes on both models."""
    with torch.no_grad():
        la, ca = a(ids)
        lb, cb = b(ids)
        assert torch.equal(la, lb)
        assert [s.nbytes() for s in ca] == [s.nbytes() for s in cb]
        sa, _ = a(ids[:, -1:], ca)
        sb, _ = b(ids[:, -1:], cb)
        assert torch.equal(sa, sb)


@pytest.mark.parametrize("model_type", ["kimi_linear", "qwen3_next", "glm_moe_dsa", "deepseek_v4", "mimo_v2_flash",
                                        "minimax_m3_vl_text"])
def test_streamed_equals_loaded(model_type, folder):
    d = folder(model_type)
    s = stream(d)
    ids = torch.randint(3, 128, (2, 13), generator=torch.Generator().manual_seed(0))
    _same_run(load(d), s, ids)
    assert all(p.device.type == "meta" for p in s.parameters())      # nothing kept between calls
    assert s.streamed.shards.bytes_read > 2 * sum((d / f).stat().st_size for f in s.streamed.shards.files) * 0.9


@pytest.mark.parametrize("name", ["tiny-kimi-k3", "tiny-deepseek-v4.1-flash"])
def test_streamed_zoo_models(name, tmp_path):
    """Ours, saved: AttnRes (Kimi K3), mHC and an encoder-decoder (V4.1-Flash); greedy generation agrees."""
    torch.manual_seed(0)
    save(Model(resolve_model(name, 64)).eval(), tmp_path)
    a, b = load(tmp_path), stream(tmp_path)
    ids = torch.randint(3, 64, (1, 6), generator=torch.Generator().manual_seed(1))
    ga, _ = generate(a, ids, 2)
    gb, _ = generate(b, ids, 2)
    assert torch.equal(ga, gb)


def test_streamed_forward_function(folder):
    d = folder("qwen3_next")
    ids = torch.randint(3, 128, (1, 7), generator=torch.Generator().manual_seed(2))
    model = load(d)
    with torch.no_grad():
        want, cache = model(ids)
        want_step, _ = model(ids[:, :1], cache)
    got, cache2 = streamed_forward(d, ids)
    assert torch.equal(want, got)
    step, _ = streamed_forward(d, ids[:, :1], cache2)
    assert torch.equal(step, want_step)


def test_probes_run_unchanged_on_a_streamed_model(folder):
    d = folder("kimi_linear")
    task = make_task("dictionary", "tiny")
    a, b = load(d), stream(d)
    assert forgetting(a, task, n=3, seed=0) == forgetting(b, task, n=3, seed=0)
    assert state_swap(a, task, n=4, seed=0) == state_swap(b, task, n=4, seed=0)


def test_probe_command_stream(folder):
    d = folder("kimi_linear")
    runs = [CliRunner().invoke(app, ["probe", "forgetting", "--checkpoint", str(d), "--task", "dictionary", "--n", "3",
                                     "--json", *extra])
            for extra in ([], ["--stream"])]
    assert [r.exit_code for r in runs] == [0, 0], runs[1].output
    assert json.loads(runs[0].stdout) == json.loads(runs[1].stdout)
    bad = CliRunner().invoke(app, ["probe", "forgetting", "--model", "tiny-kimi-k3", "--stream"])
    assert bad.exit_code == 2 and "--stream reads a model folder" in bad.output


MEASURE = """
import json, sys, torch
torch.set_num_threads(1)
from storelab.checkpoint import load
from storelab.checkpoint.stream import stream
ids = torch.arange(12).reshape(2, 6) * 331 % 4000 + 3
m = stream(sys.argv[1])
with torch.no_grad():
    logits, cache = m(ids)
    step, _ = m(ids[:, -1:], cache)
# VmHWM, the peak of this program's address space: ru_maxrss would count the pytest process this one
# was forked from (it survives exec), so it read several hundred MiB more inside a long test session
peak = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:"))
read = m.streamed.shards.bytes_read
del m, cache
full = load(sys.argv[1])                       # the in-memory run, after the peak was taken
with torch.no_grad():
    want, cache = full(ids)
    want_step, _ = full(ids[:, -1:], cache)
print(json.dumps({"peak": peak, "read": read, "same": torch.equal(logits, want),
                  "same_step": torch.equal(step, want_step), "finite": bool(logits.isfinite().all())}))
"""


def test_checkpoint_larger_than_a_third_of_the_peak(tmp_path):
    """A ~1.9 GB Qwen3-Next checkpoint (32 layers of 50 MiB experts) streams with a peak RSS under a
    third of its size, and gives the in-memory model's logits exactly, prefill and a decoding step."""
    from tests.big_checkpoint import write

    total = write(tmp_path / "big")
    try:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, "-c", MEASURE, str(tmp_path / "big")], capture_output=True, text=True,
                             env=env, timeout=300, cwd=ROOT)
        assert out.returncode == 0, out.stderr[-3000:]
        r = json.loads(out.stdout.strip().splitlines()[-1])
    finally:
        for p in (tmp_path / "big").iterdir():
            p.unlink()
    assert r["same"] and r["same_step"] and r["finite"]
    assert r["read"] >= 2 * total                                   # every layer read again for the step
    assert r["peak"] < total / 3, f"peak RSS {r['peak'] / 2**20:.0f} MiB, checkpoint {total / 2**20:.0f} MiB"
