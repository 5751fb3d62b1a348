"""The state-space families (``storelab/checkpoint/families/mamba.py``, ``nemotron_h.py``) against
transformers 5.23's tiny models: config read, logits equal (fp32 and bf16), chunked prefill equal to one
pass, parameters from config.json alone equal to the saved tensors."""

from __future__ import annotations

import pytest
import torch

from tests.family_harness import check_bf16, check_cache, check_counts, check_logits, saved_fixture

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


saved = saved_fixture(TINY, lambda name: TYPE.get(name, name))


@pytest.mark.parametrize("model_type", list(TINY))
def test_logits_equal_transformers(model_type, saved):
    check_logits(*saved(model_type), what=model_type)
    check_bf16(*saved(model_type), what=model_type)


@pytest.mark.parametrize("model_type", list(TINY))
def test_config_counts_equal_transformers(model_type, saved):
    check_counts(*saved(model_type))


@pytest.mark.parametrize("model_type", [m for m in TINY if m.startswith("nemotron_h")])
@pytest.mark.parametrize("T", [1, 4, 17])
def test_memory_equals_transformers_cache(model_type, T, saved):
    """``engine="transformers"`` equals the bytes of transformers' cache after a prefill of T (its recurrent layers'
    conv and SSM states are held in dicts: jamba's counter reads them). The pure Mamba models return their state
    as ``cache_params`` of another class, which this counter does not read: not measured here."""
    from tests.test_family_jamba import hybrid_cache_bytes

    check_cache(*saved(model_type), T, counter=hybrid_cache_bytes)


@pytest.mark.parametrize("model_type", list(TINY))
def test_models_command_on_the_tiny_folders(model_type, saved):
    """``storelab models --checkpoint`` on a folder whose layers leave the channel slot empty (issue 38)."""
    import json

    from typer.testing import CliRunner

    from storelab.cli import app

    _, d = saved(model_type)
    for extra in ((), ("--json",)):
        r = CliRunner().invoke(app, ["models", "--checkpoint", str(d), *extra], env={"COLUMNS": "400"})
        assert r.exit_code == 0 and r.exception is None, r.output
    rec = json.loads(r.output)
    assert "none" in json.dumps(rec) or model_type.startswith("nemotron_h")


@pytest.mark.parametrize("model_type", list(TINY))
def test_weights_only_forgetting_equals_the_loaded_model(model_type, saved):
    """``probe forgetting --weights-only`` on the state-space folders (issue 38: it asked Mamba-2 for a rule):
    each store declares what its gate reads at x = 0 (``gate_params``), and the gate read from those tensors
    alone equals the loaded model's own gate at x = 0, bit for bit."""
    from typer.testing import CliRunner

    from storelab.checkpoint import load
    from storelab.cli import app
    from storelab.probes.forgetting import rest_log_decay
    from storelab.probes.gate_weights import gate_tensors

    _, d = saved(model_type)
    gates, io = gate_tensors(d)
    model = load(d)
    assert sorted(gates) == [i for i, lay in enumerate(model.cfg.layers) if lay.token.RECURRENT]
    for i, g in gates.items():
        assert torch.equal(g, rest_log_decay(model.blocks[i].token)), f"layer {i}"
    assert not any(n.endswith(("in_proj.weight", "out_proj.weight")) for n in io["tensors"]), io["tensors"]
    r = CliRunner().invoke(app, ["probe", "forgetting", "--checkpoint", str(d), "--weights-only", "--json"])
    assert r.exit_code == 0 and r.exception is None, r.output
