"""The smaller families added for issue 36 (Granite 3, ...) against transformers 5.23's tiny models saved with
``save_pretrained``: logits equal in fp32 (1e-5 of the logits' scale) and bf16 (5 %), chunked prefill + steps
equal to one pass, transformers' cache bytes after a prefill (windows filled and not), parameters from
config.json alone equal to the saved tensors, each built store kind one its family declares.
"""

from __future__ import annotations

import pytest

from storelab.checkpoint.config_only import read_model_config
from tests.family_harness import check_bf16, check_cache, check_counts, check_logits, saved_fixture

SPLITS_A = ((0, 2), (2, 11), (11, 12), (12, 13), (13, 21))  # single tokens between chunks

COMMON = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
              intermediate_size=48, bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=512)
MUP = dict(embedding_multiplier=3.0, attention_multiplier=0.2, residual_multiplier=0.5, logits_scaling=4.0)

# setting name -> (model_type, tiny settings)
TINY = {
    "granite": ("granite", dict(COMMON, **MUP, attention_bias=True, mlp_bias=True)),
    "granitemoe": ("granitemoe", dict(COMMON, **MUP, num_local_experts=4, num_experts_per_tok=2)),
    "granitemoeshared": ("granitemoeshared", dict(COMMON, **MUP, num_local_experts=4, num_experts_per_tok=2,
                                                  shared_intermediate_size=40)),
    "granite_swa": ("granite_swa", dict(COMMON, **MUP, num_hidden_layers=3, sliding_window=6,
                                        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                        layer_rope_theta=[10000.0, 0, 500.0])),
    "granitemoe_swa": ("granitemoe_swa", dict(COMMON, **MUP, sliding_window=6, num_local_experts=4,
                                              num_experts_per_tok=2, shared_intermediate_size=40)),
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


def test_granite_mup_read(saved):
    """muP's multipliers as the model's scales; the SWA kinds' per-layer rope base (0: no positions) and sinks."""
    cfg = read_model_config(saved("granite_swa")[1])
    assert (cfg.embed_scale, cfg.logit_scale) == (3.0, 0.25)
    a = [lay.token for lay in cfg.layers]
    assert [(x.KIND, x.partial_rotary, x.rope_theta, x.sink, x.attn_scale) for x in a] == [
        ("window", 1.0, 10000.0, True, 0.2), ("attention", 0.0, 10000.0, True, 0.2),
        ("window", 1.0, 500.0, True, 0.2)]
