"""The GLM-4 dense family (``storelab/checkpoint/families/glm.py``) against transformers 5.23's tiny ``glm``
and ``glm4`` models saved with ``save_pretrained``: the config read (half of each head rotated on
interleaved pairs, q/k/v biases, ``glm4``'s sandwich norms), logits equal in fp32 (1e-5 of the logits'
scale) and bf16 (5 %), chunked prefill + steps equal to one pass, transformers' cache bytes after a
prefill, parameters from config.json alone equal to the saved tensors.
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
TINY = {"glm": dict(COMMON), "glm4": dict(COMMON)}


saved = saved_fixture(TINY, lambda name: name, perturb=0.3)


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
    """Half of each head rotated on interleaved pairs, biases on q/k/v only, pre or sandwich norms."""
    hf, folder = saved(model_type)
    cfg = read_model_config(folder)
    toks = [lay.token for lay in cfg.layers]
    assert {(a.partial_rotary, a.rope_interleaved, a.qkv_bias, a.out_bias) for a in toks} == {(0.5, True, True, False)}
    assert {lay.norms for lay in cfg.layers} == {"sandwich" if model_type == "glm4" else "pre"}
    assert cfg.norm_eps == hf.config.rms_norm_eps and not cfg.tie_embeddings


