"""Gemma 4 (``storelab/checkpoint/families/gemma4.py``) and the devices it added: attention values read from the
keys (``values_from_keys``) and the weightless value norm (``v_norm``), proportional RoPE, the saved layer
scalar (``ResidualConfig.layer_scalar``) and the MLP beside experts (the ``mlp_experts`` store).

Against transformers 5.23's tiny ``gemma4_text`` models saved with ``save_pretrained``: the dense layout with
``attention_k_eq_v`` (the 31B's) and the MoE block (the 26B-A4B's), logits equal in fp32 and bf16, chunked
prefill + steps equal to one pass, transformers' cache bytes after a prefill, parameters from config.json alone
equal to the saved tensors. The published 26B-A4B config reads to Google's 25.2B total / 3.8B active; the
E2B / E4B devices are refused naming their field.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from storelab.checkpoint import CheckpointError
from storelab.checkpoint.config_only import read_model_config
from storelab.models.accounting import count_params
from storelab.ops.rope import rope_frequencies
from tests.family_harness import check_bf16, check_cache, check_counts, check_logits, saved_fixture

FIXTURE = Path(__file__).parent / "fixtures" / "configs" / "gemma-4-26B-A4B.json"
COMMON = dict(hidden_size=64, num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              global_head_dim=32, vocab_size=128, intermediate_size=96, hidden_size_per_layer_input=0,
              sliding_window=6, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0,
              layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention",
                           "full_attention"])
TINY = {
    # the 31B's devices: global layers of their own head size, one KV head whose values are its keys
    "dense_k_eq_v": dict(COMMON, attention_k_eq_v=True, num_global_key_value_heads=1, final_logit_softcapping=30.0),
    # the 26B-A4B's: the MLP beside 8 experts, two per token; untied; no soft cap
    "moe": dict(COMMON, enable_moe_block=True, num_experts=8, top_k_experts=2, moe_intermediate_size=24,
                tie_word_embeddings=False),
    # every expert read by every token: in bf16 the top-2 model's choices differ from transformers' on a near tie
    # (1 token of 13 at layer 3, measured), which moves that token's stream by a whole expert and is an error of
    # neither; with no choice to make, bf16 compares the rest of the block (router weights, scales, norms)
    "moe_all_experts": dict(COMMON, enable_moe_block=True, num_experts=4, top_k_experts=4, moe_intermediate_size=24),
}

saved = saved_fixture(TINY, lambda name: "gemma4_text")


@pytest.mark.parametrize("name", list(TINY))
def test_logits_equal_transformers(name, saved):
    check_logits(*saved(name), what=name)


@pytest.mark.parametrize("name", ["dense_k_eq_v", "moe_all_experts"])
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
    hf, folder = saved("dense_k_eq_v")
    cfg = read_model_config(folder)
    toks = [lay.token for lay in cfg.layers]
    assert [a.KIND for a in toks] == ["window", "window", "attention", "window", "attention"]
    glob, loc = toks[2], toks[0]
    assert (glob.head_dim, glob.n_kv_heads, glob.values_from_keys) == (32, 1, True)
    assert (loc.head_dim, loc.n_kv_heads, loc.values_from_keys, loc.window) == (16, 2, False, 5)
    assert all(a.v_norm and a.attn_scale == 1.0 and a.qk_norm for a in toks)
    assert glob.rope_scaling["rope_type"] == "proportional" and loc.rope_scaling is None
    assert cfg.logit_softcap == 30.0 and cfg.tie_embeddings
    assert all(lay.depth.layer_scalar and lay.norms == "sandwich" for lay in cfg.layers)


def test_proportional_rope_frequencies():
    """transformers' proportional RoPE: full RoPE's frequencies on the first p K / 2 pairs, zero on the rest."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers import AutoConfig

    cfg = AutoConfig.for_model("gemma4_text", **TINY["dense_k_eq_v"])
    theirs, _ = ROPE_INIT_FUNCTIONS["proportional"](cfg, None, layer_type="full_attention")
    ours, att = rope_frequencies(32, 1_000_000.0, {"rope_type": "proportional", "partial_rotary_factor": 0.25})
    assert att == 1.0 and torch.equal(ours, theirs)
    assert int((ours > 0).sum()) == 4 and not ours[4:].any()


def test_published_26b_a4b():
    """Google's model card: 25.2B total parameters, 3.8B active (with embeddings)."""
    cfg = read_model_config(FIXTURE)
    pa = count_params(cfg)
    assert abs(pa.stored / 1e9 - 25.2) <= 0.01 * 25.2, pa.stored
    assert abs(pa.active / 1e9 - 3.8) <= 0.02 * 3.8, pa.active
    assert {lay.channel.KIND for lay in cfg.layers} == {"mlp_experts"}
    glob = [lay.token for lay in cfg.layers if lay.token.KIND == "attention"]
    assert len(glob) == 5 and all(a.values_from_keys and a.n_kv_heads == 2 and a.head_dim == 512 for a in glob)


@pytest.mark.parametrize("field, value", [("hidden_size_per_layer_input", 256), ("num_kv_shared_layers", 2),
                                          ("use_bidirectional_attention", "all")])
def test_devices_without_a_store_refused_by_name(field, value, tmp_path):
    hf = json.loads(FIXTURE.read_text())
    hf["text_config"][field] = value
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(CheckpointError, match=f"text_config.{field}"):
        read_model_config(tmp_path)


def test_default_per_layer_inputs_refused(tmp_path):
    """transformers' default hidden_size_per_layer_input is 256 (the E2B / E4B device): a file that leaves it out
    is refused naming it, not read as if it were 0."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gemma4_text", "hidden_size": 64}))
    with pytest.raises(CheckpointError, match="hidden_size_per_layer_input"):
        read_model_config(tmp_path)


# Gemma 4 31B's text_config as published (the fields an engine's Gemma 4 parser test quotes from google/gemma-4-31B;
# null hidden_size_per_layer_input is "no per-layer inputs", as transformers tests it for truth)
TEXT_31B = dict(model_type="gemma4_text", hidden_size=5376, num_hidden_layers=60, intermediate_size=21504,
                num_attention_heads=32, num_key_value_heads=16, num_global_key_value_heads=4, head_dim=256,
                global_head_dim=512, vocab_size=262144, rms_norm_eps=1e-6, max_position_embeddings=131072,
                sliding_window=1024, final_logit_softcapping=30.0, use_double_wide_mlp=False, num_kv_shared_layers=0,
                hidden_size_per_layer_input=None, attention_k_eq_v=True, tie_word_embeddings=True,
                layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 10,
                rope_parameters={"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1000000.0,
                                                    "rope_type": "proportional"},
                                 "sliding_attention": {"rope_theta": 10000.0, "rope_type": "default"}})


def test_31b_dense(tmp_path):
    """Google's model card: 30.7B parameters. Its KV cache per token in bf16: 50 local layers of 16 heads x 256 and 10
    global ones of 4 heads x 512, keys and values each (values are stored although they are the keys' projection), plus
    transformers' 8-byte window tensor per sliding layer."""
    from storelab.models.engines import state_bytes

    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["Gemma4ForConditionalGeneration"],
                                                      "model_type": "gemma4", "text_config": TEXT_31B}))
    cfg = read_model_config(tmp_path)
    assert abs(count_params(cfg).stored / 1e9 - 30.7) <= 0.01 * 30.7
    per_token = (50 * 16 * 256 + 10 * 4 * 512) * 2 * 2
    T = 512  # inside the window: every layer keeps every token
    sliding = 50 * 8  # each sliding layer's int64 window tensor in transformers' cache
    assert sum(state_bytes(cfg, T, engine="transformers", dtype="bf16").values()) == per_token * T + sliding
