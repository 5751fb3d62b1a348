"""The forgetting probe's weights-only part (storelab.probes.gate_weights, ``probe --weights-only``):
only headers and gate tensors are read (bytes counted, with the checkpoint padded by large experts),
and the figures equal the in-memory probe's on the loaded model, bit for bit."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file
from typer.testing import CliRunner

from storelab.checkpoint import CheckpointError, load
from storelab.cli import app
from storelab.outputs import MANIFEST
from storelab.probes.forgetting import channel_mixing, forgetting, rest_log_decay
from storelab.probes.gate_weights import gate_spectra, gate_tensors
from storelab.tasks import make_task
from tests.test_checkpoint import tiny_hf
from tests.test_probes import unchecked  # noqa: F401  (a fixture: these untrained models' summaries, unchecked)

# large experts: the gates are a few hundred bytes of several MB
BIG_EXPERTS = {"kimi_linear": dict(moe_intermediate_size=1024, num_experts=8),
               "qwen3_next": dict(moe_intermediate_size=1024, num_experts=8)}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    made: dict = {}

    def get(model_type: str, dtype=torch.float32):
        key = (model_type, dtype)
        if key not in made:
            made[key] = tmp_path_factory.mktemp(model_type)
            tiny_hf(model_type, **BIG_EXPERTS.get(model_type, {})).to(dtype).save_pretrained(made[key])
        return made[key]

    return get


@pytest.mark.parametrize("model_type,dtype", [("kimi_linear", torch.float32), ("qwen3_next", torch.float32),
                                              ("qwen3_5_text", torch.bfloat16)])
def test_reads_only_headers_and_gates_and_matches_the_loaded_model(model_type, dtype, folder, unchecked):
    d = folder(model_type, dtype)
    gates, io = gate_tensors(d)
    assert io["bytes_read"] <= io["header_bytes"] + io["gate_bytes"]
    assert io["gate_bytes"] * 1000 < io["checkpoint_bytes"]
    assert all(n.endswith(("A_log", "dt_bias")) for n in io["tensors"])
    model = load(d)
    assert sorted(gates) == [i for i, lay in enumerate(model.cfg.layers) if lay.token.RECURRENT]
    for i, g in gates.items():
        assert torch.equal(g, rest_log_decay(model.blocks[i].token)), f"layer {i}"
    r = gate_spectra(d)
    want = forgetting(model, make_task("dictionary", "tiny"), n=2)
    assert r["kda_mixing_fraction"] == want["kda_mixing_fraction"]
    assert r["kda_heads"] == want["kda_heads"]
    per_head = [h for lay in r["layers"] for h in lay["heads"]]
    assert len(per_head) == sum(g.shape[0] for g in gates.values())
    for lay in r["layers"]:
        g = gates[lay["layer"]]
        if g.dim() == 2:
            assert [h["mixes"] for h in lay["heads"]] == channel_mixing(g)["mixes"].tolist()


def test_pure_attention_checkpoint_is_refused(folder):
    d = folder("mimo_v2_flash")
    with pytest.raises(CheckpointError, match="no recurrent layer"):
        gate_tensors(d)
    res = CliRunner().invoke(app, ["probe", "forgetting", "--checkpoint", str(d), "--weights-only"])
    assert res.exit_code == 2 and "no recurrent layer" in res.output


def test_missing_gate_tensor_is_named(folder, tmp_path):
    src = folder("qwen3_next")
    for p in src.iterdir():
        (tmp_path / p.name).write_bytes(p.read_bytes())
    f = tmp_path / "model.safetensors"
    sd = load_file(f)
    del sd["model.layers.0.linear_attn.A_log"]
    save_file(sd, f)
    with pytest.raises(CheckpointError, match=r"missing tensor 'model\.layers\.0\.linear_attn\.A_log'.*blocks\.0"):
        gate_tensors(tmp_path)


def test_weights_only_command(folder, tmp_path):
    d = folder("kimi_linear")
    res = CliRunner().invoke(app, ["probe", "forgetting", "--checkpoint", str(d), "--weights-only", "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.stdout)
    assert r["weights_only"] and r["layers"][0]["decay"] == "per channel"
    assert len(r["layers"][0]["heads"][0]["channel_half_lives"]) == 16
    res = CliRunner().invoke(app, ["probe", "forgetting", "--checkpoint", str(d), "--weights-only",
                                   "--out", str(tmp_path / "gates")])
    assert res.exit_code == 0, res.output
    assert sorted(p.name for p in (tmp_path / "gates").iterdir()) == [MANIFEST, "forgetting_weights.png", "probe.json"]
    assert "half-life at x = 0 per head" in res.output
    bad = CliRunner().invoke(app, ["probe", "mhc", "--checkpoint", str(d), "--weights-only"])
    assert bad.exit_code == 2 and "only the forgetting probe" in bad.output


def test_planted_gates_give_a_known_share_of_mixing_heads(folder, tmp_path, unchecked):
    """Kimi Linear's KDA gate at x = 0 is g_k = -exp(A_log) softplus(dt_bias_k). With A_log = 0, a
    channel with dt_bias = 5 keeps exp(-5) a token (a thousandth within 64 tokens), one with -10 keeps
    all but 5e-5. Heads 0 and 2 of every KDA layer get one fast channel among slow ones (they mix),
    head 1 only fast channels and head 3 only slow ones (neither mixes): half of the heads mix."""
    import shutil

    src = folder("kimi_linear")
    d = tmp_path / "planted"
    shutil.copytree(src, d)
    path = d / "model.safetensors"
    tensors = load_file(path)
    planted = 0
    for name, t in tensors.items():
        if name.endswith("A_log"):
            tensors[name] = torch.zeros_like(t)
        elif name.endswith("dt_bias"):
            H = 4
            bias = torch.full((H, t.numel() // H), -10.0)
            bias[0, 0] = bias[2, 3] = 5.0
            bias[1] = 5.0
            tensors[name] = bias.reshape(t.shape).to(t.dtype)
            planted += 1
    assert planted
    save_file(tensors, str(path), metadata={"format": "pt"})
    r = gate_spectra(d)
    assert r["kda_mixing_fraction"] == 0.5
    for lay in r["layers"]:
        if lay["decay"] == "per channel":
            assert [h["mixes"] for h in lay["heads"]] == [True, False, True, False]
    assert forgetting(load(d), make_task("dictionary", "tiny"), n=2)["kda_mixing_fraction"] == 0.5
