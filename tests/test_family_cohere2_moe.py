"""Cohere's mixture-of-experts Command models (``storelab/checkpoint/families/cohere2_moe.py``).

Against transformers 5.23's tiny ``cohere2_moe`` models saved with ``save_pretrained``: a parallel block with
LayerNorms or RMSNorms, local layers rotating interleaved pairs, global ones without positions except the dense
prefix layers transformers forces to rotate, softmax or sigmoid routing on the chosen logits, shared experts
averaged with (the default) or added to the routed ones; logits equal in fp32 and bf16, chunked prefill + steps
equal to one pass, transformers' cache bytes after a prefill, parameters from config.json alone equal to the saved
tensors, malformed choices refused naming the field.
"""

from __future__ import annotations

import json

import pytest

from storelab.checkpoint import CheckpointError
from storelab.checkpoint.config_only import read_model_config
from storelab.models.accounting import count_params
from tests.family_harness import check_bf16, check_cache, check_counts, check_logits, saved_fixture

COMMON = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              vocab_size=128, intermediate_size=24, num_experts=6, num_experts_per_tok=2, sliding_window=6,
              max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)
# "average": transformers' defaults (softmax, averaged shared expert, LayerNorms), one dense prefix layer that rotates
# though global, a wider prefix MLP, biases, a logit scale that shows;
# "sum": sigmoid routing without renormalising, two shared experts added, RMSNorms, layer lists given, untied;
# "prefix2": two dense prefix layers with their own period 2 (the global one stays without positions), no shared
TINY = {
    "average": dict(COMMON, first_k_dense_replace=1, prefix_dense_intermediate_size=48, num_shared_experts=1,
                    logit_scale=0.5, attention_bias=True),
    "sum": dict(COMMON, expert_selection_fn="sigmoid", norm_topk_prob=False, num_shared_experts=2,
                shared_expert_combination_strategy="sum", rms_norm_eps=1e-6, tie_word_embeddings=False,
                layer_types=["sliding_attention", "full_attention", "full_attention", "sliding_attention"],
                mlp_layer_types=["dense", "dense", "sparse", "sparse"]),
    "prefix2": dict(COMMON, first_k_dense_replace=2, prefix_dense_sliding_window_pattern=2, sliding_window_pattern=2),
}

saved = saved_fixture(TINY, lambda name: "cohere2_moe", perturb=0.3)


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


@pytest.mark.parametrize("name, kinds, rotates, mlp", [
    ("average", ["attention", "window", "window", "window"], [1, 1, 1, 1], ["ffn", "moe", "moe", "moe"]),
    ("sum", ["window", "attention", "attention", "window"], [1, 1, 0, 1], ["ffn", "ffn", "moe", "moe"]),
    ("prefix2", ["window", "attention", "window", "attention"], [1, 0, 1, 0], ["ffn", "ffn", "moe", "moe"]),
])
def test_config_read(name, kinds, rotates, mlp, saved):
    """Layer kinds, which global layers rotate (transformers' force_rope), the channels, the norm kind, the
    routing and the averaging folded into routed_scaling."""
    hf, folder = saved(name)
    cfg = read_model_config(folder)
    toks = [lay.token for lay in cfg.layers]
    assert [a.KIND for a in toks] == kinds
    assert [a.partial_rotary for a in toks] == [float(r) for r in rotates]
    assert all(a.rope_interleaved and a.head_dim == 16 for a in toks)
    assert [lay.channel.KIND for lay in cfg.layers] == mlp and {lay.norms for lay in cfg.layers} == {"parallel"}
    assert cfg.norm_kind == ("rms" if name == "sum" else "layer")
    moe = cfg.layers[2].channel
    if name == "average":
        assert cfg.layers[0].channel.d_ff == 48 and moe.routed_scaling == 0.5 and moe.shared_width == 24
        assert moe.router == "softmax" and moe.norm_topk_prob and cfg.logit_scale == 0.5
    if name == "sum":
        assert moe.router == "sigmoid" and not moe.norm_topk_prob and moe.routed_scaling == 1.0
        assert moe.shared_width == 48 and not cfg.tie_embeddings


def test_default_head_dim(tmp_path):
    """``Cohere2MoeConfig``'s head_dim is 128 when the file is silent (not hidden_size / heads); the counts follow."""
    hf = dict(COMMON, model_type="cohere2_moe")
    del hf["head_dim"]
    (tmp_path / "config.json").write_text(json.dumps(hf))
    cfg = read_model_config(tmp_path)
    assert {lay.token.head_dim for lay in cfg.layers} == {128}
    D, H, G, K, E, I = 64, 4, 2, 128, 6, 24
    layer = D * (H + 2 * G) * K + H * K * D + E * D + 3 * E * D * I + D
    assert count_params(cfg).stored == 4 * layer + D + 128 * D


@pytest.mark.parametrize("field, value", [("expert_selection_fn", "softplus"),
                                          ("shared_expert_combination_strategy", "max")])
def test_refused_naming_the_field(field, value, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(COMMON, model_type="cohere2_moe", **{field: value})))
    with pytest.raises(CheckpointError, match=field):
        read_model_config(tmp_path)
