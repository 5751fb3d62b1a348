"""The Seed-OSS family (``storelab/checkpoint/families/seed_oss.py``) against transformers 5.23's tiny
``seed_oss`` models saved with ``save_pretrained``, with the file's defaults (biases on q, k, v only) and with
every bias field turned the other way (``attention_bias`` false, ``attention_out_bias`` and ``mlp_bias``
true): the biases read, logits equal in fp32 (1e-5 of the logits' scale) and bf16 (5 %), chunked prefill
+ steps equal to one pass, transformers' cache bytes after a prefill, parameters from config.json alone
equal to the saved tensors.
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
TINY = {
    "seed_oss": dict(COMMON),
    "seed_oss_biases": dict(COMMON, attention_bias=False, attention_out_bias=True, mlp_bias=True),
}


saved = saved_fixture(TINY, lambda name: "seed_oss", perturb=0.3)


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
    """The three bias fields as the file (or transformers' defaults) says."""
    hf, folder = saved(model_type)
    cfg = read_model_config(folder)
    c = hf.config
    assert {(lay.token.qkv_bias, lay.token.out_bias, lay.channel.bias) for lay in cfg.layers} == {
        (c.attention_bias, c.attention_out_bias, c.mlp_bias)}
    assert {lay.norms for lay in cfg.layers} == {"pre"} and {lay.token.KIND for lay in cfg.layers} == {"attention"}


