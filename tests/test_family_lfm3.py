"""The LFM3 family (``storelab/checkpoint/families/lfm3.py``) against transformers 5.23's tiny ``lfm3`` model
saved with ``save_pretrained``: logits equal in fp32 (1e-5 of the logits' scale) and bf16 (5 %), chunked
prefill + steps equal to one pass, parameters from config.json alone equal to the saved tensors, transformers'
cache bytes after a prefill (its convolutions' dict-held inputs counted; windows filled and not). Two tiny
models: the published defaults (sandwich norms, the per-head gate, proportional RoPE on the full layers) and
the other settings (pre norms, no gate, biases, plain RoPE everywhere).
"""

from __future__ import annotations

import json

import pytest
import torch

from storelab.checkpoint import load
from storelab.checkpoint.config_only import read_model_config
from tests.helpers import assert_close
from tests.test_engines import _held_bytes
from tests.test_families import ids_of
from tests.family_harness import saved_fixture, tiny_hf

COMMON = dict(hidden_size=64, num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              vocab_size=128, intermediate_size=96, bos_token_id=1, eos_token_id=2, pad_token_id=0,
              max_position_embeddings=512, conv_L_cache=4, sliding_window=6)
TINY = {
    "published": dict(COMMON),                                   # layer_types and ropes: transformers' defaults
    "plain": dict(COMMON, use_sandwich_norm=False, use_attention_gate=False, attention_bias=True, conv_bias=True,
                  layer_types=["conv", "sliding_attention", "full_attention", "conv", "sliding_attention"],
                  rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 5e5},
                                   "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}),
}


saved = saved_fixture(TINY, lambda name: "lfm3", perturb=0.1)


def test_config_read(saved):
    """The default pattern, sandwich norms, the gate, the window, the proportional rope as a partial one."""
    hf, folder = saved("published")
    cfg = read_model_config(folder)
    assert [lay.token.KIND for lay in cfg.layers] == ["short_conv", "short_conv", "attention", "short_conv", "window"]
    assert {lay.norms for lay in cfg.layers} == {"sandwich"} and cfg.tie_embeddings
    full, local = cfg.layers[2].token, cfg.layers[4].token
    assert full.head_gate and full.qk_norm and local.window == 5
    # transformers' default: proportional, theta 1e6, half of each head: 4 pairs of 16 channels turn
    assert full.rotary_dim == 8 and full.rope_theta == pytest.approx(1e6 ** 0.5)
    assert local.rotary_dim == 16 and local.rope_theta == 1e4
    plain = read_model_config(saved("plain")[1])
    assert {lay.norms for lay in plain.layers} == {"pre"}
    assert not plain.layers[1].token.head_gate and plain.layers[1].token.qkv_bias


@pytest.mark.parametrize("name", list(TINY))
def test_logits_equal_transformers(name, saved):
    hf, folder = saved(name)
    ours = load(folder)
    ids = ids_of(21)
    with torch.no_grad():
        ref = hf(ids).logits
        got, _ = ours(ids)
    tol = 1e-5 * ref.abs().max().item()
    assert_close(got, ref, atol=tol, what=f"{name} logits")
    with torch.no_grad():                      # chunks shorter and longer than the window and the convolution
        cache, parts = None, []
        for a, b in ((0, 2), (2, 9), (9, 10), (10, 11), (11, 21)):
            out, cache = ours(ids[:, a:b], cache)
            parts.append(out)
    assert_close(torch.cat(parts, 1), got, atol=tol, what=f"{name} chunked")


def test_reordering_matters(saved, tmp_path):
    """The proportional rope read as a plain partial one without reordering the channels gives other logits:
    the test above can tell (the full layer's theta taken as published, the reordering undone)."""
    from storelab.checkpoint.families import lfm3

    hf, folder = saved("published")
    ids = ids_of(21)
    with torch.no_grad():
        ref = hf(ids).logits
    original = lfm3._reordered
    lfm3._reordered = lambda name, K, a: original(name, K, K // 2)     # the identity order
    try:
        with torch.no_grad():
            got = load(folder)(ids)[0]
    finally:
        lfm3._reordered = original
    assert (got - ref).abs().max().item() > 1e-3 * ref.abs().max().item()


@pytest.mark.parametrize("name", list(TINY))
def test_bf16_logits(name, saved):
    hf, folder = saved(name)
    ours = load(folder, dtype="bf16")
    ids = ids_of(13)
    with torch.no_grad():
        ref = hf.to(torch.bfloat16)(ids).logits.float()
        hf.to(torch.float32)
        got = ours(ids)[0].float()
    scale = ref.abs().max().item()
    err = (got - ref).abs().max().item()
    assert err <= 0.05 * scale, f"{name}: bf16 logits differ by {err:.3e} (scale {scale:.3e})"


@pytest.mark.parametrize("name", list(TINY))
def test_config_counts_equal_transformers(name, saved):
    from storelab.models.accounting import count_params

    hf, folder = saved(name)
    cfg = read_model_config(folder / "config.json")
    held = {t.data_ptr(): t.numel() for t in hf.state_dict().values() if t.dtype.is_floating_point}
    assert count_params(cfg).stored == sum(held.values())


@pytest.mark.parametrize("T", [3, 6, 17])
def test_memory_equals_transformers_cache(T, saved):
    """``engine="transformers"`` at T tokens (fp32) equals the bytes of transformers' cache after a prefill of T:
    keys and values (a window of 6 counting the query: not filled at 3, filled at 6 and 17) and each
    convolution's W inputs (``conv_states``, a dict)."""
    from storelab.models.engines import state_bytes

    hf, folder = saved("published")
    cfg = read_model_config(folder)
    with torch.no_grad():
        past = hf(ids_of(T), use_cache=True).past_key_values
    assert sum(state_bytes(cfg, T, engine="transformers", dtype="fp32").values()) == _held_bytes(past)


@pytest.mark.parametrize("change, message", [
    (dict(layer_types=["conv", "mamba", "conv", "conv", "conv"]), r"layer_types\[1\]: 'mamba' is not an LFM3"),
    (dict(num_experts=4), r"num_experts: LFM3's feed-forward is dense"),
    (dict(use_sandwich_norm="yes"), r"use_sandwich_norm: must be true or false"),
])
def test_refuses_naming_the_field(tmp_path, change, message):
    from storelab.checkpoint.shards import CheckpointError

    (tmp_path / "config.json").write_text(json.dumps(dict(COMMON, model_type="lfm3", **change)))
    with pytest.raises(CheckpointError, match=message):
        read_model_config(tmp_path)


def test_other_rope_refused_for_running(saved, tmp_path):
    """A rope kind storelab does not turn is read for accounting and refused for loading, naming the field."""
    from storelab.checkpoint.shards import CheckpointError

    hf, folder = saved("plain")
    raw = json.loads((folder / "config.json").read_text())
    raw["rope_parameters"]["full_attention"] = {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0}
    for f in folder.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "config.json").write_text(json.dumps(raw))
    read_model_config(tmp_path)
    with pytest.raises(CheckpointError, match=r"rope_parameters\.full_attention\.rope_type: 'dynamic'"):
        load(tmp_path)


def test_module_names_read_too(tmp_path):
    """A folder in transformers' module names (``self_attn.g_proj``, after its load-time renaming of the
    published ``gate_proj``) gives transformers' logits too."""
    from safetensors.torch import save_file

    hf = tiny_hf("lfm3", TINY["published"])   # a fresh one: the bf16 test leaves the shared model's rope tables rounded
    hf.config.save_pretrained(tmp_path)
    sd = {k: v.contiguous() for k, v in hf.state_dict().items() if k != "lm_head.weight"}
    assert any(k.endswith("self_attn.g_proj.weight") for k in sd)
    save_file(sd, str(tmp_path / "model.safetensors"))
    ids = ids_of(9)
    with torch.no_grad():
        ref = hf(ids).logits
        got = load(tmp_path)(ids)[0]
    assert_close(got, ref, atol=1e-5 * ref.abs().max().item(), what="module names")
