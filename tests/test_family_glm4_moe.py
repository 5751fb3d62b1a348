"""GLM-4.5 (``storelab/checkpoint/families/glm4_moe.py``) against transformers 5.23's tiny ``glm4_moe`` saved
with ``save_pretrained``: the config read (half-rotary heads, q/k/v biases without an o bias, per-head q/k
norms where ``use_qk_norm``, one dense layer, sigmoid experts chosen with the choice bias among the best of
two groups, a shared expert, the routed scaling), logits equal in fp32 (1e-5 of the logits' scale) and bf16
(5 %), chunked prefill + steps equal to one pass, transformers' cache bytes after a prefill, parameters from
config.json equal to the saved tensors, and the MTP layers stored after the decoder ignored.
"""

from __future__ import annotations

import re

import pytest
import torch

from storelab.checkpoint.config_only import read_model_config
from storelab.checkpoint.families.glm4_moe import FAMILY
from tests.family_harness import check_bf16, check_cache, check_counts, check_logits, saved_fixture

MODEL_TYPE = "glm4_moe"
COMMON = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              vocab_size=128, intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8,
              num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1, n_shared_experts=1,
              routed_scaling_factor=2.5, attention_bias=True, max_position_embeddings=512, bos_token_id=1,
              eos_token_id=2, pad_token_id=0)
TINY = {"glm4_moe": dict(COMMON, use_qk_norm=True)}


def test_config_read(saved):
    hf, folder = saved("glm4_moe")
    cfg = read_model_config(folder)
    att = cfg.layers[0].token
    assert att.partial_rotary == 0.5 and att.qk_norm and att.qk_norm_scope == "head"
    assert att.qkv_bias and not att.out_bias
    assert [lay.channel.KIND for lay in cfg.layers] == ["ffn", "moe", "moe"] and cfg.layers[0].channel.d_ff == 96
    ch = cfg.layers[1].channel
    assert (ch.router, ch.router_bias, ch.norm_topk_prob, ch.routed_scaling) == ("sigmoid", True, True, 2.5)
    assert (ch.n_experts, ch.top_k, ch.d_expert, ch.n_group, ch.topk_group, ch.shared_width) == (8, 2, 32, 2, 1, 32)


def test_qk_norm_and_rotary_as_configured():
    """``use_qk_norm`` false: no norms; a config without ``partial_rotary_factor`` rotates half (GLM's default)."""
    hf = dict(COMMON, model_type="glm4_moe", use_qk_norm=False, rope_theta=1e6)
    cfg = FAMILY.to_config(hf)
    assert not cfg.layers[0].token.qk_norm and cfg.layers[0].token.partial_rotary == 0.5
    assert FAMILY.to_config(dict(hf, partial_rotary_factor=1.0)).layers[0].token.partial_rotary == 1.0


def test_mtp_layers_ignored():
    pats = FAMILY.ignored(dict(COMMON, model_type="glm4_moe"))
    assert any(re.search(p, "model.layers.3.eh_proj.weight") for p in pats)
    assert not any(re.search(p, "model.layers.2.mlp.gate.weight") for p in pats)


saved = saved_fixture(TINY, lambda name: MODEL_TYPE, perturb=0.1)


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


