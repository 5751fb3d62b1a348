"""The Granite 4.0 family (``storelab/checkpoint/families/granitemoehybrid.py``) against transformers 5.23's tiny
``granitemoehybrid`` models saved with ``save_pretrained``: one with experts, a shared MLP and RoPE, one dense
(no experts: the shared MLP alone) without positions (NoPE, the published default). The muP multipliers all differ
from 1 so that each shows: embedding_multiplier -> embed_scale, logits_scaling -> logit_scale = 1 / logits_scaling,
attention_multiplier -> attn_scale, residual_multiplier folded into the output projections at load. Logits equal in
fp32 (1e-5 of the logits' scale) and bf16, chunked prefill + steps equal to one pass, parameters from config.json
alone equal to the saved tensors, transformers' cache bytes after a prefill. No published Granite 4.0 config.json
was found to copy; none is invented.
"""

from __future__ import annotations

import json

import pytest
import torch

from storelab.checkpoint import load
from storelab.checkpoint.config_only import read_model_config
from tests.test_family_jamba import check_bf16, check_counts, check_logits, check_memory, tiny_hf

COMMON = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
              bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=512,
              layer_types=["mamba", "attention", "mamba", "mamba"], mamba_n_heads=8, mamba_d_head=16,
              mamba_d_state=8, mamba_n_groups=2, mamba_chunk_size=8, shared_intermediate_size=48,
              embedding_multiplier=3.0, logits_scaling=2.0, residual_multiplier=0.5, attention_multiplier=0.1)
TINY = {
    "moe_rope": dict(COMMON, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2,
                     position_embedding_type="rope"),
    "dense_nope": dict(COMMON, num_local_experts=0, position_embedding_type="nope", attention_bias=True,
                       layer_types=["attention", "mamba", "mamba", "attention"]),
}

_BUILT: dict = {}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    def get(name: str):
        if name not in _BUILT:
            hf = tiny_hf("granitemoehybrid", TINY[name])
            d = tmp_path_factory.mktemp(name)
            hf.save_pretrained(d)
            _BUILT[name] = (hf, d)
        return _BUILT[name]

    yield get
    _BUILT.clear()


def test_config_read(saved):
    hf, folder = saved("moe_rope")
    cfg = read_model_config(folder)
    assert [lay.token.KIND for lay in cfg.layers] == ["mamba2", "attention", "mamba2", "mamba2"]
    attn, moe = cfg.layers[1].token, cfg.layers[0].channel
    assert attn.partial_rotary == 1.0 and attn.attn_scale == 0.1
    assert (moe.router, moe.norm_topk_prob, moe.n_experts, moe.top_k, moe.d_expert, moe.shared_width) == (
        "softmax", True, 4, 2, 32, 48)
    assert (cfg.embed_scale, cfg.logit_scale) == (3.0, 0.5)
    dense = read_model_config(saved("dense_nope")[1])
    assert [lay.token.KIND for lay in dense.layers] == ["attention", "mamba2", "mamba2", "attention"]
    assert dense.layers[0].token.partial_rotary == 0.0 and dense.layers[0].token.qkv_bias
    assert {lay.channel.KIND for lay in dense.layers} == {"ffn"} and dense.layers[0].channel.d_ff == 48


@pytest.mark.parametrize("name", list(TINY))
def test_logits_equal_transformers(name, saved):
    check_logits(*saved(name), ((0, 2), (2, 9), (9, 10), (10, 11), (11, 21)), f"granite {name}")


@pytest.mark.parametrize("name", list(TINY))
def test_bf16_logits(name, saved):
    check_bf16(*saved(name), f"granite {name}")


@pytest.mark.parametrize("name", list(TINY))
def test_config_counts_equal_transformers(name, saved):
    check_counts(*saved(name))


@pytest.mark.parametrize("T", [1, 4, 17])
def test_memory_equals_transformers_cache(T, saved):
    check_memory(*saved("moe_rope"), T)


@pytest.mark.parametrize("name", list(TINY))
def test_residual_multiplier_folded_into_the_output_projections(name, saved):
    """Every output projection loaded is the file's times residual_multiplier (0.5); every other tensor as saved."""
    from safetensors.torch import load_file

    hf, folder = saved(name)
    theirs = load_file(folder / "model.safetensors")
    ours = load(folder).state_dict()
    m = hf.config.residual_multiplier
    for i, lay in enumerate(read_model_config(folder).layers):
        if lay.token.KIND == "mamba2":
            pairs = [("token.out_proj.weight", "mamba.out_proj.weight", m),
                     ("token.in_proj.weight", "mamba.in_proj.weight", 1.0)]
        else:
            pairs = [("token.o_proj.weight", "self_attn.o_proj.weight", m),
                     ("token.q_proj.weight", "self_attn.q_proj.weight", 1.0)]
            if lay.token.out_bias:
                pairs.append(("token.o_proj.bias", "self_attn.o_proj.bias", m))
        if lay.channel.KIND == "moe":
            pairs += [("channel.down", "block_sparse_moe.output_linear.weight", m),
                      ("channel.gate_up", "block_sparse_moe.input_linear.weight", 1.0),
                      ("channel.shared_down_proj.weight", "shared_mlp.output_linear.weight", m)]
        else:
            pairs.append(("channel.down_proj.weight", "shared_mlp.output_linear.weight", m))
        for o, t, scale in pairs:
            o, t = f"blocks.{i}.{o}", f"model.layers.{i}.{t}"
            assert torch.equal(ours[o], theirs[t] * scale), f"{o} != {t} x {scale}"


def test_table_says_the_fold():
    """The tensor table names the fold: the output projections' sources say 'x residual_multiplier'."""
    from storelab.checkpoint.families.granitemoehybrid import FAMILY

    hf = dict(TINY["moe_rope"], model_type="granitemoehybrid")
    cfg = FAMILY.to_config(hf)
    tab = FAMILY.table(hf, cfg, set())
    folded = sorted(k for k, src in tab.items() if "residual_multiplier" in src.what)
    outputs = [f"blocks.{i}.token.{'o_proj' if i == 1 else 'out_proj'}.weight" for i in range(4)]
    downs = [f"blocks.{i}.channel.{p}" for i in range(4) for p in ("down", "shared_down_proj.weight")]
    assert folded == sorted(outputs + downs)


@pytest.mark.parametrize("change, message", [
    (dict(layer_types=["mamba", "conv", "mamba", "mamba"]), r"layer_types\[1\]: 'conv' is not a Granite 4.0 layer"),
    (dict(residual_multiplier=0), r"residual_multiplier: must be > 0"),
    (dict(logits_scaling=0), r"logits_scaling: must be > 0"),
    (dict(mamba_d_head=10), r"mamba_d_head: 10 x 8 heads is not"),
])
def test_refuses_naming_the_field(tmp_path, change, message):
    from storelab.checkpoint.shards import CheckpointError

    (tmp_path / "config.json").write_text(json.dumps(dict(TINY["moe_rope"], model_type="granitemoehybrid", **change)))
    with pytest.raises(CheckpointError, match=message):
        read_model_config(tmp_path)


def test_rope_scaling_refused_for_running_only_where_the_attention_rotates():
    """A rope type other than plain is read for accounting; loading refuses it naming the field, unless the
    attention uses no positions (NoPE: the rope fields are unused)."""
    from storelab.checkpoint.families.granitemoehybrid import FAMILY
    from storelab.checkpoint.shards import CheckpointError

    yarn = {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": 128}
    for name in TINY:
        hf = dict(TINY[name], model_type="granitemoehybrid", rope_parameters=yarn)
        FAMILY.to_config(hf)
        if hf["position_embedding_type"] == "rope":
            with pytest.raises(CheckpointError, match=r"rope_parameters.rope_type: 'yarn'"):
                FAMILY.runs(hf)
        else:
            FAMILY.runs(hf)
