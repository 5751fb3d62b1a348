"""Llama 3 / 3.1 / 3.2 GGUFs: llama.cpp's converter writes the llama3 RoPE scaling as ``rope_freqs.weight`` (per-frequency
factors, no metadata; ``storelab/checkpoint/gguf/rope_freqs.py``), read back as transformers' ``rope_scaling``.

* the published settings (Llama 3.1 8B, 3.2 1B, a 4096-token pretraining length): the factors the converter writes give
  back a scaling whose factors equal them, and at 8192 tokens the published low / high factors;
* a tiny llama with tests/test_families.py's ``llama3_rope`` setting, written the converter's way: storelab's logits
  equal transformers' (original model); its config reads the rope_freqs bytes and no other tensor;
* factors no llama3 scaling gives are refused naming the file and the tensor.

transformers 5.23's own GGUF reader is no oracle here: it does not read ``rope_freqs`` (its config of this file says
rope_type default, its logits differ from the original model's by about 1% of their scale).
"""

from __future__ import annotations

import math
import os

import gguf
import numpy as np
import pytest
import torch

from storelab.checkpoint import CheckpointError, load, read_model_config
from storelab.checkpoint.gguf import read_header
from storelab.checkpoint.gguf.rope_freqs import llama3_factors, llama3_scaling
from storelab.ops.rope import rope_frequencies
from tests.family_harness import ids_of, tiny_hf
from tests.gguf_writer import write_gguf
from tests.helpers import assert_close

os.environ.setdefault("USE_HUB_KERNELS", "0")

ROPE = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
            original_max_position_embeddings=16)
# tests/test_families.py TINY["llama3_rope"]; the pretraining length also at the top level, where the converter
# reads it (``self.hparams.get("original_max_position_embeddings", 8192)``)
TINY = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
            intermediate_size=96, bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=512,
            head_dim=16, rope_parameters=ROPE, original_max_position_embeddings=16)


def converter_factors(theta, dim, factor, low, high, old) -> list[float]:
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    out = []
    for freq in freqs:
        w = 2 * math.pi / freq
        s = (old / w - low) / (high - low)
        out.append(1 if w < old / high else factor if w > old / low else 1 / ((1 - s) / factor + s))
    return torch.tensor(out, dtype=torch.float32).tolist()


@pytest.mark.parametrize("theta, dim, factor, low, high, old", [
    (500000.0, 128, 8.0, 1.0, 4.0, 8192),     # Llama 3.1 8B / 70B / 405B
    (500000.0, 64, 32.0, 1.0, 4.0, 8192),     # Llama 3.2 1B
    (500000.0, 128, 32.0, 1.0, 4.0, 8192),    # Llama 3.2 3B
    (500000.0, 128, 16.0, 2.0, 5.0, 4096),    # another length: the same (factor, a, b) stated at 8192
    (500000.0, 16, 8.0, 1.0, 4.0, 16),        # one middle frequency
    (10000.0, 16, 8.0, 4.0, 4.0 + 1e-9, 8192),  # none: a step
])
def test_published_settings_read_back(theta, dim, factor, low, high, old):
    f = converter_factors(theta, dim, factor, low, high, old)
    sc = llama3_scaling(f, theta=theta, dim=dim, where="x")
    assert sc["rope_type"] == "llama3" and sc["factor"] == factor and sc["original_max_position_embeddings"] == 8192
    inv = (1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))).tolist()
    a, b = 8192 / (sc["high_freq_factor"] - sc["low_freq_factor"]), sc["low_freq_factor"] / (
        sc["high_freq_factor"] - sc["low_freq_factor"])
    np.testing.assert_allclose(llama3_factors(inv, factor, a, b), f, rtol=1e-5)
    # storelab's RoPE of the read scaling divides each frequency by the stored factor
    ours, _ = rope_frequencies(dim, theta, sc)
    np.testing.assert_allclose(ours.numpy(), np.array(inv) / np.array(f), rtol=2e-5)
    if old == 8192 and high - low > 1e-3:
        assert (sc["low_freq_factor"], sc["high_freq_factor"]) == (low, high)
    if old == 4096:
        assert (sc["low_freq_factor"], sc["high_freq_factor"]) == (2 * low, 2 * high)


def test_trivial_and_unknown_factors():
    assert llama3_scaling([1.0] * 8, theta=1e4, dim=16, where="x") is None
    assert llama3_scaling([4.0] * 8, theta=1e4, dim=16, where="x") == {"rope_type": "linear", "factor": 4.0}
    f = converter_factors(500000.0, 128, 8.0, 1.0, 4.0, 8192)
    f[31] *= 1.01
    with pytest.raises(CheckpointError, match=r"x: the factors are not Llama 3's scaling .*factor 31: stored"):
        llama3_scaling(f, theta=500000.0, dim=128, where="x")
    with pytest.raises(CheckpointError, match="x: 3 factors, must be 64"):
        llama3_scaling([1.0, 2.0, 3.0], theta=500000.0, dim=128, where="x")


@pytest.fixture(scope="module")
def tiny():
    return tiny_hf("llama", TINY)


def test_logits_equal_transformers(tiny, tmp_path, monkeypatch):
    path = tmp_path / "llama3.gguf"
    write_gguf(tiny, "llama", path)
    assert "rope_freqs.weight" in read_header(path).tensors
    import storelab.checkpoint.gguf.dequant as dequant

    seen = []
    real = dequant.read_tensor
    monkeypatch.setattr(dequant, "read_tensor", lambda folder, t: seen.append(t.name) or real(folder, t))
    cfg = read_model_config(path)
    assert seen == ["rope_freqs.weight"]    # the config reads that tensor's 32 bytes and no other
    assert cfg.layers[0].token.rope_scaling["rope_type"] == "llama3"
    ids = ids_of(21)
    with torch.no_grad():
        ref = tiny(ids).logits
    ours = load(path)
    with torch.no_grad():
        got, _ = ours(ids)
    assert_close(got, ref, atol=1e-5 * ref.abs().max().item(), what="llama3 GGUF logits")
    # without the factors the model is another one: the test sees the scaling
    plain = tmp_path / "plain.gguf"
    write_gguf(tiny, "llama", plain, drop=("rope_freqs.weight",))
    with torch.no_grad():
        other, _ = load(plain)(ids)
    assert (other - ref).abs().max() > 1e-3 * ref.abs().max()


def test_unknown_factors_are_refused(tiny, tmp_path):
    path = tmp_path / "bad.gguf"
    write_gguf(tiny, "llama", path)
    raw = bytearray(path.read_bytes())
    t = read_header(path).tensors["rope_freqs.weight"]
    f = np.frombuffer(bytes(raw[t.offset:t.offset + t.nbytes]), dtype=np.float32).copy()
    f[2] = 3.0                                 # a low frequency off the curve
    raw[t.offset:t.offset + t.nbytes] = f.tobytes()
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match=r"bad.gguf: tensor 'rope_freqs.weight': the factors are not Llama 3"):
        read_model_config(path)
