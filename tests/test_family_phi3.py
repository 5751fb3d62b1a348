"""The Phi-3 family (``storelab/checkpoint/families/phi3.py``) against transformers 5.23's tiny ``phi3``
models saved with ``save_pretrained``, plain (Phi-3-mini's shape without its window) and with a window on
every layer, three quarters of each head rotated and tied embeddings (Phi-4-mini's settings): the config
read, the fused ``qkv_proj`` and ``gate_up_proj`` split, logits equal in fp32 (1e-5 of the logits' scale)
and bf16 (5 %), chunked prefill + steps equal to one pass, transformers' cache bytes after a prefill
(windows filled and not), parameters from config.json alone equal to the saved tensors.
"""

from __future__ import annotations

import pytest
import torch

from storelab.checkpoint import load
from storelab.checkpoint.config_only import read_model_config
from tests.family_harness import check_bf16, check_cache, check_counts, check_logits, saved_fixture

SPLITS_A = ((0, 2), (2, 11), (11, 12), (12, 13), (13, 21))  # single tokens between chunks

COMMON = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
              intermediate_size=96, bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=512)
TINY = {
    "phi3": dict(COMMON),
    "phi3_window": dict(COMMON, sliding_window=6, tie_word_embeddings=True,
                        rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.75)),
}


saved = saved_fixture(TINY, lambda name: "phi3", perturb=0.3)


@pytest.mark.parametrize("name", list(TINY))
def test_logits_equal_transformers(name, saved):
    check_logits(*saved(name), what=name, splits=SPLITS_A)


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


@pytest.mark.parametrize("model_type", list(TINY))
def test_config_read(model_type, saved):
    """A window (one less than sliding_window) on every layer where the file gives one; the rotated fraction."""
    hf, folder = saved(model_type)
    cfg = read_model_config(folder)
    toks = [lay.token for lay in cfg.layers]
    if model_type == "phi3":
        assert {(a.KIND, a.partial_rotary) for a in toks} == {("attention", 1.0)} and not cfg.tie_embeddings
    else:
        assert {(a.KIND, a.window, a.partial_rotary) for a in toks} == {("window", 5, 0.75)} and cfg.tie_embeddings
    assert {(a.qkv_bias, a.out_bias) for a in toks} == {(False, False)}


def test_longrope_read_but_not_run(tmp_path, saved):
    """The 128k releases' ``longrope`` scaling: the config is read (accounting), loading the weights refuses it
    naming the field."""
    import json
    import shutil

    from storelab.checkpoint.shards import CheckpointError

    _, folder = saved("phi3")
    shutil.copytree(folder, tmp_path / "long")
    hf = json.loads((folder / "config.json").read_text())
    hf.pop("rope_parameters", None)
    long = dict(type="longrope", long_factor=[1.0] * 4, short_factor=[1.0] * 4)
    (tmp_path / "long" / "config.json").write_text(json.dumps(dict(hf, rope_theta=10000.0, rope_scaling=long)))
    assert read_model_config(tmp_path / "long").n_layers == 4
    with pytest.raises(CheckpointError, match=r"rope_scaling.rope_type: 'longrope'"):
        load(tmp_path / "long")
