"""The families read by the shared reader (``storelab/checkpoint/families/_reader.py``), each against
transformers 5.23's tiny model of the family: the config read, the model loaded from the folder that
``save_pretrained`` wrote, logits equal in fp32 (1e-5 relative to the logits' scale) and in bf16,
chunked prefill + decode equal to one pass, and the analytic cache equal to transformers' own cache
after a prefill (every tensor it holds, each storage once), windows filled and not.
"""

from __future__ import annotations

import pytest
import torch

from storelab.checkpoint import load
from storelab.checkpoint.config_only import read_model_config
from tests.helpers import assert_close

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


def tiny_hf(model_type: str):
    """A tiny random transformers model; tensors that start constant (norms, biases) perturbed so that
    a wrong mapping shows in the logits."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(TYPE.get(model_type, model_type), **TINY[model_type])
    hf = AutoModelForCausalLM.from_config(cfg).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for t in hf.state_dict().values():
            if t.dtype.is_floating_point and (t.dim() == 1 or bool((t == t.flatten()[0]).all())):
                t.add_(0.1 * torch.randn(t.shape, generator=g))
    return hf


_BUILT: dict = {}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    def get(model_type: str):
        if model_type not in _BUILT:
            hf = tiny_hf(model_type)
            d = tmp_path_factory.mktemp(model_type)
            hf.save_pretrained(d)
            _BUILT[model_type] = (hf, d)
        return _BUILT[model_type]

    yield get
    _BUILT.clear()


def cache_bytes(past) -> int:
    """Bytes of every tensor transformers' cache holds (each storage once)."""
    seen, total = set(), 0
    for layer in past.layers:
        for v in vars(layer).values():
            if isinstance(v, torch.Tensor) and v.numel():
                key = v.untyped_storage().data_ptr()
                if key not in seen:
                    seen.add(key)
                    total += v.untyped_storage().nbytes()
    return total


def ids_of(T: int, seed: int = 7) -> torch.Tensor:
    return torch.randint(3, 128, (1, T), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("model_type", list(TINY))
def test_logits_equal_transformers(model_type, saved):
    hf, folder = saved(model_type)
    ours = load(folder)
    ids = ids_of(21)
    with torch.no_grad():
        ref = hf(ids).logits
        got, _ = ours(ids)
    assert_close(got, ref, atol=1e-5 * ref.abs().max().item(), what=f"{model_type} logits")
    # chunked prefill then one token at a time equals one pass
    with torch.no_grad():
        cache, parts = None, []
        for a, b in ((0, 5), (5, 13), (13, 14), (14, 21)):
            out, cache = ours(ids[:, a:b], cache)
            parts.append(out)
    assert_close(torch.cat(parts, 1), got, atol=1e-5 * ref.abs().max().item(), what=f"{model_type} chunked")


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
    assert (got - ref).abs().max().item() <= 0.05 * scale, f"{model_type}: bf16 logits differ"


@pytest.mark.parametrize("model_type", list(TINY))
@pytest.mark.parametrize("T", [4, 6, 17])
def test_memory_equals_transformers_cache(model_type, T, saved):
    """``engine="transformers"`` at T tokens (fp32) equals the bytes of transformers' cache after a prefill of T
    (windows of 6: not filled at 4, filled at 6 and 17)."""
    from storelab.models.engines import state_bytes

    hf, folder = saved(model_type)
    cfg = read_model_config(folder)
    with torch.no_grad():
        past = hf(ids_of(T), use_cache=True).past_key_values
    assert sum(state_bytes(cfg, T, engine="transformers", dtype="fp32").values()) == cache_bytes(past)


@pytest.mark.parametrize("model_type", list(TINY))
def test_config_counts_equal_transformers(model_type, saved):
    """Parameters from config.json alone equal the numbers the transformers model saves (its parameters and
    the routing bias it keeps as a buffer; each tensor once)."""
    from storelab.models.accounting import count_params

    hf, folder = saved(model_type)
    cfg = read_model_config(folder / "config.json")
    held = {t.data_ptr(): t.numel() for t in hf.state_dict().values() if t.dtype.is_floating_point}
    assert count_params(cfg).stored == sum(held.values())
