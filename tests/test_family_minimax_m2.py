"""MiniMax-M2 (``storelab/checkpoint/families/minimax_m2.py``) against transformers 5.23's tiny ``minimax_m2``
saved with ``save_pretrained`` (which writes the release's names: ``block_sparse_moe``, per-expert
``w1/w3/w2``, ``block_sparse_moe.e_score_correction_bias``): the config read (q/k norms over all heads,
``rotary_dim`` as the rotated fraction, sigmoid routing with the choice bias), logits equal in fp32 (1e-5 of
the logits' scale) and bf16 (5 %), chunked prefill + steps equal to one pass, transformers' cache bytes
after a prefill, parameters from config.json equal to the saved tensors; the published MiniMax-M2.7 config
against the model card (230B total, 10B active, as rounded there); the fields it refuses, named.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from storelab.checkpoint.config_only import read_model_config
from storelab.checkpoint.families.minimax_m2 import FAMILY
from storelab.checkpoint.shards import CheckpointError
from storelab.models.accounting import count_params
from tests.family_harness import check_bf16, check_cache, check_counts, check_logits, saved_fixture

FIXTURES = Path(__file__).parent / "fixtures" / "configs"
MODEL_TYPE = "minimax_m2"
COMMON = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              vocab_size=128, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, rotary_dim=8,
              max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)
TINY = {"minimax_m2": COMMON}


def test_config_read(saved):
    hf, folder = saved("minimax_m2")
    cfg = read_model_config(folder)
    att, ch = cfg.layers[0].token, cfg.layers[0].channel
    assert att.KIND == "attention" and att.qk_norm and att.qk_norm_scope == "all"
    assert att.partial_rotary == 0.5 and not (att.qkv_bias or att.out_bias) and att.rope_theta == 5e6
    assert (ch.KIND, ch.router, ch.router_bias, ch.norm_topk_prob) == ("moe", "sigmoid", True, True)
    assert (ch.n_experts, ch.top_k, ch.d_expert, ch.shared_width) == (4, 2, 32, 0)
    assert all(lay.channel.KIND == "moe" for lay in cfg.layers)


def test_release_fields_read_and_refused():
    """The release's own fields: ``rotary_dim`` (no rope_parameters), ``use_routing_bias``, ``use_qk_norm``;
    lightning-attention layers and a shared expert refused naming the field."""
    hf = json.loads((FIXTURES / "MiniMax-M2.7.json").read_text())
    cfg = FAMILY.to_config(dict(hf, use_routing_bias=False, use_qk_norm=False))
    assert not cfg.layers[0].channel.router_bias and not cfg.layers[0].token.qk_norm
    assert cfg.layers[0].token.partial_rotary == 64 / 128
    with pytest.raises(CheckpointError, match=r"attn_type_list\[3\]"):
        FAMILY.to_config(dict(hf, attn_type_list=[1, 1, 1, 0] + [1] * 58))
    with pytest.raises(CheckpointError, match="shared_intermediate_size"):
        FAMILY.to_config(dict(hf, shared_intermediate_size=1536))


def test_mtp_modules_ignored():
    hf = json.loads((FIXTURES / "MiniMax-M2.7.json").read_text())
    import re

    pats = FAMILY.ignored(hf)
    assert any(re.search(p, "model.layers.62.mlp.gate.weight") for p in pats)
    assert any(re.search(p, "model.mtp.layers.0.self_attn.q_proj.weight") for p in pats)
    assert not any(re.search(p, "model.layers.61.block_sparse_moe.gate.weight") for p in pats)


def test_published_counts():
    """MiniMax-M2's card: 230B total, 10B active; ours 228.69B and 10.42B active beside the input embedding
    (a lookup, not read as weights), which round to the card's figures."""
    hf = json.loads((FIXTURES / "MiniMax-M2.7.json").read_text())
    pa = count_params(read_model_config(FIXTURES / "MiniMax-M2.7.json"))
    assert round(pa.stored / 1e10) * 10 == 230 and abs(pa.stored / 1e9 - 230) <= 0.015 * 230
    assert round((pa.active - hf["vocab_size"] * hf["hidden_size"]) / 1e9) == 10


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


