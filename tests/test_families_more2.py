"""More families moved out of ``unread.py`` for issue 36 (StarCoder2, StableLM, Gemma 1, ...) against transformers 5.23's tiny models
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
