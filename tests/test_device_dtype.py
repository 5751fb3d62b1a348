"""``--device`` and ``--dtype`` on every command that builds and runs a model (``storelab.options``).

Each command runs with ``--device cpu --dtype bf16`` on a tiny model (a transformers folder with a
tokenizer, a zoo model, a train run) and reports where its model ran and in what (``"device"``,
``"dtype"`` read from the built model's parameters); ``--device cuda`` on this machine (no CUDA)
and a dtype that is not fp32/bf16/fp16 are refused by the parser with exit code 2, naming the
option. The CUDA path itself is ``python -m storelab.bench.gpu --sections commands`` on a lent GPU;
here that section runs on the CPU.
"""

from __future__ import annotations

import json

import pytest
import torch
import typer
from typer.testing import CliRunner

from storelab import options as opt
from storelab.cli import app
from tests.helpers import write_tokenizer
from tests.test_checkpoint import tiny_hf
from tests.test_probe_text import VOCAB, corpus

runner = CliRunner()
CUDA = torch.cuda.is_available()


def cli(*args: str):
    return runner.invoke(app, list(args), env={"COLUMNS": "400"})  # error lines unwrapped


def doc(*args: str) -> dict:
    res = cli(*args, "--json")
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """A tiny Qwen3.5 text folder (fp32 safetensors, config says float32) with a tokenizer that keeps the
    shipped prompts' words whole (so the swap pairs tokenize to equal lengths)."""
    d = tmp_path_factory.mktemp("qwen3_5_text")
    hf = tiny_hf("qwen3_5_text", vocab_size=VOCAB)
    hf.save_pretrained(d)
    write_tokenizer(d, corpus(), vocab=VOCAB)
    return d


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A train run folder: two steps of a two-layer attention model on MQAR."""
    from storelab.train import TrainConfig, train

    d = tmp_path_factory.mktemp("run")
    train(TrainConfig(model="attention", model_options=dict(d_model=32, n_layers=2), task="mqar",
                      task_preset="tiny", threads=1, steps=2, eval_every=2, checkpoint_every=2, eval_examples=4),
          d, progress=False)
    return d


def test_generate_zoo_model_in_bf16():
    r = doc("generate", "qwen3.8", "--tiny", "--prompt-len", "6", "--new-tokens", "2", "--device", "cpu",
            "--dtype", "bf16")
    assert (r["device"], r["dtype"]) == ("cpu", "bf16")
    for s in r["state"]:   # the cache is held in the model's dtype, as the analytic count in bf16 says
        assert s["measured_bytes"] == s["analytic_bytes"] > 0, s
    fp32 = doc("generate", "qwen3.8", "--tiny", "--prompt-len", "6", "--new-tokens", "2")
    assert fp32["dtype"] == "fp32" and fp32["state"][0]["measured_bytes"] == 2 * r["state"][0]["measured_bytes"]


def test_generate_checkpoint_in_bf16(folder):
    r = doc("generate", "--checkpoint", str(folder), "--prompt-len", "5", "--new-tokens", "2", "--dtype", "bf16",
            "--device", "cpu")
    assert (r["device"], r["dtype"]) == ("cpu", "bf16")
    text = doc("generate", "--checkpoint", str(folder), "--prompt", "the cat", "--new-tokens", "2", "--dtype",
               "bf16", "--device", "auto")
    assert (text["device"], text["dtype"]) == ("cuda:0" if CUDA else "cpu", "bf16")
    own = doc("generate", "--checkpoint", str(folder), "--prompt", "the cat", "--new-tokens", "2")
    assert own["dtype"] == "fp32"   # the checkpoint's own (its config.json says float32)


@pytest.mark.parametrize("stream", [False, True])
def test_probe_on_a_model_folder_in_bf16(folder, stream):
    r = doc("probe", "state_swap", "--checkpoint", str(folder), "--n", "2", "--device", "cpu", "--dtype", "bf16",
            *(["--stream"] if stream else []))
    assert (r["device"], r["dtype"]) == ("cpu", "bf16") and "state_swap" in r["results"]


def test_probe_on_a_run_and_an_untrained_model_in_bf16(run):
    r = doc("probe", "state_swap", "--checkpoint", str(run), "--n", "4", "--device", "cpu", "--dtype", "bf16")
    assert (r["device"], r["dtype"]) == ("cpu", "bf16") and "state_swap" in r["results"]
    assert doc("probe", "state_swap", "--checkpoint", str(run), "--n", "4")["dtype"] == "fp32"
    r = doc("probe", "selection", "--model", "tiny-glm-5.3", "--n", "2", "--contexts", "64", "--device", "cpu",
            "--dtype", "bf16")
    assert (r["device"], r["dtype"]) == ("cpu", "bf16") and r["results"]["selection"]["layers"]


def test_load_trained_places_the_model(run):
    from storelab.train.loop import load_trained

    model, _, _ = load_trained(run, dtype="fp16")
    assert {p.dtype for p in model.parameters()} == {torch.float16}


def test_report_checkpoint_section_in_bf16(folder, tmp_path):
    """The report's checkpoint section (the one that builds the model) on the folder, in bf16."""
    from storelab.report.build import build_report, checkpoint_section_of

    _, outcomes = build_report(tmp_path / "rep", quick=True, sections=[checkpoint_section_of(folder)],
                               checkpoint=folder, device="cpu", dtype="bf16")
    (oc,) = outcomes
    assert oc.ok, oc.error
    assert (oc.result.data["device"], oc.result.data["dtype"]) == ("cpu", "bf16")
    assert "bf16 on cpu" in oc.result.text


COMMANDS = {   # every command that builds a model, with what it needs besides --device / --dtype
    "generate": lambda f, r: ["generate", "qwen3.8", "--tiny"],
    "generate --checkpoint": lambda f, r: ["generate", "--checkpoint", str(f), "--prompt", "the"],
    "probe": lambda f, r: ["probe", "state_swap", "--checkpoint", str(f)],
    "probe --stream": lambda f, r: ["probe", "state_swap", "--checkpoint", str(f), "--stream"],
    "probe run": lambda f, r: ["probe", "state_swap", "--checkpoint", str(r)],
    "report": lambda f, r: ["report", "--checkpoint", str(f)],
    "save": lambda f, r: ["save", "qwen3.8", str(f.parent / "never"), "--tiny"],
    "export": lambda f, r: ["export", str(r), str(f.parent / "never")],
}


@pytest.mark.skipif(CUDA, reason="this machine has CUDA")
@pytest.mark.parametrize("command", list(COMMANDS))
def test_cuda_without_cuda_and_bad_dtypes_exit_2(command, folder, run):
    base = COMMANDS[command](folder, run)
    if command not in ("save", "export"):   # they write a model, they do not run one: no --device
        for device in ("cuda", "cuda:1"):
            res = cli(*base, "--device", device)
            assert res.exit_code == 2 and "'--device'" in res.output and "CUDA is not available" in res.output, \
                res.output
        res = cli(*base, "--device", "gpu")
        assert res.exit_code == 2 and "'--device'" in res.output and "cpu, cuda, cuda:N or auto" in res.output
    for bad in ("fp8", "float64", "BF16"):
        res = cli(*base, "--dtype", bad)
        assert res.exit_code == 2 and "'--dtype'" in res.output and "fp32, bf16, fp16" in res.output, res.output
    assert not (folder.parent / "never").exists()


def test_weights_only_refuses_device_and_dtype(folder):
    res = cli("probe", "forgetting", "--checkpoint", str(folder), "--weights-only", "--dtype", "bf16")
    assert res.exit_code == 2 and "--dtype: --weights-only builds no model" in res.output, res.output


def test_report_refuses_device_and_dtype_without_a_checkpoint(tmp_path):
    for args in (["--dtype", "bf16"], ["--device", "auto"] if CUDA else ["--dtype", "fp16"]):
        res = cli("report", "--out", str(tmp_path / "r"), *args)
        assert res.exit_code == 2 and "places the model of --checkpoint" in res.output, res.output
    assert not (tmp_path / "r").exists()


def test_resolve_device(monkeypatch):
    """auto, cuda:N and their refusals, as a machine with one GPU and one without see them."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert opt.resolve_device("auto") == "cpu" and opt.resolve_device("CPU") == "cpu"
    with pytest.raises(typer.BadParameter, match="CUDA is not available"):
        opt.resolve_device("cuda:0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert opt.resolve_device("auto") == "cuda" and opt.resolve_device("cuda:0") == "cuda:0"
    with pytest.raises(typer.BadParameter, match="1 CUDA device"):
        opt.resolve_device("cuda:1")
    for bad in ("cuda:", "cuda:-1", "mps", ""):
        with pytest.raises(typer.BadParameter, match="expected cpu, cuda, cuda:N or auto"):
            opt.resolve_device(bad)


def test_gpu_check_runs_the_commands_on_the_cpu(tmp_path):
    """The prepared device check's commands section (generate and a probe with --device), as a CPU runs it."""
    from storelab.bench.gpu import main

    out = tmp_path / "g.json"
    main(["--device", "cpu", "--quick", "--sections", "commands", "--out", str(out)])
    rows = json.loads(out.read_text())["commands"]
    assert [r["command"].split()[0] for r in rows] == ["generate", "probe", "probe"]
    for r in rows:
        assert r["exit_code"] == 0 and (r["device"], r["dtype"]) == ("cpu", "bf16"), r
