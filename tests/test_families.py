"""The families read by the shared reader (``storelab/checkpoint/families/_reader.py``), each against
transformers 5.23's tiny model of the family: the config read, the model loaded from the folder that
``save_pretrained`` wrote, logits equal in fp32 (1e-5 relative to the logits' scale) and in bf16,
chunked prefill + decode equal to one pass, and the analytic cache equal to transformers' own cache
after a prefill (every tensor it holds, each storage once), windows filled and not.
"""

from __future__ import annotations

import pytest

from tests.family_harness import (cache_bytes, check_bf16, check_cache, check_counts, check_logits,  # noqa: F401
                                  ids_of, saved_fixture)

COMMON = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
              intermediate_size=96, bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=512)
MOE = dict(moe_intermediate_size=32, num_experts_per_tok=2)

# model_type -> tiny settings (published field names; windows short enough to fill in a test)
TINY = {
    "llama": dict(COMMON, head_dim=16, attention_bias=True),
    # Llama 3.1's scaling with a short pretraining length, so that positions 0-20 reach the scaled frequencies
    "llama3_rope": dict(COMMON, head_dim=16, rope_parameters=dict(
        rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=16)),
    "yarn_rope": dict(COMMON, head_dim=16, rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                                                original_max_position_embeddings=16)),
    "mistral": dict(COMMON, head_dim=16, sliding_window=6),
    "qwen2": dict(COMMON, use_sliding_window=True, sliding_window=6, max_window_layers=2),
    "qwen2_moe": dict(COMMON, **MOE, num_experts=4, shared_expert_intermediate_size=48, decoder_sparse_step=2,
                      norm_topk_prob=False),
    "qwen3": dict(COMMON, head_dim=16),
    "qwen3_moe": dict(COMMON, **MOE, head_dim=16, num_experts=4, norm_topk_prob=True, mlp_only_layers=[0]),
    "mixtral": dict(COMMON, num_local_experts=4, num_experts_per_tok=2),
    "smollm3": dict(COMMON, no_rope_layer_interval=2),
    # grouped routing: 2 groups of 4 experts, the best group's experts only
    "deepseek_v3": dict(COMMON, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
                        qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
                        topk_group=1, first_k_dense_replace=1, n_shared_experts=1, moe_intermediate_size=32),
    # DeepSeek-V3's published rope: YaRN with mscale = mscale_all_dim (the logits' scale times mscale^2)
    "deepseek_v3_yarn": dict(COMMON, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
                             qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
                             topk_group=1, first_k_dense_replace=1, n_shared_experts=1, moe_intermediate_size=32,
                             rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=40.0, mscale=1.0,
                                                  mscale_all_dim=1.0, beta_fast=32, beta_slow=1,
                                                  original_max_position_embeddings=16)),
    # DeepSeek-V2: softmax scores, the best single score per group (group_limited_greedy), no renormalising
    "deepseek_v2": dict(COMMON, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
                        qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, n_group=2,
                        topk_group=1, topk_method="group_limited_greedy", first_k_dense_replace=1, n_shared_experts=1,
                        moe_intermediate_size=32, routed_scaling_factor=1.5),
    "deepseek_v32": dict(COMMON, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
                         qk_nope_head_dim=16, v_head_dim=16, index_topk=8, index_head_dim=16, index_n_heads=8,
                         n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1,
                         n_shared_experts=1, moe_intermediate_size=32),
}


TYPE = {"llama3_rope": "llama", "yarn_rope": "qwen3", "deepseek_v3_yarn": "deepseek_v3"}  # entries of TINY that are another setting of a family


saved = saved_fixture(TINY, lambda name: TYPE.get(name, name))


@pytest.mark.parametrize("model_type", list(TINY))
def test_logits_equal_transformers(model_type, saved):
    check_logits(*saved(model_type), what=model_type)


@pytest.mark.parametrize("model_type", list(TINY))
def test_bf16_logits(model_type, saved):
    check_bf16(*saved(model_type), what=model_type)


@pytest.mark.parametrize("model_type", list(TINY))
@pytest.mark.parametrize("T", [4, 6, 17])
def test_memory_equals_transformers_cache(model_type, T, saved):
    """``engine="transformers"`` at T tokens (fp32) equals the bytes of transformers' cache after a prefill of T
    (windows of 6: not filled at 4, filled at 6 and 17)."""
    check_cache(*saved(model_type), T)


@pytest.mark.parametrize("model_type", list(TINY))
def test_config_counts_equal_transformers(model_type, saved):
    """Parameters from config.json alone equal the numbers the transformers model saves (its parameters and
    the routing bias it keeps as a buffer; each tensor once)."""
    check_counts(*saved(model_type))


