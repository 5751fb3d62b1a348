"""Training on torch's engines: one process == DDP == FSDP2, resume across world sizes, two nodes, bf16, export.

Every launch is ``python -m torch.distributed.run`` on the CPU (gloo), one thread per process. The
reference is one process, in this test process, with the same global batch.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from storelab.train import TrainConfig, load_trained, train
from storelab.train.checkpoint import CHECKPOINT, read_checkpoint, read_meta

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
STEPS = 40
CFG = dict(model="attention", model_options=dict(d_model=32, n_layers=2), task="mqar", task_preset="tiny",
           threads=1, batch_size=16, eval_every=1000, eval_examples=16, checkpoint_every=5)
LOSS_TOL = 1e-6    # fp32: the summation order of the reduced gradients is all that differs
WEIGHT_TOL = 1e-5


def _args(out: Path, steps: int = STEPS, *extra: str) -> list[str]:
    return ["-m", "storelab", "train", "--model", "attention", "--model-opt", "d_model=32", "--model-opt", "n_layers=2",
            "--task", "mqar", "--size", "tiny", "--steps", str(steps), "--batch-size", "16", "--eval-every", "1000",
            "--checkpoint-every", "5", "--threads", "1", "--out", str(out), "--json", *extra]


def _torchrun(*args: str, launch: tuple[str, ...] = ("--standalone", "--nproc-per-node", "2")) -> list[str]:
    return [PY, "-m", "torch.distributed.run", *launch, *args]


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}


def _run(cmd: list[str]) -> dict:
    r = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def _losses(history: list[dict]) -> list[float]:
    return [h["loss"] for h in history if "loss" in h]


def _same_run(run_dir: Path, ref, loss_tol: float = LOSS_TOL) -> None:
    """The run folder's logged losses and final weights are the reference's."""
    meta = read_meta(run_dir)
    got, want = _losses(meta["history"]), _losses(ref.history)
    assert len(got) == len(want) and max(abs(a - b) for a, b in zip(got, want)) < loss_tol, (got, want)
    norms = [(h["grad_norm"], r["grad_norm"]) for h, r in zip(meta["history"], ref.history) if "grad_norm" in h]
    assert norms and all(a == pytest.approx(b, rel=1e-5) for a, b in norms), norms  # clipping saw the global norm
    tensors, _ = read_checkpoint(run_dir)
    for k, v in ref.model.state_dict().items():
        assert torch.allclose(tensors[f"model/{k}"], v, atol=WEIGHT_TOL), k


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("one")
    return train(TrainConfig(**CFG, steps=STEPS), out), out


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
    return _run(_torchrun(*_args(out, STEPS, "--parallel", "fsdp"))), out


def test_one_process_equals_ddp_equals_fsdp(reference, fsdp_run, tmp_path):
    ref, _ = reference
    rec, out = fsdp_run
    assert rec["processes"] == 2 and rec["parallel"] == "fsdp"
    _same_run(out, ref)
    meta = read_meta(out)
    assert meta["world"] == 2 and len(list((out / meta["folder"]).glob("*.distcp"))) == 2  # one shard per process
    # DDP, each process's slice in two micro-batches (no_sync on the first)
    rec = _run(_torchrun(*_args(tmp_path, STEPS, "--parallel", "ddp", "--accumulate", "2")))
    assert rec["parallel"] == "ddp"
    _same_run(tmp_path, ref)


def _descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (from /proc), children first."""
    parent = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, todo = [], [pid]
    while todo:
        here = todo.pop()
        kids = [c for c, pp in parent.items() if pp == here]
        out += kids
        todo += kids
    return out


def test_fsdp_run_killed_resumes_in_one_process(reference, tmp_path):
    ref, _ = reference
    p = subprocess.Popen(_torchrun(*_args(tmp_path, STEPS, "--parallel", "fsdp")), stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env=_env(), cwd=ROOT)
    deadline = time.time() + 240
    while not (tmp_path / CHECKPOINT).exists() and time.time() < deadline and p.poll() is None:
        time.sleep(0.01)
    for pid in [*_descendants(p.pid), p.pid]:  # the workers (torchrun starts each in its own session), the launcher
        os.kill(pid, signal.SIGKILL)
    p.wait()
    step = read_meta(tmp_path)["step"]
    assert 0 < step < STEPS, "the run was not interrupted"
    r = train(TrainConfig(**CFG, steps=STEPS), tmp_path)  # 2 -> 1
    assert r.resumed_from == step and r.final_loss == pytest.approx(ref.final_loss, abs=LOSS_TOL)
    _same_run(tmp_path, ref)


def test_one_process_run_resumes_on_two(reference, tmp_path):
    ref, _ = reference

    def stop(done, row):
        if done == 21:
            raise KeyboardInterrupt  # after the checkpoint of step 20

    with pytest.raises(KeyboardInterrupt):
        train(TrainConfig(**CFG, steps=STEPS), tmp_path, on_step=stop)
    assert read_meta(tmp_path)["step"] == 20
    rec = _run(_torchrun(*_args(tmp_path, STEPS, "--parallel", "fsdp", "--async-checkpoint")))  # 1 -> 2, onto shards
    assert rec["resumed_from"] == 20
    _same_run(tmp_path, ref)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _kill_tree(p: subprocess.Popen) -> None:
    for pid in [*_descendants(p.pid), p.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    p.wait()


def _nodes(out: Path, logs: Path, steps: int, *extra: str, nodes: int = 2,
           timeout: float = 240) -> list[tuple[int, str, str]]:
    """(exit code, stdout, stderr) of one torchrun per node on this machine, static rendezvous (node 0 hosts the
    store, each node's rank fixed). Output goes to files, not pipes (a full pipe would stall a node and its peers
    with it); past the deadline every launcher and worker is killed and both logs are shown."""
    port, procs, files = _free_port(), [], []
    for rank in range(nodes):
        o, e = open(logs / f"node{rank}.out", "w+"), open(logs / f"node{rank}.err", "w+")
        files.append((o, e))
        launch = ("--nnodes", str(nodes), "--node-rank", str(rank), "--nproc-per-node", "1",
                  "--master-addr", "127.0.0.1", "--master-port", str(port))
        procs.append(subprocess.Popen(_torchrun(*_args(out, steps, *extra), launch=launch), stdout=o, stderr=e,
                                      env=_env(), cwd=ROOT))
    deadline = time.time() + timeout
    while any(p.poll() is None for p in procs) and time.time() < deadline:
        time.sleep(0.05)
    late = [rank for rank, p in enumerate(procs) if p.poll() is None]
    for p in procs:
        if p.poll() is None:
            _kill_tree(p)
    res = []
    for p, (o, e) in zip(procs, files):
        o.seek(0), e.seek(0)
        res.append((p.returncode, o.read(), e.read()))
        o.close(), e.close()
    assert not late, f"nodes {late} still running after {timeout} s:\n" + \
        "\n".join(f"--- node {r} (exit {c}) stderr:\n{err[-3000:]}" for r, (c, _, err) in enumerate(res))
    return res


def test_two_nodes_train_and_checkpoint_in_bf16(tmp_path):
    steps = 6
    out, logs = tmp_path / "run", tmp_path / "logs"
    logs.mkdir()
    res = _nodes(out, logs, steps, "--parallel", "fsdp", "--precision", "bf16")
    for rank, (code, _, err) in enumerate(res):
        assert code == 0, f"node {rank}: {err[-3000:]}"
    rec = json.loads(res[0][1])  # node 0 holds rank 0, the one that prints
    meta = read_meta(out)
    assert rec["processes"] == 2 and meta["step"] == steps and meta["world"] == 2
    # bf16 compute (FSDP2's policy over two nodes; autocast in one process) against fp32 in one process
    one_bf16 = train(TrainConfig(**CFG, steps=steps, precision="bf16"))
    fp32 = train(TrainConfig(**CFG, steps=steps))
    got = _losses(meta["history"])[-1]
    assert torch.isfinite(torch.tensor(got)) and abs(got - fp32.final_loss) < 2e-2, (got, fp32.final_loss)
    assert abs(one_bf16.final_loss - fp32.final_loss) < 2e-2, (one_bf16.final_loss, fp32.final_loss)
    model, _, _ = load_trained(out)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the master weights


def test_accumulation_equals_one_step():
    rows = {}
    for n in (1, 2, 4):
        rows[n] = []
        train(TrainConfig(**CFG, steps=10, accumulate=n), on_step=lambda d, r, n=n: rows[n].append(r["loss"]))
    for n in (2, 4):
        assert max(abs(a - b) for a, b in zip(rows[1], rows[n])) < LOSS_TOL, (rows[1], rows[n])
    with pytest.raises(ValueError, match="batch_size"):
        train(TrainConfig(**{**CFG, "batch_size": 6}, steps=1, accumulate=4))


def test_accumulation_equals_one_step_for_the_routing_bias():
    # DeepSeek's bias update takes the step's whole load (summed over the micro-batches), once per step;
    # its balancing loss is per sequence, so an accumulated MoE step is the one-batch step
    c = dict(model="tiny-deepseek-v4.1-flash", task="mqar", task_preset="tiny", batch_size=4, eval_every=1000,
             eval_examples=4, threads=1, steps=4)
    runs = {n: train(TrainConfig(**c, accumulate=n)) for n in (1, 2)}
    biases = {n: [b for k, b in r.model.state_dict().items() if k.endswith("choice_bias")] for n, r in runs.items()}
    assert biases[1] and any(b.abs().max() > 0 for b in biases[1])  # the bias moved
    assert all(torch.equal(a, b) for a, b in zip(biases[1], biases[2]))
    assert runs[2].final_loss == pytest.approx(runs[1].final_loss, abs=LOSS_TOL)


def test_a_finished_run_extends_with_the_new_schedule(tmp_path):
    cfg = TrainConfig(**CFG, steps=10)
    train(cfg, tmp_path)
    lrs = {}
    longer = TrainConfig(**CFG, steps=15)
    r = train(longer, tmp_path, on_step=lambda d, row: lrs.setdefault(d, row["lr"]))
    assert r.resumed_from == 10 and r.step == 15 and sorted(lrs) == list(range(11, 16))
    from storelab.train import lr_at

    assert lrs[11] == pytest.approx(lr_at(longer, 10))  # the cosine of the new total, from the resume step on
    meta = read_meta(tmp_path)
    assert meta["step"] == 15 and meta["schedule"] == [{"from": 0, "steps": 10}, {"from": 10, "steps": 15}]
    with pytest.raises(ValueError, match="steps"):
        train(TrainConfig(**CFG, steps=12), tmp_path)


def test_export_gives_the_runs_logits(fsdp_run, tmp_path):
    import storelab
    from storelab.commands.export import export_run
    from storelab.outputs import folder_kind

    _, run = fsdp_run  # written as shards by two processes
    res = export_run(run, tmp_path / "model")
    assert folder_kind(tmp_path / "model") == "save" and res["step"] == STEPS
    model, task, _ = load_trained(run)
    loaded = storelab.load(tmp_path / "model")
    x = task.sample(2, 7).inputs
    with torch.no_grad():
        assert torch.equal(model(x)[0], loaded(x)[0])
    with pytest.raises(ValueError, match="OUT"):
        export_run(run, run)  # a run folder is not a model folder
    with pytest.raises(ValueError, match="RUN"):
        export_run(tmp_path / "model", tmp_path / "again")


def test_an_older_single_file_run_still_loads_and_refuses_to_resume(tmp_path):
    from safetensors.torch import save_file

    from storelab.outputs import folder_kind
    from storelab.train.loop import build
    from storelab.tasks import task_dict

    cfg = TrainConfig(**CFG, steps=4)
    task, mcfg, model = build(cfg)
    meta = {"format": "storelab-checkpoint-1", "step": "4", "optim_groups": "[]",
            **{k: json.dumps(v) for k, v in {"train_config": cfg.to_dict(), "model_config": mcfg.to_dict(),
                                              "task": task_dict(task)}.items()}}
    save_file({f"model/{k}": v.clone() for k, v in model.state_dict().items()}, str(tmp_path / "checkpoint.safetensors"),
              metadata=meta)
    assert folder_kind(tmp_path) == "run"
    loaded, _, got = load_trained(tmp_path)
    assert got["step"] == 4 and all(torch.equal(loaded.state_dict()[k], v) for k, v in model.state_dict().items())
    with pytest.raises(ValueError, match="storelab older than the manifest"):  # no manifest: not proven its own
        train(cfg, tmp_path)
    with pytest.raises(ValueError, match="earlier storelab"):  # --force passes the folder check, not the resume
        train(cfg, tmp_path, force=True)


def test_a_cache_readers_unused_parameters_resume(tmp_path):
    # the reader layers' cache-writing parameters never get a gradient, so AdamW keeps no state for them:
    # the resumed run asks the checkpoint only for the states it has, and ends where the whole run ends
    c = dict(model="tiny-deepseek-v4.1-flash", task="mqar", batch_size=4, eval_every=1000, eval_examples=4,
             threads=1, steps=3, checkpoint_every=2)
    whole = train(TrainConfig(**c))

    def stop(done, row):
        if done == 3:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(TrainConfig(**c), tmp_path, on_step=stop)
    r = train(TrainConfig(**c), tmp_path)
    assert r.resumed_from == 2 and r.final_loss == pytest.approx(whole.final_loss, abs=LOSS_TOL)
    assert len(r.optimizer.state) == len(whole.optimizer.state) < len(list(whole.model.parameters()))


def test_cli_refuses_engines_it_cannot_run(tmp_path):
    from typer.testing import CliRunner

    from storelab.cli import app

    base = ["train", "--model", "attention", "--steps", "1", "--out", str(tmp_path / "r")]
    for extra, word in ((["--parallel", "fsdp"], "torchrun"), (["--parallel", "zero3"], "parallel"),
                        (["--precision", "fp16"], "precision"), (["--accumulate", "0"], "--accumulate")):
        res = CliRunner().invoke(app, base + extra)
        assert res.exit_code == 2 and word in res.output, (extra, res.output)
    assert not (tmp_path / "r").exists()
    from storelab.train.distributed import Dist, engine

    with pytest.raises(ValueError, match="parallel: none is one process"):
        engine("none", Dist(rank=0, world=2))  # two processes without an engine would not sync


def test_an_asynchronous_checkpoint_is_the_state_of_its_step(tmp_path):
    # the state is staged at step 5 while steps 6.. go on changing the weights; a kill at step 8 resumes from 5
    whole = train(TrainConfig(**CFG, steps=10))

    def stop(done, row):
        if done == 6:
            time.sleep(0.5)  # the background write finishes; the next step's poll points checkpoint.json at it
        if done == 8:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        train(TrainConfig(**CFG, steps=10), tmp_path, on_step=stop, async_checkpoint=True)
    assert read_meta(tmp_path)["step"] == 5 and not list(tmp_path.glob("*.tmp"))
    r = train(TrainConfig(**CFG, steps=10), tmp_path, async_checkpoint=True)
    assert r.resumed_from == 5 and r.final_loss == pytest.approx(whole.final_loss, abs=LOSS_TOL)
    assert read_meta(tmp_path)["step"] == 10


def test_a_run_killed_in_its_first_checkpoint_starts_again_without_force(tmp_path):
    from storelab.outputs import folder_kind

    (tmp_path / "step-00000005.tmp").mkdir()  # what a kill inside the first save leaves
    (tmp_path / "step-00000005.tmp" / "__0_0.distcp").write_bytes(b"half")
    assert folder_kind(tmp_path) == "run"
    r = train(TrainConfig(**CFG, steps=2), tmp_path)
    assert r.resumed_from == 0 and read_meta(tmp_path)["step"] == 2 and not list(tmp_path.glob("*.tmp"))


def test_leaving_waits_for_every_process_and_gives_up_with_a_warning():
    import threading

    from torch.distributed import HashStore

    from storelab.train.distributed import Dist, _closed

    store, done = HashStore(), []
    first = threading.Thread(target=lambda: (_closed(store, 2), done.append(1)))
    first.start()
    first.join(0.3)
    assert first.is_alive() and not done  # one of two has closed: it waits
    _closed(store, 2)
    first.join(5)
    assert done == [1]
    with pytest.warns(UserWarning, match="did not all report closed"):
        _closed(HashStore(), 2, timeout_s=0.2)  # the peer never comes
    Dist().exit()  # one process: returns


def test_bench_dist_workers_report_and_end():
    from storelab.bench.dist import bench_dist

    r = bench_dist(quick=True, steps=1)
    assert [row.get("error") for row in r["rows"]] == [None, None], r["rows"]
    assert [(row["parallel"], row["processes"]) for row in r["rows"]] == [("ddp", 2), ("fsdp", 2)]
    ddp, fsdp = (max(p["params"] for p in row["per_process"]) for row in r["rows"])
    assert fsdp < ddp  # FSDP2 holds a shard of every parameter
