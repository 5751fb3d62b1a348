"""More families moved out of ``unread.py`` for issue 36 (StarCoder2, StableLM, Gemma 1, VaultGemma, GLM-4.7-Flash,
Solar Open, K-EXAONE, FlexOlmo, Hunyuan, AFMoE, Code World Model) against transformers 5.23's tiny models
saved with ``save_pretrained``: logits equal in fp32 (1e-5 of the logits' scale) and bf16 (5 %), chunked prefill
+ steps equal to one pass, transformers' cache bytes after a prefill (windows filled and not), parameters from
config.json alone equal to the saved tensors, each built store kind one its family declares.
"""

from __future__ import annotations

import json

import pytest

from storelab.checkpoint.config_only import read_model_config
from storelab.checkpoint.shards import CheckpointError
from tests.family_harness import check_bf16, check_cache, check_counts, check_logits, saved_fixture

SPLITS_A = ((0, 2), (2, 11), (11, 12), (12, 13), (13, 21))  # single tokens between chunks

COMMON = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
              intermediate_size=48, bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=512)

# setting name -> (model_type, tiny settings)
TINY = {
    "starcoder2": ("starcoder2", dict(COMMON)),
    "starcoder2_window": ("starcoder2", dict(COMMON, sliding_window=6, use_bias=False, tie_word_embeddings=False)),
    "stablelm": ("stablelm", dict(COMMON, use_qkv_bias=True)),
    "stablelm_parallel": ("stablelm", dict(COMMON, use_parallel_residual=True, tie_word_embeddings=True,
                                           rope_parameters=dict(rope_type="default", rope_theta=500.0,
                                                                partial_rotary_factor=0.5))),
    "gemma": ("gemma", dict(COMMON, head_dim=16, hidden_act="gelu")),
    "glm4_moe_lite": ("glm4_moe_lite", dict(COMMON, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=24,
                                            qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16, n_routed_experts=4,
                                            num_experts_per_tok=2, moe_intermediate_size=24, n_shared_experts=1)),
    "vaultgemma": ("vaultgemma", dict(COMMON, head_dim=16, sliding_window=6, query_pre_attn_scalar=16)),
    "solar_open": ("solar_open", dict(COMMON, head_dim=16, n_routed_experts=4, num_experts_per_tok=2,
                                      moe_intermediate_size=24, n_shared_experts=1, routed_scaling_factor=1.5,
                                      attention_bias=True)),
    # three layers: a dense one, then experts; local, local, global (no positions)
    "exaone_moe": ("exaone_moe", dict(COMMON, num_hidden_layers=3, head_dim=16, sliding_window=6,
                                      sliding_window_pattern=3, num_experts=4, num_experts_per_tok=2,
                                      moe_intermediate_size=24, num_shared_experts=1, n_group=2, topk_group=1)),
    "flex_olmo": ("flex_olmo", dict(COMMON, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True)),
    "hunyuan_v1_dense": ("hunyuan_v1_dense", dict(COMMON, head_dim=16, attention_bias=True, rope_parameters=dict(
        rope_type="dynamic", rope_theta=10000.0, alpha=50.0, factor=1.0))),
    "hunyuan_v1_moe": ("hunyuan_v1_moe", dict(COMMON, head_dim=16, num_experts=4, moe_topk=[2, 1])),
    # three layers: dense local, experts local, experts global (no positions); muP's embedding scale
    "afmoe": ("afmoe", dict(COMMON, num_hidden_layers=3, head_dim=16, sliding_window=6, global_attn_every_n_layers=3,
                            num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24, num_shared_experts=2,
                            route_scale=1.5, mup_enabled=True)),
    # CwmConfig's default llama3 scaling, with a short pretraining length so that it shows at positions 0-20
    "cwm": ("cwm", dict(COMMON, num_hidden_layers=3, head_dim=16, sliding_window=6, mlp_bias=True, rope_parameters=dict(
        rope_type="llama3", rope_theta=1000000.0, factor=16.0, high_freq_factor=4.0, low_freq_factor=1.0,
        original_max_position_embeddings=16))),
}

saved = saved_fixture({k: v[1] for k, v in TINY.items()}, lambda name: TINY[name][0], perturb=0.3)


@pytest.mark.parametrize("name", list(TINY))
def test_logits_equal_transformers(name, saved):
    check_logits(*saved(name), what=name, splits=SPLITS_A)


@pytest.mark.parametrize("name", list(TINY))
def test_bf16_logits(name, saved):
    check_bf16(*saved(name), what=name)


@pytest.mark.parametrize("name", list(TINY))
@pytest.mark.parametrize("T", [4, 17])
def test_memory_equals_transformers_cache(name, T, saved):
    check_cache(*saved(name), T)


@pytest.mark.parametrize("name", list(TINY))
def test_config_counts_equal_transformers(name, saved):
    check_counts(*saved(name))


def _refused(tmp_path, settings: dict, match: str) -> None:
    (tmp_path / "config.json").write_text(json.dumps(settings))
    with pytest.raises(CheckpointError, match=match):
        read_model_config(tmp_path)


def test_starcoder2_read(saved):
    cfg = read_model_config(saved("starcoder2_window")[1])
    assert cfg.norm_kind == "layer_bias" and not cfg.tie_embeddings
    assert {(lay.token.KIND, lay.token.window, lay.channel.activation, lay.channel.bias) for lay in cfg.layers} == {
        ("window", 5, "gelu_tanh", False)}


def test_stablelm_read(saved):
    cfg = read_model_config(saved("stablelm_parallel")[1])
    assert cfg.norm_kind == "layer_bias" and {lay.norms for lay in cfg.layers} == {"parallel"}
    a = cfg.layers[0].token
    assert (a.partial_rotary, a.rope_theta, a.qkv_bias, a.out_bias) == (0.5, 500.0, False, False)
    assert read_model_config(saved("stablelm")[1]).layers[0].token.partial_rotary == 0.25


def test_stablelm_qk_layernorm_refused(tmp_path):
    _refused(tmp_path, dict(COMMON, model_type="stablelm", qk_layernorm=True), r"qk_layernorm: true is not supported")


def test_gemma1_read(saved):
    cfg = read_model_config(saved("gemma")[1])
    assert {(lay.norms, lay.token.KIND, lay.token.attn_scale, lay.token.softcap, lay.channel.activation)
            for lay in cfg.layers} == {("pre", "attention", None, None, "geglu_tanh")}
    assert cfg.tie_embeddings and cfg.logit_softcap is None and abs(cfg.embed_scale - 8.0) < 1e-6


def test_exaone_moe_read(saved):
    """Dense first layer, then experts with sigmoid scores and the routing bias; the global layer has no positions."""
    cfg = read_model_config(saved("exaone_moe")[1])
    assert [(lay.token.KIND, lay.token.partial_rotary, lay.channel.KIND, lay.norms) for lay in cfg.layers] == [
        ("window", 1.0, "ffn", "pre"), ("window", 1.0, "moe", "pre"), ("attention", 0.0, "moe", "pre")]
    moe = cfg.layers[1].channel
    assert (moe.router, moe.router_bias, moe.routed_scaling, moe.n_group) == ("sigmoid", True, 2.5, 2)


def test_exaone_moe_transformers_defaults(tmp_path):
    """A file without windows or MLP types gets ExaoneMoeConfig's: a 4096 window on three layers of four, the
    first layer dense."""
    (tmp_path / "config.json").write_text(json.dumps(dict(COMMON, model_type="exaone_moe", num_hidden_layers=4,
                                                          num_experts=4, num_experts_per_tok=2, head_dim=16)))
    cfg = read_model_config(tmp_path)
    assert [lay.token.KIND for lay in cfg.layers] == ["window"] * 3 + ["attention"]
    assert cfg.layers[0].token.window == 4095
    assert [lay.channel.KIND for lay in cfg.layers] == ["ffn"] + ["moe"] * 3


def test_solar_open_every_layer_sparse(tmp_path):
    """SolarOpenConfig drops first_k_dense_replace: every layer has experts, whatever the file says."""
    (tmp_path / "config.json").write_text(json.dumps(dict(COMMON, model_type="solar_open", n_routed_experts=4,
                                                          num_experts_per_tok=2, first_k_dense_replace=1)))
    cfg = read_model_config(tmp_path)
    assert {lay.channel.KIND for lay in cfg.layers} == {"moe"} and cfg.layers[0].token.head_dim == 128


def test_hunyuan_read(saved):
    """q/k norms after RoPE; a dynamic scaling with alpha is a fixed base; experts and top-k per layer."""
    a = read_model_config(saved("hunyuan_v1_dense")[1]).layers[0].token
    assert (a.qk_norm, a.qk_norm_scope, a.rope_scaling) == (True, "head_after_rope", None)
    assert abs(a.rope_theta - 10000.0 * 50.0 ** (16 / 14)) < 1e-6 * a.rope_theta
    cfg = read_model_config(saved("hunyuan_v1_moe")[1])
    assert [(lay.channel.n_experts, lay.channel.top_k, lay.channel.shared_width) for lay in cfg.layers] == [
        (4, 2, 48), (4, 1, 48)]


def test_afmoe_read(saved):
    cfg = read_model_config(saved("afmoe")[1])
    assert [(lay.token.KIND, lay.token.partial_rotary, lay.token.gate, lay.channel.KIND, lay.norms)
            for lay in cfg.layers] == [("window", 1.0, True, "ffn", "sandwich"),
                                       ("window", 1.0, True, "moe", "sandwich"),
                                       ("attention", 0.0, True, "moe", "sandwich")]
    moe = cfg.layers[1].channel
    assert (moe.router, moe.router_bias, moe.routed_scaling, moe.shared_width) == ("sigmoid", True, 1.5, 48)
    assert cfg.embed_scale == 8.0


def test_afmoe_attention_bias_refused(tmp_path):
    _refused(tmp_path, dict(COMMON, model_type="afmoe", attention_bias=True, num_experts=4, num_experts_per_tok=2),
             r"attention_bias: true is not supported")


def test_cwm_transformers_defaults(tmp_path):
    """A file without layer types, window or rope gets CwmConfig's: layers 0, 4, ... full, an 8192 window, Llama 3's
    scaling of base 1,000,000."""
    (tmp_path / "config.json").write_text(json.dumps(dict(COMMON, model_type="cwm", num_hidden_layers=5)))
    cfg = read_model_config(tmp_path)
    assert [lay.token.KIND for lay in cfg.layers] == ["attention", "window", "window", "window", "attention"]
    a = cfg.layers[1].token
    assert (a.window, a.head_dim, a.rope_theta, a.rope_scaling["rope_type"]) == (8191, 128, 1_000_000.0, "llama3")
