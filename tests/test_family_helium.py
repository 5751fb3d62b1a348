"""The Helium family (``storelab/checkpoint/families/helium.py``) against transformers 5.23's tiny ``helium``
models saved with ``save_pretrained``, without biases (the default) and with ``attention_bias`` and
``mlp_bias``: the config read (interleaved rotation, the biases), logits equal in fp32 (1e-5 of the
logits' scale) and bf16 (5 %), chunked prefill + steps equal to one pass, transformers' cache bytes after
a prefill, parameters from config.json alone equal to the saved tensors.
"""

from __future__ import annotations

import pytest
import torch

from storelab.checkpoint.config_only import read_model_config
from tests.family_harness import check_bf16, check_cache, check_counts, check_logits, saved_fixture

SPLITS_A = ((0, 2), (2, 11), (11, 12), (12, 13), (13, 21))  # single tokens between chunks

COMMON = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              vocab_size=128, intermediate_size=96, bos_token_id=1, eos_token_id=2, pad_token_id=0,
              max_position_embeddings=512)
TINY = {"helium": dict(COMMON), "helium_biases": dict(COMMON, attention_bias=True, mlp_bias=True)}


saved = saved_fixture(TINY, lambda name: "helium", perturb=0.3)


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
    """Interleaved rotation of the whole head; biases on q/k/v and the MLP as the file says, none on o."""
    hf, folder = saved(model_type)
    cfg = read_model_config(folder)
    c = hf.config
    assert {(lay.token.rope_interleaved, lay.token.partial_rotary, lay.token.qkv_bias, lay.token.out_bias,
             lay.channel.bias) for lay in cfg.layers} == {(True, 1.0, c.attention_bias, False, c.mlp_bias)}
    assert cfg.norm_eps == c.rms_norm_eps


