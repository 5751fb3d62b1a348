"""``generate --weights auto`` (the default): a checkpoint's linear weights run on the CPU in its own format
(``storelab.checkpoint.loader.own_weight_format``, issue 39 item 2): bf16 where the folder stores bf16 (the packed
weights are exactly its numbers), int8 where a GGUF stores quantized matrices (as llama.cpp runs its quantized
files), fp32 otherwise (fp32 and fp16 files); as loaded for random weights, another device or another --dtype."""

from __future__ import annotations

import json

import gguf
import pytest
import torch
from typer.testing import CliRunner

from storelab.checkpoint.loader import own_weight_format
from storelab.cli import app
from tests.family_harness import tiny_hf
from tests.gguf_writer import write_gguf
from tests.test_gguf import tiny

LLAMA = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=96, vocab_size=128, max_position_embeddings=256)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("auto")
    out = {}
    for name, dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16), ("fp32", torch.float32)):
        m = tiny_hf("llama", LLAMA).to(dtype)
        m.config.torch_dtype = dtype
        m.save_pretrained(d / name)
        out[name] = d / name
    write_gguf(tiny("qwen3"), "qwen3", d / "q8.gguf", qtype=gguf.GGMLQuantizationType.Q8_0)
    write_gguf(tiny("qwen3"), "qwen3", d / "f32.gguf")
    out["q8.gguf"], out["f32.gguf"] = d / "q8.gguf", d / "f32.gguf"
    return out


@pytest.mark.parametrize("name, fmt, said", [("bf16", "bf16", "stored in bf16"), ("fp16", "fp32", "F16"),
                                             ("fp32", "fp32", "F32"), ("q8.gguf", "int8", "quantized (Q8_0)"),
                                             ("f32.gguf", "fp32", "F32")])
def test_own_weight_format_from_the_stored_types(files, name, fmt, said):
    got, why = own_weight_format(files[name])
    assert got == fmt and said in why, (got, why)


def _generate(*args):
    res = CliRunner().invoke(app, ["generate", *args, "--prompt-len", "4", "--new-tokens", "3", "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


def test_generate_runs_a_checkpoint_in_its_own_format_by_default(files):
    got = _generate("--checkpoint", str(files["q8.gguf"]))
    assert got["weights"] == "int8" and "Q8_0" in got["weights_from"]
    got = _generate("--checkpoint", str(files["bf16"]))
    assert got["weights"] == "bf16" and got["dtype"] == "fp32"   # fp32 activations over the bf16 weights
    assert _generate("--checkpoint", str(files["fp16"]))["weights"] == "fp32"
    # asked for: as given; another --dtype: as loaded
    assert _generate("--checkpoint", str(files["q8.gguf"]), "--weights", "fp32")["weights"] == "fp32"
    got = _generate("--checkpoint", str(files["bf16"]), "--dtype", "bf16")
    assert got["weights"] == "fp32" and "--dtype bf16" in got["weights_from"]
    assert _generate("qwen3.8", "--tiny")["weights"] == "fp32"


def test_bf16_auto_decodes_the_checkpoint_s_own_numbers(files):
    """A bf16 folder under auto: the same greedy tokens as the folder loaded whole in fp32 (its bf16 numbers widened
    exactly; only the prefill's products round activations to bf16)."""
    auto = _generate("--checkpoint", str(files["bf16"]))["tokens"]
    fp32 = _generate("--checkpoint", str(files["bf16"]), "--weights", "fp32")["tokens"]
    assert auto == fp32


def test_weights_option_refuses_other_values(files):
    res = CliRunner().invoke(app, ["generate", "--checkpoint", str(files["fp32"]), "--weights", "int4"])
    assert res.exit_code == 2 and "--weights: must be auto or one of fp32, bf16, int8" in res.output
