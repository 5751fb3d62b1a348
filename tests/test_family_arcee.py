"""The Arcee family (``storelab/checkpoint/families/arcee.py``) against transformers 5.23's tiny ``arcee``
models saved with ``save_pretrained``, without biases (AFM-4.5B's settings) and with ``attention_bias``
and ``mlp_bias``: the config read (a ReLU^2 MLP without a gate), logits equal in fp32 (1e-5 of the logits'
scale) and bf16 (5 %), chunked prefill + steps equal to one pass, transformers' cache bytes after a
prefill, parameters from config.json alone equal to the saved tensors; an activation storelab does not
run refused naming the field.
"""

from __future__ import annotations

import json

import pytest
import torch

from storelab.checkpoint import load
from storelab.checkpoint.config_only import read_model_config
from tests.helpers import assert_close
from tests.test_families import cache_bytes, ids_of

COMMON = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
              intermediate_size=96, bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=512)
TINY = {"arcee": dict(COMMON), "arcee_biases": dict(COMMON, attention_bias=True, mlp_bias=True)}


def tiny_hf(setting: str):
    """A tiny random transformers model; its norms (ones) and biases (zeros) perturbed so that a wrong mapping
    shows in the logits."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model("arcee", **TINY[setting])).eval()
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
    """Every layer's MLP ReLU^2 without a gate, its biases and the attention's as the file says."""
    hf, folder = saved(model_type)
    cfg = read_model_config(folder)
    c = hf.config
    assert {(lay.channel.activation, lay.channel.gated, lay.channel.bias, lay.token.qkv_bias, lay.token.out_bias)
            for lay in cfg.layers} == {("relu2", False, c.mlp_bias, c.attention_bias, c.attention_bias)}


def test_unknown_activation_refused(tmp_path):
    from storelab.checkpoint.shards import CheckpointError

    (tmp_path / "config.json").write_text(json.dumps(dict(COMMON, model_type="arcee", hidden_act="tanh")))
    with pytest.raises(CheckpointError, match=r"hidden_act: 'tanh' is not supported"):
        read_model_config(tmp_path)


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
    """Parameters from config.json alone equal the saved tensors (two MLP projections, the biases where the file
    has them)."""
    from storelab.models.accounting import count_params

    hf, folder = saved(model_type)
    cfg = read_model_config(folder / "config.json")
    held = {t.data_ptr(): t.numel() for t in hf.state_dict().values() if t.dtype.is_floating_point}
    assert count_params(cfg).stored == sum(held.values())


@pytest.mark.parametrize("model_type", list(TINY))
@pytest.mark.parametrize("T", [4, 6, 17])
def test_memory_equals_transformers_cache(model_type, T, saved):
    """``engine="transformers"`` at T tokens (fp32) equals the bytes of transformers' cache after a prefill of T."""
    from storelab.models.engines import state_bytes

    hf, folder = saved(model_type)
    cfg = read_model_config(folder)
    with torch.no_grad():
        past = hf(ids_of(T), use_cache=True).past_key_values
    assert sum(state_bytes(cfg, T, engine="transformers", dtype="fp32").values()) == cache_bytes(past)

