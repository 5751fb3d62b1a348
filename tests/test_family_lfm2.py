"""The LFM2 family (``storelab/checkpoint/families/lfm2.py``) against transformers 5.23's tiny ``lfm2`` and
``lfm2_moe`` models saved with ``save_pretrained``: logits equal in fp32 (1e-5 of the logits' scale) and
bf16, chunked prefill + steps equal to one pass, parameters from config.json alone equal to the saved
tensors, transformers' cache bytes after a prefill (its convolution keeps W inputs, ours W - 1), and the
published LFM2-1.2B config read (its model card's 1,170,340,608 parameters).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from storelab.checkpoint import load
from storelab.checkpoint.config_only import read_model_config
from tests.helpers import assert_close
from tests.test_families import cache_bytes, ids_of
from tests.family_harness import saved_fixture

FIXTURES = Path(__file__).parent / "fixtures" / "configs"

COMMON = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
              bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=512,
              layer_types=["conv", "full_attention", "conv", "conv"])
# lfm2: the width rule's three steps all change the number: int(2 * 100 / 3) = 66, int(1.3 * 66) = 85, -> 96
TINY = {
    "lfm2": dict(COMMON, intermediate_size=100, block_ffn_dim_multiplier=1.3, block_multiple_of=16, conv_bias=True,
                 conv_L_cache=4),
    "lfm2_moe": dict(COMMON, intermediate_size=80, moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2,
                     num_dense_layers=1, routed_scaling_factor=1.5),
}


saved = saved_fixture(TINY, lambda name: name, perturb=0.1)


@pytest.mark.parametrize("model_type", list(TINY))
def test_config_read(model_type, saved):
    """The layer kinds, the convolution's taps and bias, the feed-forward widths and the routing as written."""
    hf, folder = saved(model_type)
    cfg = read_model_config(folder)
    assert [lay.token.KIND for lay in cfg.layers] == ["short_conv", "attention", "short_conv", "short_conv"]
    conv, attn = cfg.layers[0].token, cfg.layers[1].token
    assert (conv.conv_kernel, conv.bias) == (hf.config.conv_L_cache, hf.config.conv_bias)
    assert attn.qk_norm and (attn.n_heads, attn.n_kv_heads, attn.head_dim) == (4, 2, 16)
    assert attn.rope_theta == hf.config.rope_parameters["rope_theta"] and cfg.tie_embeddings
    dense = [(i, lay.channel) for i, lay in enumerate(cfg.layers) if lay.channel.KIND == "ffn"]
    for i, ch in dense:
        assert ch.d_ff == hf.model.layers[i].feed_forward.w1.out_features
    if model_type == "lfm2":
        assert [ch.d_ff for _, ch in dense] == [96] * 4
    else:
        moe = cfg.layers[1].channel
        assert len(dense) == 1 and moe.KIND == "moe" and moe.router == "sigmoid" and moe.router_bias
        assert (moe.n_experts, moe.top_k, moe.d_expert, moe.routed_scaling) == (4, 2, 32, 1.5)


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
    # chunked prefill (chunks shorter and longer than the convolution) then single tokens equal one pass
    with torch.no_grad():
        cache, parts = None, []
        for a, b in ((0, 2), (2, 9), (9, 10), (10, 11), (11, 21)):
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
    """Parameters from config.json alone equal the numbers the transformers model saves (the expert bias,
    a buffer there, included)."""
    from storelab.models.accounting import count_params

    hf, folder = saved(model_type)
    cfg = read_model_config(folder / "config.json")
    held = {t.data_ptr(): t.numel() for t in hf.state_dict().values() if t.dtype.is_floating_point}
    assert count_params(cfg).stored == sum(held.values())


def lfm2_cache_bytes(past) -> int:
    """transformers' cache after a prefill: the attention layers' keys and values (``cache_bytes``) and the
    convolution layers' ``conv_states`` (a dict per layer, which ``cache_bytes`` does not open)."""
    conv = sum(t.untyped_storage().nbytes() for layer in past.layers
               for t in getattr(layer, "conv_states", {}).values() if t is not None)
    return cache_bytes(past) + conv


@pytest.mark.parametrize("model_type", list(TINY))
@pytest.mark.parametrize("T", [1, 3, 17])
def test_memory_equals_transformers_cache(model_type, T, saved):
    """``engine="transformers"`` at T tokens (fp32) equals the bytes of transformers' cache after a prefill of
    T: a convolution layer holds its last W inputs (``conv_L_cache``, zeros before the first), ours W - 1."""
    from storelab.models.engines import state_bytes

    hf, folder = saved(model_type)
    cfg = read_model_config(folder)
    with torch.no_grad():
        past = hf(ids_of(T), use_cache=True).past_key_values
    assert sum(state_bytes(cfg, T, engine="transformers", dtype="fp32").values()) == lfm2_cache_bytes(past)
    ideal = sum(state_bytes(cfg, T, engine="ideal", dtype="fp32").values())
    n_conv = sum(lay.token.KIND == "short_conv" for lay in cfg.layers)
    assert lfm2_cache_bytes(past) - ideal == n_conv * 64 * 4       # one more input of D fp32 per conv layer


def test_published_lfm2_1_2b():
    """LiquidAI/LFM2-1.2B's config.json as published (``block_ff_dim``, ``full_attn_idxs``, no
    ``tie_word_embeddings``): 10 conv + 6 attention layers, width 8192, tied, and the model card's
    1,170,340,608 parameters."""
    from storelab.models.accounting import count_params

    path = FIXTURES / "LFM2-1.2B.json"
    raw = json.loads(path.read_text())
    cfg = read_model_config(path)
    attn = [i for i, lay in enumerate(cfg.layers) if lay.token.KIND == "attention"]
    assert attn == raw["full_attn_idxs"] and len(cfg.layers) - len(attn) == 10
    assert {lay.channel.d_ff for lay in cfg.layers} == {8192} and cfg.tie_embeddings
    assert cfg.layers[0].token.conv_kernel == raw["conv_L_cache"]
    assert count_params(cfg).stored == 1_170_340_608


@pytest.mark.parametrize("change, message", [
    (dict(layer_types=["conv", "mamba", "conv", "conv"]), r"layer_types\[1\]: 'mamba' is not an LFM2 layer type"),
    (dict(layer_types=None, full_attn_idxs=[1, "2"]), r"full_attn_idxs\[1\]: must be a layer index, got '2'"),
    (dict(conv_L_cache=1), r"conv_L_cache: must be an integer >= 2"),
])
def test_refuses_naming_the_field(tmp_path, change, message):
    from storelab.checkpoint.shards import CheckpointError

    hf = {k: v for k, v in dict(TINY["lfm2"], model_type="lfm2", **change).items() if v is not None}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(CheckpointError, match=message):
        read_model_config(tmp_path)


def test_full_attn_idxs_places_the_attention_layers(tmp_path):
    """The older form: ``full_attn_idxs`` instead of ``layer_types`` (LFM2-1.2B's file), all attention without."""
    base = {k: v for k, v in dict(TINY["lfm2"], model_type="lfm2").items() if k != "layer_types"}
    for idxs, want in (([0, 3], ["attention", "short_conv", "short_conv", "attention"]), (None, ["attention"] * 4)):
        hf = base if idxs is None else dict(base, full_attn_idxs=idxs)
        (tmp_path / "config.json").write_text(json.dumps(hf))
        assert [lay.token.KIND for lay in read_model_config(tmp_path).layers] == want
