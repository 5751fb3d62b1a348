"""Laguna (``storelab/checkpoint/families/laguna.py``) and the softplus output gate it needs
(``AttentionConfig.gate_activation``).

Against transformers 5.23's tiny ``laguna`` models saved with ``save_pretrained``: per-head and per-channel gates,
query heads per layer, local and global layers with their own rotations, sigmoid-routed experts with a choice bias,
routed scaling and a shared expert; logits equal in fp32 and bf16, chunked prefill + steps equal to one pass,
transformers' cache bytes after a prefill, parameters from config.json alone equal to the saved tensors. The
published Laguna-XS.2 text fields (ai-dynamo/aiconfigurator, model_configs/poolside--Laguna-XS.2-FP8_config.json at
d063594) read to its parameter count.
"""

from __future__ import annotations

import json

import pytest

from storelab.checkpoint import CheckpointError
from storelab.checkpoint.config_only import read_model_config
from storelab.models.accounting import count_params
from tests.family_harness import check_bf16, check_cache, check_counts, check_logits, saved_fixture

COMMON = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              vocab_size=128, intermediate_size=96, moe_intermediate_size=24, shared_expert_intermediate_size=32,
              num_experts=8, num_experts_per_tok=2, sliding_window=6, max_position_embeddings=512, bos_token_id=1,
              eos_token_id=2, pad_token_id=0, moe_routed_scaling_factor=2.5,
              layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
              num_attention_heads_per_layer=[4, 6, 6, 4])
TINY = {
    "per_head": dict(COMMON, gating=True),
    "per_channel": dict(COMMON, gating="per-channel", mlp_layer_types=["dense", "sparse", "dense", "sparse"]),
}

saved = saved_fixture(TINY, lambda name: "laguna")


@pytest.mark.parametrize("name", list(TINY))
def test_logits_equal_transformers(name, saved):
    check_logits(*saved(name), what=name)


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


def test_config_read(saved):
    hf, folder = saved("per_head")
    cfg = read_model_config(folder)
    toks = [lay.token for lay in cfg.layers]
    assert [a.KIND for a in toks] == ["attention", "window", "window", "attention"]
    assert [a.n_heads for a in toks] == [4, 6, 6, 4]
    assert all(a.head_gate and not a.gate and a.gate_activation == "softplus" for a in toks)
    assert [lay.channel.KIND for lay in cfg.layers] == ["ffn", "moe", "moe", "moe"]
    moe = cfg.layers[1].channel
    assert moe.router == "sigmoid" and moe.router_bias and moe.routed_scaling == 2.5 and moe.shared_width == 32


# Laguna-XS.2's published text fields (the file's quantization_config left out: it changes no shape)
XS2 = dict(model_type="laguna", vocab_size=100352, hidden_size=2048, intermediate_size=8192, num_hidden_layers=40,
           num_attention_heads=48, num_key_value_heads=8, head_dim=128, max_position_embeddings=262144,
           attention_bias=False, rms_norm_eps=1e-06, num_experts=256, num_experts_per_tok=8, moe_intermediate_size=512,
           shared_expert_intermediate_size=512, tie_word_embeddings=False, gating=True, sliding_window=512,
           rope_parameters={"full_attention": {"rope_theta": 500000.0, "rope_type": "yarn", "factor": 64.0,
                                               "original_max_position_embeddings": 4096, "beta_slow": 1.0,
                                               "beta_fast": 64.0, "attention_factor": 1.4158883083359672,
                                               "partial_rotary_factor": 0.5},
                            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0,
                                                  "partial_rotary_factor": 1.0},
                            "original_max_position_embeddings": 4096},
           layer_types=(["full_attention"] + ["sliding_attention"] * 3) * 10, moe_apply_router_weight_on_input=False,
           partial_rotary_factor=0.5, mlp_layer_types=["dense"] + ["sparse"] * 39, moe_routed_scaling_factor=2.5,
           num_attention_heads_per_layer=[48, 64, 64, 64] * 10)


def test_published_xs2(tmp_path):
    """Hand count: per layer the attention D (H K) 2 + 2 D G K + D H + 2 K (48 or 64 heads), the first layer's MLP
    3 D I, 39 MoE layers of 256 experts 3 D 512 + router E D + bias E + shared 3 D 512, two norms each, the
    embedding and the LM head; KV cache per token 40 layers x 8 x 128 x 2 x 2 bytes (the window's cap aside)."""
    (tmp_path / "config.json").write_text(json.dumps(XS2))
    cfg = read_model_config(tmp_path)
    D, G, K, V, E = 2048, 8, 128, 100352, 256
    attn = sum(D * H * K * 2 + 2 * D * G * K + D * H + 2 * K for H in [48, 64, 64, 64] * 10)
    moe = 39 * (3 * E * D * 512 + E * D + E + 3 * D * 512)
    want = attn + 3 * D * 8192 + moe + 40 * 2 * D + D + 2 * V * D
    assert count_params(cfg).stored == want
    glob, loc = cfg.layers[0].token, cfg.layers[1].token
    assert glob.partial_rotary == 0.5 and glob.rope_scaling["rope_type"] == "yarn" and loc.window == 511


@pytest.mark.parametrize("field, value, words", [("moe_router_logit_softcapping", 30.0, "tanh cap"),
                                                 ("gating", "sometimes", "gating"),
                                                 ("num_attention_heads_per_layer", [48, 7] * 20, r"\[1\]")])
def test_refused_naming_the_field(field, value, words, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(XS2, **{field: value})))
    with pytest.raises(CheckpointError, match=words) as e:
        read_model_config(tmp_path)
    assert field in str(e.value)
