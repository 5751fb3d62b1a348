"""The Jamba family (``storelab/checkpoint/families/jamba.py``) against transformers 5.23's tiny ``jamba`` model
saved with ``save_pretrained`` (per-expert tensors, as the published files): the layers read (Mamba with weighted
dt/B/C norms, attention without positions at attn_layer_period/offset, experts at expert_layer_period/offset),
logits equal in fp32 (1e-5 of the logits' scale) and bf16, chunked prefill + steps equal to one pass, parameters
from config.json alone equal to the saved tensors, transformers' cache bytes after a prefill.
No published Jamba config.json was found to copy; none is invented.
"""

from __future__ import annotations

import json

import pytest

from storelab.checkpoint.config_only import read_model_config
from tests import family_harness as harness
from tests.family_harness import cache_bytes, check_counts, tiny_hf  # noqa: F401 (bamba and granite import them)

# attention at layers 1 and 3 (period 2, offset 1), experts at layers 0 and 2 (period 2, offset 0)
TINY = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
            bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=512, intermediate_size=96,
            num_experts=4, num_experts_per_tok=2, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2,
            expert_layer_offset=0, mamba_d_state=8, mamba_dt_rank=8, mamba_d_conv=4)


def hybrid_cache_bytes(past) -> int:
    """transformers' cache after a prefill: the attention layers' keys and values (``cache_bytes``) and the
    recurrent layers' ``conv_states`` and ``recurrent_states`` (dicts per layer), each storage once."""
    seen, total = set(), cache_bytes(past)
    for layer in past.layers:
        for name in ("conv_states", "recurrent_states"):
            for t in (getattr(layer, name, None) or {}).values():
                if t is not None and t.untyped_storage().data_ptr() not in seen:
                    seen.add(t.untyped_storage().data_ptr())
                    total += t.untyped_storage().nbytes()
    return total


def check_logits(hf, folder, cuts, what: str) -> None:
    """fp32 logits equal transformers' within 1e-5 of their scale; prefill in ``cuts`` pieces equals one pass."""
    harness.check_logits(hf, folder, what=what, splits=cuts)


def check_bf16(hf, folder, what: str) -> None:
    harness.check_bf16(hf, folder, what=what)


def check_memory(hf, folder, T: int) -> None:
    """``engine="transformers"`` (fp32) equals the bytes of transformers' cache after a prefill of T: a recurrent
    layer's convolution keeps W inputs there (zeros before the first), ours W - 1 (``conv_input_bytes``)."""
    harness.check_cache(hf, folder, T, counter=hybrid_cache_bytes)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    hf = tiny_hf("jamba", TINY)
    d = tmp_path_factory.mktemp("jamba")
    hf.save_pretrained(d)
    return hf, d


def test_config_read(saved):
    hf, folder = saved
    cfg = read_model_config(folder)
    assert [lay.token.KIND for lay in cfg.layers] == ["mamba", "attention", "mamba", "attention"]
    assert [lay.channel.KIND for lay in cfg.layers] == ["moe", "ffn", "moe", "ffn"]
    mamba, attn, moe = cfg.layers[0].token, cfg.layers[1].token, cfg.layers[0].channel
    assert (mamba.d_inner, mamba.d_state, mamba.dt_rank, mamba.conv_kernel) == (128, 8, 8, 4)
    assert mamba.bcdt_norm == "weighted" and mamba.bcdt_norm_eps == hf.config.rms_norm_eps
    assert attn.partial_rotary == 0.0 and (attn.n_heads, attn.n_kv_heads, attn.head_dim) == (4, 2, 16)
    assert (moe.router, moe.norm_topk_prob, moe.n_experts, moe.top_k, moe.d_expert) == ("softmax", False, 4, 2, 96)


def test_logits_equal_transformers(saved):
    check_logits(*saved, ((0, 2), (2, 9), (9, 10), (10, 11), (11, 21)), "jamba")


def test_bf16_logits(saved):
    check_bf16(*saved, "jamba")


def test_config_counts_equal_transformers(saved):
    check_counts(*saved)


@pytest.mark.parametrize("T", [1, 4, 17])
def test_memory_equals_transformers_cache(T, saved):
    check_memory(*saved, T)


def test_defaults_are_transformers(tmp_path):
    """A file with no layout fields: attention at i % 8 == 4, experts at odd layers, dt_rank ceil(D / 16)."""
    (tmp_path / "config.json").write_text(json.dumps(dict(model_type="jamba", hidden_size=64, num_hidden_layers=16,
                                                          num_attention_heads=4, num_key_value_heads=2,
                                                          vocab_size=128)))
    cfg = read_model_config(tmp_path)
    assert [i for i, lay in enumerate(cfg.layers) if lay.token.KIND == "attention"] == [4, 12]
    assert [i for i, lay in enumerate(cfg.layers) if lay.channel.KIND == "moe"] == list(range(1, 16, 2))
    assert cfg.layers[0].token.dt_rank == 4 and cfg.layers[1].channel.n_experts == 16


@pytest.mark.parametrize("change, message", [
    (dict(attn_layer_offset=2), r"attn_layer_offset: 2 must be smaller than attn_layer_period \(2\)"),
    (dict(expert_layer_period=0), r"expert_layer_period: must be an integer >= 1"),
    (dict(hidden_act="gelu"), r"hidden_act: 'gelu' is not supported"),
])
def test_refuses_naming_the_field(tmp_path, change, message):
    from storelab.checkpoint.shards import CheckpointError

    (tmp_path / "config.json").write_text(json.dumps(dict(TINY, model_type="jamba", **change)))
    with pytest.raises(CheckpointError, match=message):
        read_model_config(tmp_path)


def test_layers_block_type_list_as_written(tmp_path):
    """A file that lists its layers (``layers_block_type``) is read as written, the period fields aside."""
    kinds = ["attention", "mamba", "mamba", "attention"]
    (tmp_path / "config.json").write_text(json.dumps(dict(TINY, model_type="jamba", layers_block_type=kinds)))
    assert [lay.token.KIND for lay in read_model_config(tmp_path).layers] == kinds
    (tmp_path / "config.json").write_text(json.dumps(dict(TINY, model_type="jamba", layers_block_type=kinds[:3])))
    from storelab.checkpoint.shards import CheckpointError

    with pytest.raises(CheckpointError, match=r"layers_block_type: has 3 entries, but num_hidden_layers is 4"):
        read_model_config(tmp_path)
