"""The EXAONE 4.0 family (``storelab/checkpoint/families/exaone4.py``) against transformers 5.23's tiny
``exaone4`` models saved with ``save_pretrained``, in the two forms LG publishes: the 32B's hybrid (local
layers with RoPE, global layers with none) and the 1.2B's (every layer global and rotating, llama3 rope
scaling, tied embeddings). The config read (post norms, per-head q/k norms, windows, NoPE), logits equal
in fp32 (1e-5 of the logits' scale) and bf16 (5 %), chunked prefill + steps equal to one pass,
transformers' cache bytes after a prefill (windows filled and not), parameters from config.json alone
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
# "exaone4": the pattern without layer_types (every 2nd layer global); "exaone4_global": no window, so every
# layer rotates (transformers needs layer_types then), with llama3 scaling past 16 tokens
TINY = {
    "exaone4": dict(COMMON, sliding_window=6, sliding_window_pattern=2),
    "exaone4_global": dict(COMMON, sliding_window=None, layer_types=["full_attention"] * 4, tie_word_embeddings=True,
                           rope_parameters=dict(rope_type="llama3", rope_theta=10000.0, factor=8.0,
                                                low_freq_factor=1.0, high_freq_factor=4.0,
                                                original_max_position_embeddings=16)),
}


saved = saved_fixture(TINY, lambda name: "exaone4", perturb=0.3)


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
    """Post norms, per-head q/k norms, windows one less than sliding_window, NoPE on the global layers of a
    model with a window only."""
    hf, folder = saved(model_type)
    cfg = read_model_config(folder)
    assert {lay.norms for lay in cfg.layers} == {"post"} and cfg.norm_eps == hf.config.rms_norm_eps
    toks = [lay.token for lay in cfg.layers]
    assert all(a.qk_norm and a.qk_norm_scope == "head" for a in toks)
    if model_type == "exaone4":
        assert [a.KIND for a in toks] == ["window", "attention"] * 2 and not cfg.tie_embeddings
        assert [a.partial_rotary for a in toks] == [1.0, 0.0] * 2
        assert toks[0].window == hf.config.sliding_window - 1
    else:
        assert [a.KIND for a in toks] == ["attention"] * 4 and cfg.tie_embeddings
        assert {a.partial_rotary for a in toks} == {1.0}
        assert {a.rope_scaling["rope_type"] for a in toks} == {"llama3"}


