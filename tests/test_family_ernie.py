"""ERNIE 4.5 MoE (``storelab/checkpoint/families/ernie4_5_moe.py``) against transformers 5.23's tiny
``ernie4_5_moe`` saved with ``save_pretrained`` (the release's names: per-expert ``gate/up/down_proj``,
``mlp.moe_statics.e_score_correction_bias`` [1, E]): the config read (interleaved rope, tied embeddings,
experts placed by ``moe_layer_start_index`` / ``moe_layer_end_index`` / ``moe_layer_interval`` as
transformers places them, softmax routing with the statistics bias, shared experts), logits equal in fp32
(1e-5 of the logits' scale) and bf16 (5 %), chunked prefill + steps equal to one pass, transformers' cache
bytes after a prefill, parameters from config.json equal to the saved tensors; ``use_bias`` refused by name.
"""

from __future__ import annotations

import pytest
import torch

from storelab.checkpoint.config_only import read_model_config
from storelab.checkpoint.families.ernie4_5_moe import FAMILY
from storelab.checkpoint.shards import CheckpointError
from tests.family_harness import check_bf16, check_cache, check_counts, check_logits, saved_fixture

MODEL_TYPE = "ernie4_5_moe"
COMMON = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              vocab_size=128, intermediate_size=96, moe_intermediate_size=32, moe_num_experts=4, moe_k=2,
              moe_num_shared_experts=1, moe_layer_start_index=1, moe_layer_end_index=2,
              max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)
TINY = {"ernie4_5_moe": COMMON}


def test_config_read(saved):
    hf, folder = saved("ernie4_5_moe")
    cfg = read_model_config(folder)
    att = cfg.layers[0].token
    assert att.rope_interleaved and att.partial_rotary == 1.0 and not (att.qkv_bias or att.out_bias)
    assert cfg.tie_embeddings and att.rope_theta == hf.config.rope_parameters["rope_theta"]
    assert [lay.channel.KIND for lay in cfg.layers] == ["ffn", "moe", "moe", "ffn"]
    ch = cfg.layers[1].channel
    assert (ch.router, ch.router_bias, ch.norm_topk_prob, ch.n_experts, ch.top_k) == ("softmax", True, True, 4, 2)
    assert ch.shared_width == 32 and cfg.layers[0].channel.d_ff == 96


@pytest.mark.parametrize("start,end,every", [(0, -1, 2), (1, 5, 3), (2, -1, 1)])
def test_expert_layers_placed_as_transformers_places_them(start, end, every):
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = dict(COMMON, num_hidden_layers=7, moe_layer_start_index=start, moe_layer_end_index=end,
              moe_layer_interval=every)
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(MODEL_TYPE, **kw))
    theirs = [type(lay.mlp).__name__.endswith("SparseMoeBlock") for lay in hf.model.layers]
    ours = [lay.channel.KIND == "moe" for lay in FAMILY.to_config(dict(kw, model_type=MODEL_TYPE)).layers]
    assert ours == theirs and any(ours)


def test_mtp_tensors_ignored():
    import re

    pats = FAMILY.ignored(dict(COMMON, model_type=MODEL_TYPE))
    for name in ("model.mtp_block.0.self_attn.q_proj.weight", "model.mtp_linear_proj.0.weight",
                 "model.mtp_emb_norm.0.weight"):
        assert any(re.search(p, name) for p in pats), name
    assert not any(re.search(p, "model.layers.1.mlp.gate.weight") for p in pats)


def test_use_bias_refused():
    with pytest.raises(CheckpointError, match="use_bias"):
        FAMILY.to_config(dict(COMMON, model_type=MODEL_TYPE, use_bias=True))


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


