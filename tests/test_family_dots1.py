"""The dots.llm1 family (``storelab/checkpoint/families/dots1.py``) against transformers 5.23's tiny ``dots1``
models saved with ``save_pretrained``: the config read (per-head q/k norms, a dense first layer, sigmoid
routing with a choice bias within groups, shared experts, windows from ``max_window_layers`` on), logits
equal in fp32 (1e-5 of the logits' scale) and bf16 (5 %), chunked prefill + steps equal to one pass,
transformers' cache bytes after a prefill (windows filled and not), parameters from config.json alone
equal to the saved tensors (the choice bias, a buffer there, included).
"""

from __future__ import annotations

import pytest
import torch

from storelab.checkpoint.config_only import read_model_config
from tests.family_harness import check_bf16, check_cache, check_counts, check_logits, saved_fixture

SPLITS_A = ((0, 2), (2, 11), (11, 12), (12, 13), (13, 21))  # single tokens between chunks

# 8 experts in 2 groups, the best group only; renormalised and scaled, so that each routing step shows
TINY = {
    "dots1": dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                  vocab_size=128, intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8,
                  num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1, first_k_dense_replace=1,
                  routed_scaling_factor=1.5, norm_topk_prob=True, sliding_window=6, max_window_layers=2,
                  bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=512),
}


saved = saved_fixture(TINY, lambda name: "dots1", perturb=0.3)


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
    """Per-head q/k norms; layer 0 dense, the rest routed as the file says; windows from max_window_layers on."""
    hf, folder = saved(model_type)
    cfg = read_model_config(folder)
    assert [(lay.token.KIND, lay.channel.KIND) for lay in cfg.layers] == [
        ("attention", "ffn"), ("attention", "moe"), ("window", "moe"), ("window", "moe")]
    assert {(lay.token.qk_norm, lay.token.qk_norm_scope) for lay in cfg.layers} == {(True, "head")}
    moe = cfg.layers[1].channel
    assert (moe.router, moe.router_bias, moe.n_experts, moe.top_k, moe.n_group, moe.topk_group) == (
        "sigmoid", True, 8, 2, 2, 1)
    assert (moe.norm_topk_prob, moe.routed_scaling, moe.n_shared, moe.d_expert) == (True, 1.5, 1, 32)


