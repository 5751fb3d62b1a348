"""The Bamba family (``storelab/checkpoint/families/bamba.py``) against transformers 5.23's tiny ``bamba`` model
saved with ``save_pretrained``: the layers read (Mamba-2 with two groups, attention at attn_layer_indices with RoPE
on half of each head), logits equal in fp32 (1e-5 of the logits' scale) and bf16, chunked prefill + steps equal to
one pass, parameters from config.json alone equal to the saved tensors (with and without the MLP's biases),
transformers' cache bytes after a prefill. No published Bamba config.json was found to copy; none is invented.
"""

from __future__ import annotations

import json

import pytest

from storelab.checkpoint.config_only import read_model_config
from tests.test_family_jamba import check_bf16, check_counts, check_logits, check_memory, tiny_hf

COMMON = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
              bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=512, intermediate_size=96,
              attn_layer_indices=[1], mamba_n_heads=8, mamba_d_head=16, mamba_d_state=8, mamba_n_groups=2,
              mamba_chunk_size=8, rope_theta=1000.0)
TINY = {"plain": COMMON, "mlp_bias": dict(COMMON, mlp_bias=True, attention_bias=True, attn_layer_indices=[0, 3])}

_BUILT: dict = {}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    def get(name: str):
        if name not in _BUILT:
            hf = tiny_hf("bamba", TINY[name])
            d = tmp_path_factory.mktemp(name)
            hf.save_pretrained(d)
            _BUILT[name] = (hf, d)
        return _BUILT[name]

    yield get
    _BUILT.clear()


def test_config_read(saved):
    hf, folder = saved("plain")
    cfg = read_model_config(folder)
    assert [lay.token.KIND for lay in cfg.layers] == ["mamba2", "attention", "mamba2", "mamba2"]
    mamba, attn = cfg.layers[0].token, cfg.layers[1].token
    assert (mamba.n_heads, mamba.head_dim, mamba.d_state, mamba.n_groups, mamba.conv_kernel) == (8, 16, 8, 2, 4)
    assert mamba.norm_eps == hf.config.rms_norm_eps and mamba.dt_limit == (0.0, float("inf"))
    assert attn.partial_rotary == 0.5 and attn.rope_theta == 1000.0 and not attn.qkv_bias
    assert {lay.channel.d_ff for lay in cfg.layers} == {96} and not cfg.layers[0].channel.bias


@pytest.mark.parametrize("name", list(TINY))
def test_logits_equal_transformers(name, saved):
    check_logits(*saved(name), ((0, 2), (2, 9), (9, 10), (10, 11), (11, 21)), f"bamba {name}")


def test_bf16_logits(saved):
    check_bf16(*saved("plain"), "bamba")


@pytest.mark.parametrize("name", list(TINY))
def test_config_counts_equal_transformers(name, saved):
    check_counts(*saved(name))


@pytest.mark.parametrize("T", [1, 4, 17])
def test_memory_equals_transformers_cache(T, saved):
    check_memory(*saved("plain"), T)


def test_partial_rotary_is_half_whatever_the_file_says(tmp_path):
    """transformers' BambaConfig sets partial_rotary_factor 0.5 over the file's value; so does the reader."""
    hf = dict(COMMON, model_type="bamba", rope_parameters={"rope_theta": 1e4, "partial_rotary_factor": 1.0})
    (tmp_path / "config.json").write_text(json.dumps(hf))
    assert read_model_config(tmp_path).layers[1].token.partial_rotary == 0.5


@pytest.mark.parametrize("change, message", [
    (dict(attn_layer_indices=[1, "2"]), r"attn_layer_indices\[1\]: must be a layer index, got '2'"),
    (dict(mamba_d_head=10), r"mamba_d_head: 10 x 8 heads is not mamba_expand x hidden_size = 128"),
    (dict(mamba_d_head="auto", mamba_n_heads=6), r"mamba_n_heads: 6 heads do not divide"),
    (dict(hidden_act="gelu"), r"hidden_act: 'gelu' is not supported"),
])
def test_refuses_naming_the_field(tmp_path, change, message):
    from storelab.checkpoint.shards import CheckpointError

    (tmp_path / "config.json").write_text(json.dumps(dict(COMMON, model_type="bamba", **change)))
    with pytest.raises(CheckpointError, match=message):
        read_model_config(tmp_path)
