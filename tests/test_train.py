"""The training loop: schedule, learning, atomic checkpoints, resume after SIGKILL, two processes."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from storelab.train import TrainConfig, load_trained, lr_at, train
from storelab.train.checkpoint import CHECKPOINT, read_checkpoint

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable

TINY_ATTN = dict(model="attention", model_options=dict(d_model=32, n_layers=2), task="mqar", task_preset="tiny",
                 threads=1)


def test_schedule_warmup_then_cosine():
    cfg = TrainConfig(steps=100, warmup=10, lr=1.0, min_lr_ratio=0.1)
    lrs = [lr_at(cfg, s) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert lrs[-1] == pytest.approx(0.1)
    with pytest.raises(ValueError, match="min_lr_ratio"):
        TrainConfig(min_lr_ratio=2)


def test_tiny_hybrid_learns_mqar():
    # one KDA layer then one attention layer; chance is 1/32
    cfg = TrainConfig(model="pattern:KA", model_options=dict(d_model=64), task="mqar", task_preset="tiny",
                      steps=200, batch_size=32, lr=3e-3, warmup=20, eval_every=200, eval_examples=64, threads=1)
    r = train(cfg)
    assert r.eval["acc"] > 5 * r.task.chance(), r.eval


def _parity_long_accuracy(beta_max: float) -> tuple[float, float]:
    """Accuracy of a one-layer DeltaNet trained on bit strings of 2..16, at positions < 16 and >= 32 of 64."""
    cfg = TrainConfig(model="deltanet", model_options=dict(d_model=32, n_layers=1, n_heads=1, head_dim=16, d_ff=64,
                                                           beta_max=beta_max),
                      task="parity", task_preset="full", task_options=dict(len_min=2, len_max=16, eval_len=64),
                      steps=300, batch_size=32, lr=3e-3, warmup=20, eval_every=300, eval_examples=32, threads=1)
    r = train(cfg)
    b = r.task.sample_eval(64, 99)
    with torch.no_grad():
        logits, _ = r.model(b.inputs)
    ok = (logits.argmax(-1) == b.targets).float().mean(0)
    return ok[:16].mean().item(), ok[32:].mean().item()


def test_parity_needs_a_write_step_above_one():
    # essay section 6: with beta in (0, 2) the transition I - beta k k^T can flip a sign
    short2, long2 = _parity_long_accuracy(2.0)
    short1, long1 = _parity_long_accuracy(1.0)
    assert short2 > 0.95 and long2 > 0.8, (short2, long2)
    assert long1 < 0.65, long1  # chance is 0.5


def test_checkpoint_round_trip_and_refuses_other_config(tmp_path):
    cfg = TrainConfig(**TINY_ATTN, steps=6, eval_every=3, checkpoint_every=3, eval_examples=8)
    r = train(cfg, tmp_path)
    assert not (tmp_path / (CHECKPOINT + ".tmp")).exists()
    model, task, meta = load_trained(tmp_path)
    assert meta["step"] == 6 and meta["train_config"]["steps"] == 6 and task.NAME == "mqar"
    for k, v in r.model.state_dict().items():
        assert torch.equal(model.state_dict()[k], v)
    tensors, _ = read_checkpoint(tmp_path)
    assert any(k.startswith("optim/") and k.endswith("exp_avg_sq") for k in tensors)
    assert json.loads((tmp_path / "config.json").read_text())["model_config"]["d_model"] == 32
    with pytest.raises(ValueError, match="lr"):
        train(TrainConfig(**TINY_ATTN, steps=6, lr=1e-2, eval_examples=8), tmp_path)


def _cli(out: Path, steps: int, *extra: str) -> list[str]:
    return [PY, "-m", "storelab", "train", "--model", "attention", "--model-opt", "d_model=32", "--model-opt",
            "n_layers=2", "--task", "mqar", "--size", "tiny", "--steps", str(steps), "--checkpoint-every", "5",
            "--eval-every", "1000", "--threads", "1", "--out", str(out), "--json", *extra]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def test_resume_after_sigkill_matches_uninterrupted(tmp_path):
    steps = 40
    full = subprocess.run(_cli(tmp_path / "a", steps), capture_output=True, text=True, env=_env(), cwd=ROOT,
                          timeout=300)
    assert full.returncode == 0, full.stderr
    want = json.loads(full.stdout)
    # the same run, killed with SIGKILL as soon as its first checkpoint exists
    out = tmp_path / "b"
    p = subprocess.Popen(_cli(out, steps), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(), cwd=ROOT)
    deadline = time.time() + 240
    while not (out / CHECKPOINT).exists() and time.time() < deadline and p.poll() is None:
        time.sleep(0.02)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    _, meta = read_checkpoint(out)  # a whole file, never half of one
    assert 0 < meta["step"] < steps, "the run was not interrupted"
    again = subprocess.run(_cli(out, steps), capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=300)
    assert again.returncode == 0, again.stderr
    got = json.loads(again.stdout)
    assert got["resumed_from"] == meta["step"] > 0
    assert got["final_loss"] == pytest.approx(want["final_loss"], abs=1e-6)
    a, _ = read_checkpoint(tmp_path / "a")
    b, _ = read_checkpoint(out)
    for k in a:
        if k.startswith("model/"):
            assert torch.allclose(a[k], b[k], atol=1e-6), k


def test_two_processes_equal_one_with_the_same_global_batch(tmp_path):
    steps = 8
    cmd = [PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "storelab", "train",
           "--model", "attention", "--model-opt", "d_model=32", "--model-opt", "n_layers=2", "--task", "mqar",
           "--size", "tiny", "--steps", str(steps), "--batch-size", "16", "--eval-every", "4", "--threads", "1",
           "--out", str(tmp_path), "--json"]
    r = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    dist_rec = json.loads(r.stdout)
    assert dist_rec["processes"] == 2
    single = train(TrainConfig(**TINY_ATTN, steps=steps, batch_size=16, eval_every=4))
    assert dist_rec["final_loss"] == pytest.approx(single.final_loss, abs=1e-5)
    tensors, _ = read_checkpoint(tmp_path)
    for k, v in single.model.state_dict().items():
        assert torch.allclose(tensors[f"model/{k}"], v, atol=1e-5), k


def test_recall_benchmark_table_and_plot(tmp_path):
    from storelab.train.recall import RecallBench, plot_recall, run_recall

    bench = RecallBench(models=("attention", "kda"), widths=(16,), pairs=(2,), seq_len=16, vocab_size=32, steps=4,
                        batch_size=8, eval_examples=8)
    rows = run_recall(bench)
    assert [r["model"] for r in rows] == ["attention", "kda"]
    att, kda = rows
    # attention keeps every token: 4 layers x 16 tokens x 2 heads x (K + V = 16) x 4 bytes; KDA a matrix per head
    assert att["state_bytes"] == 4 * 16 * 2 * 16 * 4
    assert kda["state_bytes"] < att["state_bytes"]
    png = plot_recall(rows, tmp_path / "recall.png")
    assert png.stat().st_size > 1000
    with pytest.raises(ValueError, match="pairs"):
        RecallBench(pairs=(32,), seq_len=64)


def test_dictionary_hybrid_within_a_budget():
    from storelab.train import train_dictionary_hybrid

    t0 = time.time()
    model, m = train_dictionary_hybrid(6, seed=0, task_preset="tiny", threads=1, eval_examples=16)
    assert time.time() - t0 < 60  # the budget plus building, timing and the last evaluation
    assert m["steps"] >= 1 and m["mix"] and 0 <= m["retrieval"] <= 1 and 0 <= m["compliance"] <= 1
    assert m["task_config"]["name"] == "dictionary" and not model.training


def test_indexer_imitation_reaches_only_the_index_branch():
    from storelab.stores.base import training_signals
    from storelab.stores.msa import BlockSparseAttention
    from storelab.train.loop import auxiliary_losses, build, token_loss

    cfg = TrainConfig(model="tiny-minimax-m3", task="mqar", task_preset="tiny", indexer_weight=1.0)
    task, _, model = build(cfg)
    b = task.sample(4, 0)
    store = next(blk.token for blk in model.blocks if isinstance(blk.token, BlockSparseAttention))
    loss, _, _ = token_loss(model, b, b.n_scored)
    loss.backward()
    assert store.index_q.weight.grad is None  # the hard top-k passes no gradient
    model.zero_grad(set_to_none=True)
    with training_signals() as sig:
        token_loss(model, b, b.n_scored)
    kl = auxiliary_losses(sig, cfg)["indexer_kl"]
    assert kl.item() > 0
    kl.backward()
    assert store.index_q.weight.grad.abs().sum() > 0
    assert store.q_proj.weight.grad is None  # the main attention is only the teacher
    assert "indexer_kl" not in auxiliary_losses(sig, TrainConfig(indexer_weight=0.0))