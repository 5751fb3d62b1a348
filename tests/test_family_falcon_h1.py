"""Falcon-H1 (``storelab/checkpoint/families/falcon_h1.py``) and the layer slot it needs (``LayerConfig.beside``:
a second token mixer on the token mixer's input, its output added).

Against transformers 5.23's tiny ``falcon_h1`` models saved with ``save_pretrained``, every muP multiplier set to a
value that shows (folded into the weights by the table): logits equal in fp32 and bf16, chunked prefill + steps
equal to one pass (attention's cache and the Mamba-2 state carried together), transformers' cache bytes after a
prefill, parameters from config.json alone equal to the saved tensors; with the gated group norm and without.
"""

from __future__ import annotations

import json

import pytest
import torch

from storelab.checkpoint import CheckpointError
from storelab.checkpoint.config_only import read_model_config
from storelab.models.accounting import count_params
from tests.family_harness import check_bf16, check_cache, check_counts, check_logits, saved_fixture

MULTIPLIERS = dict(embedding_multiplier=1.7, lm_head_multiplier=0.6, attention_in_multiplier=0.8,
                   attention_out_multiplier=1.3, key_multiplier=0.5, ssm_in_multiplier=1.2, ssm_out_multiplier=0.7,
                   ssm_multipliers=[0.9, 1.1, 0.6, 1.4, 0.8], mlp_multipliers=[1.25, 0.75])
COMMON = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              vocab_size=128, intermediate_size=96, mamba_d_ssm=64, mamba_n_heads=8, mamba_d_head=8,
              mamba_n_groups=2, mamba_d_state=8, mamba_d_conv=4, mamba_chunk_size=8, max_position_embeddings=512,
              bos_token_id=1, eos_token_id=2, pad_token_id=0, **MULTIPLIERS)
TINY = {
    "plain": dict(COMMON),                                            # o * SiLU(z), no biases
    "gated_norm": dict(COMMON, mamba_rms_norm=True, mamba_norm_before_gate=False, tie_word_embeddings=True,
                       attention_bias=True, mlp_bias=True, mamba_proj_bias=True, projectors_bias=True),
}

saved = saved_fixture(TINY, lambda name: "falcon_h1")


def hybrid_cache_bytes(past) -> int:
    """Bytes of every tensor transformers' cache layers hold, as attributes or in their dicts (a hybrid layer keeps
    its conv and recurrent states in ``conv_states`` / ``recurrent_states``), each storage once."""
    seen, total = set(), 0
    for layer in past.layers:
        for v in vars(layer).values():
            for x in (v.values() if isinstance(v, dict) else (v,)):
                if isinstance(x, torch.Tensor) and x.numel() and x.untyped_storage().data_ptr() not in seen:
                    seen.add(x.untyped_storage().data_ptr())
                    total += x.untyped_storage().nbytes()
    return total


@pytest.mark.parametrize("name", list(TINY))
def test_logits_equal_transformers(name, saved):
    check_logits(*saved(name), what=name)


@pytest.mark.parametrize("name", list(TINY))
def test_bf16_logits(name, saved):
    check_bf16(*saved(name), what=name)


@pytest.mark.parametrize("name", list(TINY))
@pytest.mark.parametrize("T", [4, 17])
def test_memory_equals_transformers_cache(name, T, saved):
    check_cache(*saved(name), T, counter=hybrid_cache_bytes)


@pytest.mark.parametrize("name", list(TINY))
def test_config_counts_equal_transformers(name, saved):
    check_counts(*saved(name))


def test_config_read(saved):
    hf, folder = saved("gated_norm")
    cfg = read_model_config(folder)
    lay = cfg.layers[0]
    assert set(lay.stores()) == {"token", "beside", "channel"}
    assert lay.token.KIND == "attention" and lay.beside.KIND == "mamba2"
    assert (lay.beside.n_heads, lay.beside.head_dim, lay.beside.n_groups, lay.beside.norm) == (8, 8, 2, "group")
    assert not lay.beside.norm_before_gate and lay.beside.use_bias
    assert cfg.embed_scale == 1.7 and cfg.logit_scale == 0.6 and cfg.tie_embeddings


def test_counted_by_hand_at_scale(tmp_path):
    """A config of Falcon-H1-0.5B's shape (36 layers of width 1024, 2 KV heads of 64, a Mamba-2 mixer of 24 heads of
    64 with a state of 128 in one group: the cache shapes a published run of that model records), counted by hand:
    per layer the attention, the mixer (in_proj to z, x, B, C, dt; the conv over x, B, C with its bias; dt_bias,
    A_log, D; out_proj), the MLP and two norms; the final norm and one tied embedding."""
    hf = dict(model_type="falcon_h1", hidden_size=1024, num_hidden_layers=36, num_attention_heads=8,
              num_key_value_heads=2, head_dim=64, intermediate_size=2048, vocab_size=32784, mamba_d_ssm=1536,
              mamba_n_heads=24, mamba_d_head=64, mamba_n_groups=1, mamba_d_state=128, mamba_d_conv=4,
              mamba_rms_norm=False, tie_word_embeddings=True, **MULTIPLIERS)
    (tmp_path / "config.json").write_text(json.dumps(hf))
    cfg = read_model_config(tmp_path)
    D, I, V = 1024, 1536, 32784
    attn = D * 8 * 64 + 2 * D * 2 * 64 + 8 * 64 * D
    conv = I + 2 * 128
    mamba = D * (2 * I + 2 * 128 + 24) + conv * 4 + conv + 3 * 24 + I * D
    want = 36 * (attn + mamba + 3 * D * 2048 + 2 * D) + D + V * D
    assert count_params(cfg).stored == want


@pytest.mark.parametrize("change, field", [(dict(ssm_multipliers=[1.0, 2.0]), "ssm_multipliers"),
                                           (dict(mlp_multipliers=[1.0, "x"]), r"mlp_multipliers\[1\]"),
                                           (dict(mamba_proj_bias=True), "projectors_bias"),
                                           (dict(key_multiplier=0), "key_multiplier")])
def test_refused_naming_the_field(change, field, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(dict(TINY["plain"], model_type="falcon_h1", **change)))
    with pytest.raises(CheckpointError, match=field):
        read_model_config(tmp_path)


def test_native_config_keeps_the_second_mixer(saved):
    """storelab's own checkpoint format writes and reads the ``beside`` slot (``storelab save`` of a Falcon-H1)."""
    from storelab.checkpoint.families.native import config_from_json, config_to_json

    cfg = read_model_config(saved("plain")[1])
    assert config_from_json(config_to_json(cfg)) == cfg
    assert cfg.mix() == "3 full+mamba2"
