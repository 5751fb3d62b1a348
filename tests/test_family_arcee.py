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

from storelab.checkpoint.config_only import read_model_config
from tests.family_harness import check_bf16, check_cache, check_counts, check_logits, saved_fixture

SPLITS_A = ((0, 2), (2, 11), (11, 12), (12, 13), (13, 21))  # single tokens between chunks

COMMON = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
              intermediate_size=96, bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=512)
TINY = {"arcee": dict(COMMON), "arcee_biases": dict(COMMON, attention_bias=True, mlp_bias=True)}


saved = saved_fixture(TINY, lambda name: "arcee", perturb=0.3)


@pytest.mark.parametrize("name", list(TINY))
def test_logits_equal_transformers(name, saved):
    check_logits(*saved(name), what=name, splits=SPLITS_A)


@pytest.mark.parametrize("name", list(TINY))
def test_bf16_logits(name, saved):
    check_bf16(*saved(name), what=name)


@pytest.mark.parametrize("name", list(TINY))
@pytest.mark.parametrize("T", [4, 6, 17])
def test_memory_equals_transformers_cache(name, T, saved):
    check_cache(*saved(name), T)


@pytest.mark.parametrize("name", list(TINY))
def test_config_counts_equal_transformers(name, saved):
    check_counts(*saved(name))


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


