"""The Phi-3 family (``storelab/checkpoint/families/phi3.py``) against transformers 5.23's tiny ``phi3``
models saved with ``save_pretrained``, plain (Phi-3-mini's shape without its window) and with a window on
every layer, three quarters of each head rotated and tied embeddings (Phi-4-mini's settings): the config
read, the fused ``qkv_proj`` and ``gate_up_proj`` split, logits equal in fp32 (1e-5 of the logits' scale)
and bf16 (5 %), chunked prefill + steps equal to one pass, transformers' cache bytes after a prefill
(windows filled and not), parameters from config.json alone equal to the saved tensors.
"""

from __future__ import annotations

import pytest
import torch

from storelab.checkpoint import load
from storelab.checkpoint.config_only import read_model_config
from tests.helpers import assert_close
from tests.test_families import cache_bytes, ids_of

COMMON = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
              intermediate_size=96, bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=512)
TINY = {
    "phi3": dict(COMMON),
    "phi3_window": dict(COMMON, sliding_window=6, tie_word_embeddings=True,
                        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.75)),
}


def tiny_hf(setting: str):
    """A tiny random transformers model; its norms (ones) perturbed so that a wrong mapping shows in the logits."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model("phi3", **TINY[setting])).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for t in hf.state_dict().values():
            if t.dtype.is_floating_point and (t.dim() == 1 or bool((t == t.flatten()[0]).all())):
                t.add_(0.3 * torch.randn(t.shape, generator=g))
    return hf


_BUILT: dict = {}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    def get(setting: str):
        if setting not in _BUILT:
            hf = tiny_hf(setting)
            d = tmp_path_factory.mktemp(setting)
            hf.save_pretrained(d)
            _BUILT[setting] = (hf, d)
        return _BUILT[setting]

    yield get
    _BUILT.clear()


@pytest.mark.parametrize("model_type", list(TINY))
def test_config_read(model_type, saved):
    """A window (one less than sliding_window) on every layer where the file gives one; the rotated fraction."""
    hf, folder = saved(model_type)
    cfg = read_model_config(folder)
    toks = [lay.token for lay in cfg.layers]
    if model_type == "phi3":
        assert {(a.KIND, a.partial_rotary) for a in toks} == {("attention", 1.0)} and not cfg.tie_embeddings
    else:
        assert {(a.KIND, a.window, a.partial_rotary) for a in toks} == {("window", 5, 0.75)} and cfg.tie_embeddings
    assert {(a.qkv_bias, a.out_bias) for a in toks} == {(False, False)}


@pytest.mark.parametrize("model_type", list(TINY))
def test_logits_equal_transformers(model_type, saved):
    hf, folder = saved(model_type)
    ours = load(folder)
    ids = ids_of(21)
    with torch.no_grad():
        ref = hf(ids).logits
        got, _ = ours(ids)
    tol = 1e-5 * ref.abs().max().item()
    assert_close(got, ref, atol=tol, what=f"{model_type} logits")
    # chunked prefill then single tokens equal one pass
    with torch.no_grad():
        cache, parts = None, []
        for a, b in ((0, 2), (2, 11), (11, 12), (12, 13), (13, 21)):
            out, cache = ours(ids[:, a:b], cache)
            parts.append(out)
    assert_close(torch.cat(parts, 1), got, atol=tol, what=f"{model_type} chunked")


@pytest.mark.parametrize("model_type", list(TINY))
def test_bf16_logits(model_type, saved):
    hf, folder = saved(model_type)
    ours = load(folder, dtype="bf16")
    ids = ids_of(13)
    with torch.no_grad():
        ref = hf.to(torch.bfloat16)(ids).logits.float()
        hf.to(torch.float32)
        got = ours(ids)[0].float()
    scale = ref.abs().max().item()
    err = (got - ref).abs().max().item()
    assert err <= 0.05 * scale, f"{model_type}: bf16 logits differ by {err:.3e} (scale {scale:.3e})"


@pytest.mark.parametrize("model_type", list(TINY))
def test_config_counts_equal_transformers(model_type, saved):
    """Parameters from config.json alone equal the saved tensors (the fused matrices counted once)."""
    from storelab.models.accounting import count_params

    hf, folder = saved(model_type)
    cfg = read_model_config(folder / "config.json")
    held = {t.data_ptr(): t.numel() for t in hf.state_dict().values() if t.dtype.is_floating_point}
    assert count_params(cfg).stored == sum(held.values())


@pytest.mark.parametrize("model_type", list(TINY))
@pytest.mark.parametrize("T", [4, 6, 17])
def test_memory_equals_transformers_cache(model_type, T, saved):
    """``engine="transformers"`` at T tokens (fp32) equals the bytes of transformers' cache after a prefill of T
    (windows of 6: not filled at 4, filled at 6 and 17)."""
    from storelab.models.engines import state_bytes

    hf, folder = saved(model_type)
    cfg = read_model_config(folder)
    with torch.no_grad():
        past = hf(ids_of(T), use_cache=True).past_key_values
    assert sum(state_bytes(cfg, T, engine="transformers", dtype="fp32").values()) == cache_bytes(past)



def test_longrope_read_but_not_run(tmp_path, saved):
    """The 128k releases' ``longrope`` scaling: the config is read (accounting), loading the weights refuses it
    naming the field."""
    import json
    import shutil

    from storelab.checkpoint.shards import CheckpointError

    _, folder = saved("phi3")
    shutil.copytree(folder, tmp_path / "long")
    hf = json.loads((folder / "config.json").read_text())
    hf.pop("rope_parameters", None)
    long = dict(type="longrope", long_factor=[1.0] * 4, short_factor=[1.0] * 4)
    (tmp_path / "long" / "config.json").write_text(json.dumps(dict(hf, rope_theta=10000.0, rope_scaling=long)))
    assert read_model_config(tmp_path / "long").n_layers == 4
    with pytest.raises(CheckpointError, match=r"rope_scaling.rope_type: 'longrope'"):
        load(tmp_path / "long")
