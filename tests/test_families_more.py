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
    # Ministral 3: YaRN, and a pretraining length of 8 so that positions 8-20 get the query temperature
    "ministral3": ("ministral3", dict(COMMON, head_dim=16, rope_parameters=dict(
        rope_type="yarn", rope_theta=1000000.0, factor=4.0, original_max_position_embeddings=8, beta_fast=32.0,
        beta_slow=1.0, mscale_all_dim=1.0, mscale=1.0, llama_4_scaling_beta=0.5))),
    "ministral3_window": ("ministral3", dict(COMMON, head_dim=16, sliding_window=6, rope_parameters=dict(
        rope_type="default", rope_theta=10000.0, llama_4_scaling_beta=0.0, original_max_position_embeddings=16))),
    "cohere": ("cohere", dict(COMMON, attention_bias=True, logit_scale=0.5)),
    "internlm3": ("internlm3", dict(COMMON, head_dim=16, attention_bias=True, mlp_bias=True)),
    "iquestcoder": ("iquestcoder", dict(COMMON, head_dim=16)),
    "ernie4_5": ("ernie4_5", dict(COMMON, head_dim=16)),
    "gpt_neox": ("gpt_neox", dict(COMMON, num_key_value_heads=None)),
    "gpt_neox_sequential": ("gpt_neox", dict(COMMON, num_key_value_heads=None, use_parallel_residual=False,
                                             attention_bias=False, rope_parameters=dict(
                                                 rope_type="default", rope_theta=500.0, partial_rotary_factor=0.5))),
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


def test_ministral3_temperature_read(saved):
    """beta and the pretraining length from rope_parameters; Ministral counts the position from 0."""
    a = read_model_config(saved("ministral3")[1]).layers[0].token
    assert (a.attn_temperature_tuning, a.floor_scale, a.attn_temperature_scale, a.floor_offset) == (True, 8, 0.5, 0)
    assert a.rope_scaling["rope_type"] == "yarn"


def test_cohere_qk_norm_refused(tmp_path):
    import json

    from storelab.checkpoint.shards import CheckpointError

    (tmp_path / "config.json").write_text(json.dumps(dict(COMMON, model_type="cohere", use_qk_norm=True)))
    with pytest.raises(CheckpointError, match=r"use_qk_norm: true is not supported"):
        read_model_config(tmp_path)


# image-text wrappers: transformers' model built whole (a one-block vision tower), the text model compared
VISION = dict(depth=1, hidden_size=32, intermediate_size=32, num_heads=2, out_hidden_size=64,
              deepstack_visual_indexes=[0])
WRAPPED = {
    "qwen3_vl": dict(COMMON, head_dim=16),
    "qwen3_vl_moe": dict(COMMON, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=24),
}


@pytest.fixture(scope="module")
def wrapped(tmp_path_factory):
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    built = {}

    def get(name):
        if name not in built:
            torch.manual_seed(0)
            cfg = AutoConfig.for_model(name, text_config=WRAPPED[name], vision_config=VISION)
            hf = AutoModelForImageTextToText.from_config(cfg).eval()
            g = torch.Generator().manual_seed(1)
            with torch.no_grad():
                for t in hf.state_dict().values():
                    if t.dtype.is_floating_point and (t.dim() == 1 or bool((t == t.flatten()[0]).all())):
                        t.add_(0.3 * torch.randn(t.shape, generator=g))
            d = tmp_path_factory.mktemp(name)
            hf.save_pretrained(d)
            built[name] = (hf, d)
        return built[name]

    return get


@pytest.mark.parametrize("name", list(WRAPPED))
def test_wrapped_text_equals_transformers(name, wrapped):
    hf, folder = wrapped(name)
    check_logits(hf, folder, what=name, splits=SPLITS_A)
    check_bf16(hf, folder, what=name)
    check_cache(hf, folder, 17)
    check_counts(hf, folder, leave_out=("visual",))


def test_qwen3_vl_moe_published_expert_layout(wrapped, tmp_path):
    """The published files' experts ([E, D, 2I], [E, I, D]) read to the same model as transformers' own save."""
    import shutil

    from safetensors.torch import load_file, save_file

    hf, folder = wrapped("qwen3_vl_moe")
    for f in folder.iterdir():
        shutil.copy(f, tmp_path / f.name)
    state = load_file(tmp_path / "model.safetensors")
    turned = {k: v.transpose(1, 2).contiguous() if ".mlp.experts." in k else v for k, v in state.items()}
    assert any(turned[k].shape != v.shape for k, v in state.items())
    save_file(turned, tmp_path / "model.safetensors", metadata={"format": "pt"})
    import torch

    from storelab.checkpoint import load
    from tests.family_harness import ids_of

    ids = ids_of(9)
    with torch.no_grad():  # the same as the file transformers wrote (whose model other tests cast to bf16 and back)
        assert torch.equal(load(tmp_path)(ids)[0], load(folder)(ids)[0])
