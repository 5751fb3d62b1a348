"""The state-space families (``storelab/checkpoint/families/mamba.py``, ``nemotron_h.py``) against
transformers 5.23's tiny models: config read, logits equal (fp32 and bf16), chunked prefill equal to one
pass, parameters from config.json alone equal to the saved tensors."""

from __future__ import annotations

import pytest
import torch

from storelab.checkpoint import load
from storelab.checkpoint.config_only import read_model_config
from tests.helpers import assert_close
from tests.test_families import ids_of

COMMON = dict(hidden_size=64, num_hidden_layers=3, vocab_size=128, bos_token_id=1, eos_token_id=2, pad_token_id=0)
TINY = {
    "mamba": dict(COMMON, state_size=8, intermediate_size=96, time_step_rank=8, conv_kernel=4),
    "falcon_mamba": dict(COMMON, state_size=8, intermediate_size=96, time_step_rank=8, conv_kernel=4),
    "mamba2": dict(COMMON, num_heads=8, head_dim=16, state_size=8, n_groups=2, expand=2, conv_kernel=4,
                   chunk_size=8),
    "nemotron_h": dict(COMMON, num_hidden_layers=6, layers_block_type=["linear_attention", "mlp", "full_attention", "mlp", "linear_attention",
                                                                       "linear_attention"],
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96,
                       mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=8, n_groups=2, conv_kernel=4,
                       chunk_size=8),
    # Nemotron 3: ReLU^2 experts with sigmoid routing and a shared expert, one with a latent projection (Super)
    "nemotron_h_moe": dict(COMMON, num_hidden_layers=6, layers_block_type=["linear_attention", "moe",
                                                                           "full_attention", "moe",
                                                                           "linear_attention", "mlp"],
                           num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96,
                           mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=8, n_groups=2, conv_kernel=4,
                           chunk_size=8, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                           moe_shared_expert_intermediate_size=48, n_group=2, topk_group=1, routed_scaling_factor=2.5),
    "nemotron_h_latent": dict(COMMON, num_hidden_layers=4, layers_block_type=["linear_attention", "moe",
                                                                              "full_attention", "moe"],
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=96,
                              mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=8, n_groups=2, conv_kernel=4,
                              chunk_size=8, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                              moe_shared_expert_intermediate_size=48, moe_latent_size=32),
}
TYPE = {"nemotron_h_moe": "nemotron_h", "nemotron_h_latent": "nemotron_h"}


def tiny_hf(model_type: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(TYPE.get(model_type, model_type),
                                                               **TINY[model_type])).eval()
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
        cache, parts = None, []
        for a, b in ((0, 5), (5, 13), (13, 14), (14, 21)):
            out, cache = ours(ids[:, a:b], cache)
            parts.append(out)
    assert_close(torch.cat(parts, 1), got, atol=tol, what=f"{model_type} chunked")
    with torch.no_grad():
        ref16 = hf.to(torch.bfloat16)(ids).logits.float()
        hf.to(torch.float32)
        got16 = load(folder, dtype="bf16")(ids)[0].float()
    assert (got16 - ref16).abs().max().item() <= 0.05 * ref16.abs().max().item(), f"{model_type}: bf16 logits"


@pytest.mark.parametrize("model_type", list(TINY))
def test_config_counts_equal_transformers(model_type, saved):
    from storelab.models.accounting import count_params

    hf, folder = saved(model_type)
    held = {t.data_ptr(): t.numel() for t in hf.state_dict().values() if t.dtype.is_floating_point}
    assert count_params(read_model_config(folder)).stored == sum(held.values())
