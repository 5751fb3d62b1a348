"""The 2026 decoders of transformers 5.23 once refused as "not yet compared" (issue 36): the ones storelab reads
and the ones it refuses, each with its mechanism.

Read: Mellum 2 (``mellum.py``), Flint (``flint.py``), Hy3 (``hy_v3.py``), Youtu-LLM (``youtu.py``), Aria's text
model (``aria.py``), Cohere Compass's text model (``cohere_compass.py``) and HyperCLOVA X SEED (``granite.py``).
Against each type's tiny transformers model saved with ``save_pretrained`` (so in the layout the original
checkpoints use: Flint's ``softmax_offset``, Hy3's ``mlp.router.gate`` / ``expert_bias`` / ``shared_mlp``, Aria's
transposed ``experts.fc1`` / ``fc2``): logits equal in fp32 (with a chunked prefill then single tokens) and bf16,
transformers' cache bytes after a prefill, parameters from config.json alone equal to the saved tensors.

Refused (``unread.py``): A.X-K1, Beam, Kolibri-1, ModernBERT-decoder, NanoChat and PhiMoE, each naming its device.
"""

from __future__ import annotations

import json

import pytest

from storelab.checkpoint import CheckpointError
from storelab.checkpoint.config_only import read_model_config
from tests.family_harness import check_bf16, check_cache, check_counts, check_logits, saved_fixture

C = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
         vocab_size=128, intermediate_size=96, max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
         pad_token_id=0)
MOE = dict(moe_intermediate_size=24, num_experts=8, num_experts_per_tok=2)
LOCAL_GLOBAL = ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
TINY = {
    "hyperclovax": dict(C, residual_multiplier=0.5, embedding_multiplier=2.0, logits_scaling=0.7,
                        attention_multiplier=0.3),
    "hyperclovax_pre": dict(C, residual_multiplier=0.5, embedding_multiplier=2.0, logits_scaling=0.7,
                            use_post_norm=False),
    "mellum": dict(C, **MOE, sliding_window=6, layer_types=LOCAL_GLOBAL,
                   mlp_layer_types=["dense", "sparse", "sparse", "sparse"]),
    "flint": dict(C, **MOE, shared_expert_intermediate_size=32, sliding_window=6, mlp_only_layers=[0],
                  num_hidden_layers=6),
    "hy_v3": dict(C, **MOE, num_shared_experts=2),
    "youtu": dict(C, num_hidden_layers=3, num_key_value_heads=4, head_dim=8, kv_lora_rank=16, q_lora_rank=24,
                  qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16),
    "aria_text": dict(C, moe_num_experts=8, moe_topk=2, moe_num_shared_experts=2),
    "cohere_compass_text": dict(C, sliding_window=6, logit_scale=0.5,
                                layer_types=["sliding_attention", "full_attention"] * 2,
                                rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0,
                                                                       "mrope_section": [4, 2, 2]},
                                                 "full_attention": None}),
}


def _type(name: str) -> str:
    return name.removesuffix("_pre")


saved = saved_fixture(TINY, _type)


@pytest.mark.parametrize("name", list(TINY))
def test_logits_equal_transformers(name, saved):
    check_logits(*saved(name), what=name)


@pytest.mark.parametrize("name", list(TINY))
def test_bf16_logits(name, saved):
    check_bf16(*saved(name), what=name)


@pytest.mark.parametrize("name", list(TINY))
@pytest.mark.parametrize("T", [4, 7, 17])
def test_memory_equals_transformers_cache(name, T, saved):
    check_cache(*saved(name), T)


@pytest.mark.parametrize("name", list(TINY))
def test_config_counts_equal_transformers(name, saved):
    check_counts(*saved(name))


def test_config_read(saved):
    """What each reads: the devices that tell them apart."""
    cfg = read_model_config(saved("hyperclovax")[1])
    assert [lay.norms for lay in cfg.layers] == ["sandwich"] * 4 and cfg.logit_scale == pytest.approx(0.7)
    assert cfg.layers[0].token.attn_scale == pytest.approx(0.3)
    cfg = read_model_config(saved("hyperclovax_pre")[1])
    assert cfg.layers[0].norms == "pre" and cfg.layers[0].token.attn_scale == pytest.approx(16 ** -0.5)

    cfg = read_model_config(saved("mellum")[1])
    toks = [lay.token for lay in cfg.layers]
    assert [a.KIND for a in toks] == ["attention", "window", "window", "attention"]
    assert [a.rope_theta for a in toks] == [500000.0, 10000.0, 10000.0, 500000.0] and toks[1].window == 5
    assert [lay.channel.KIND for lay in cfg.layers] == ["ffn", "moe", "moe", "moe"]

    cfg = read_model_config(saved("flint")[1])
    toks = [lay.token for lay in cfg.layers]
    assert [a.KIND for a in toks] == ["attention", "attention", "window", "window", "window", "attention"]
    assert [a.partial_rotary for a in toks] == [0.0, 0.0, 1.0, 1.0, 1.0, 0.0] and all(a.sink for a in toks)
    moe = cfg.layers[1].channel
    assert moe.router == "sigmoid" and not moe.router_bias and moe.shared_width == 32 and not moe.shared_gate

    moe = read_model_config(saved("hy_v3")[1]).layers[1].channel
    assert moe.router_bias and moe.routed_scaling == pytest.approx(2.826) and moe.shared_width == 48

    cfg = read_model_config(saved("youtu")[1])
    assert {lay.token.KIND for lay in cfg.layers} == {"mla"} and cfg.tie_embeddings

    moe = read_model_config(saved("aria_text")[1]).layers[0].channel
    assert (moe.n_experts, moe.top_k, moe.router, moe.norm_topk_prob, moe.shared_width) == (8, 2, "softmax", True, 192)

    cfg = read_model_config(saved("cohere_compass_text")[1])
    toks = [lay.token for lay in cfg.layers]
    assert [a.partial_rotary for a in toks] == [1.0, 0.0, 1.0, 0.0] and not toks[0].rope_interleaved
    assert cfg.layers[0].norms == "parallel" and cfg.logit_scale == 0.5


def test_defaults_where_the_file_is_silent(tmp_path):
    """Flint's layer pattern and dense layers, Mellum's two rotations, Hy3's first dense layer."""
    def read(mt, **fields):
        (tmp_path / "config.json").write_text(json.dumps(dict(C, model_type=mt, **fields)))
        return read_model_config(tmp_path)

    cfg = read("flint", **MOE, shared_expert_intermediate_size=32, num_hidden_layers=8)
    assert [lay.token.KIND == "window" for lay in cfg.layers] == [False, False, True, True, True, False, True, False]
    assert [lay.channel.KIND for lay in cfg.layers][:3] == ["ffn", "ffn", "moe"] and cfg.layers[2].token.window == 512
    cfg = read("mellum", **MOE)
    assert {lay.token.rope_theta for lay in cfg.layers} == {500000.0} and {lay.channel.KIND for lay in cfg.layers} == {"moe"}
    cfg = read("hy_v3", **MOE)
    assert [lay.channel.KIND for lay in cfg.layers] == ["ffn", "moe", "moe", "moe"]
    assert cfg.layers[0].token.rope_theta == 11158840.0


@pytest.mark.parametrize("mt, field", [("hy_v3", "mlp_bias"), ("aria_text", "mlp_bias")])
def test_refused_naming_the_field(mt, field, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(C, **MOE, model_type=mt, **{field: True})))
    with pytest.raises(CheckpointError, match=field):
        read_model_config(tmp_path)


@pytest.mark.parametrize("mt, words", [("axk1", "post_mlp_layernorm"), ("beam", "depth-scaled residual"),
                                       ("kolibri1", "raw logits"), ("modernbert-decoder", "token embeddings"),
                                       ("nanochat", "weightless RMS norms"), ("phimoe", "sparsemixer")])
def test_refused_with_the_mechanism(mt, words, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(C, model_type=mt)))
    with pytest.raises(CheckpointError, match=words):
        read_model_config(tmp_path)
