"""StepFun's Step-3.5 / 3.7 Flash text model (``storelab/checkpoint/families/step3p7.py``).

Against transformers 5.23's tiny ``Step3p7ForConditionalGeneration`` (a one-layer vision tower beside it, left out
of the counts) saved with ``save_pretrained`` in StepFun's own layout (``moe.*``, ``share_expert``): query heads per
layer type, per-head q/k norms and sigmoid gates, Gemma's 1 + w norms, RoPE per layer type with partial rotation,
sigmoid experts with a choice bias, routed scaling and a shared expert; logits equal in fp32 and bf16, chunked
prefill + steps equal to one pass, transformers' cache bytes after a prefill, parameters from config.json alone
equal to the saved tensors. The hub form of the file (per-layer ``rope_theta`` lists, ``attention_other_setting``,
``moe_layers_enum``, MTP entries) read as transformers reads it; Step-3.7-Flash's published shape counted by hand
against StepFun's 196B total / 11B active; the limits of layers 43-44 accounted and refused for running.
"""

from __future__ import annotations

import json

import pytest
import torch

from storelab.checkpoint import CheckpointError, load
from storelab.checkpoint.config_only import read_model_config
from storelab.models.accounting import count_params
from tests.family_harness import check_bf16, check_cache, check_counts, check_logits

TEXT = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            vocab_size=128, intermediate_size=48, moe_intermediate_size=24, share_expert_dim=32, n_routed_experts=6,
            num_experts_per_tok=2, sliding_window=6, max_position_embeddings=512, pad_token_id=0,
            layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention"],
            num_sliding_attention_heads=6, mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
            rope_theta=[10000.0, 1000.0, 1000.0, 10000.0], partial_rotary_factors=[0.5, 1.0, 1.0, 0.5],
            moe_router_scaling_factor=2.5)
VISION = dict(width=32, layers=1, heads=2, image_size=28, patch_size=14)
# "base": the shape above; "scaled": query_pre_attn_scalar apart from head_dim, llama3 scaling on the global layers,
# the first two layers dense and untouched heads on the local ones
TINY = {
    "base": TEXT,
    "scaled": dict(TEXT, query_pre_attn_scalar=24, num_sliding_attention_heads=4,
                   mlp_layer_types=["dense", "dense", "sparse", "sparse"],
                   rope_scaling={"rope_type": "llama3", "factor": 2.0, "original_max_position_embeddings": 64,
                                 "low_freq_factor": 1.0, "high_freq_factor": 4.0}),
}
VISION_PARTS = ("vision_model", "multi_modal_projector")


def _tiny(text: dict):
    from transformers import Step3p7Config, Step3p7ForConditionalGeneration

    torch.manual_seed(0)
    hf = Step3p7ForConditionalGeneration(Step3p7Config(text_config=dict(text), vision_config=VISION)).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # norms (zeros: 1 + w), routing biases away from their constants
        for t in hf.state_dict().values():
            if t.dtype.is_floating_point and (t.dim() == 1 or bool((t == t.flatten()[0]).all())):
                t.add_(0.3 * torch.randn(t.shape, generator=g))
    return hf


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    built: dict = {}

    def get(name: str):
        if name not in built:
            hf = _tiny(TINY[name])
            d = tmp_path_factory.mktemp(name)
            hf.save_pretrained(d)
            built[name] = (hf, d)
        return built[name]

    yield get
    built.clear()


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
    check_counts(*saved(name), leave_out=VISION_PARTS)


def test_config_read(saved):
    hf, folder = saved("base")
    assert (folder / "model.safetensors").exists()
    cfg = read_model_config(folder)
    toks = [lay.token for lay in cfg.layers]
    assert [a.KIND for a in toks] == ["attention", "window", "window", "attention"]
    assert [a.n_heads for a in toks] == [4, 6, 6, 4] and {a.n_kv_heads for a in toks} == {2}
    assert [a.partial_rotary for a in toks] == [0.5, 1.0, 1.0, 0.5] and [a.rope_theta for a in toks] == [1e4, 1e3,
                                                                                                        1e3, 1e4]
    assert all(a.head_gate and a.gate_activation == "sigmoid" and a.qk_norm and a.attn_scale is None for a in toks)
    assert toks[1].window == 5
    assert [lay.channel.KIND for lay in cfg.layers] == ["ffn", "moe", "moe", "moe"]
    moe = cfg.layers[1].channel
    assert moe.router == "sigmoid" and moe.router_bias and moe.norm_topk_prob and moe.routed_scaling == 2.5
    assert moe.shared_width == 32 and moe.d_expert == 24 and not cfg.tie_embeddings
    scaled = read_model_config(saved("scaled")[1])
    assert scaled.layers[0].token.attn_scale == 24 ** -0.5
    assert scaled.layers[0].token.rope_scaling["rope_type"] == "llama3" and scaled.layers[1].token.rope_scaling is None


# the hub form of the text config (StepFun's remote-code file: aliases, per-layer lists padded with one MTP entry)
HUB = dict(model_type="step3p5", hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_attention_groups=2,
           head_dim=16, vocab_size=128, intermediate_size=48, moe_intermediate_size=24, share_expert_dim=32,
           moe_num_experts=6, moe_top_k=2, sliding_window=6, max_position_embeddings=512, num_nextn_predict_layers=1,
           layer_types=["full_attention", "sliding_attention", "sliding_attention", "full_attention",
                        "full_attention"],
           attention_other_setting={"attention_type": "sliding_attention", "num_attention_heads": 6,
                                    "num_attention_groups": 2, "head_dim": 16},
           moe_layers_enum="1,2,3,4", rope_theta=[10000.0, 1000.0, 1000.0, 10000.0, 10000.0],
           partial_rotary_factors=[0.5, 1.0, 1.0, 0.5, 0.5], moe_router_scaling_factor=2.5,
           swiglu_limits=[0.0, 0.0, 0.0, 7.0, 0.0], swiglu_limits_shared=[0.0, 0.0, 0.0, 16.0, 0.0])


def test_hub_form_reads_as_transformers_does(tmp_path, saved):
    """The hub file reads to the same model as the file transformers saves of the same shape."""
    (tmp_path / "config.json").write_text(json.dumps(HUB))
    hub = read_model_config(tmp_path)
    ref = read_model_config(saved("base")[1])
    assert [lay.token for lay in hub.layers] == [lay.token for lay in ref.layers]
    assert [lay.channel for lay in hub.layers] == [lay.channel for lay in ref.layers]
    assert count_params(hub).stored == count_params(ref).stored


def test_limits_accounted_not_run(tmp_path, saved):
    """Step-3.7-Flash's clips (layers 43-44) are another function than storelab's swiglu_limit: refused for
    loading, naming the entry."""
    _, folder = saved("base")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["text_config"]["swiglu_limits"] = [0.0, 0.0, 0.0, 7.0]
    ck = tmp_path / "ck"
    ck.mkdir()
    (ck / "config.json").write_text(json.dumps(cfg))
    (ck / "model.safetensors").symlink_to(folder / "model.safetensors")
    read_model_config(ck)  # accounted
    with pytest.raises(CheckpointError, match=r"swiglu_limits\[3\]"):
        load(ck)


# Step-3.7-Flash's text fields, as the hub file and the engines' tests give them (45 layers, 1:3 global:local,
# 64 / 96 query heads, layers 3-44 sparse, 288 experts, 3 MTP layers padding the lists)
FLASH = dict(model_type="step3p5", hidden_size=4096, num_hidden_layers=45, num_attention_heads=64,
             num_attention_groups=8, head_dim=128, vocab_size=128896, intermediate_size=11264,
             moe_intermediate_size=1280, share_expert_dim=1280, moe_num_experts=288, moe_top_k=8,
             moe_layers_enum=",".join(str(i) for i in range(3, 48)), sliding_window=512, rms_norm_eps=1e-5,
             max_position_embeddings=262144, num_nextn_predict_layers=3, moe_router_scaling_factor=3.0,
             layer_types=["full_attention" if i % 4 == 0 else "sliding_attention" for i in range(48)],
             attention_other_setting={"attention_type": "sliding_attention", "num_attention_heads": 96,
                                      "num_attention_groups": 8, "head_dim": 128},
             rope_theta=[5000000.0 if i % 4 == 0 else 10000.0 for i in range(48)],
             partial_rotary_factors=[0.5 if i % 4 == 0 else 1.0 for i in range(48)],
             rope_scaling={"rope_type": "llama3", "factor": 2.0, "original_max_position_embeddings": 131072,
                           "low_freq_factor": 1.0, "high_freq_factor": 32.0},
             swiglu_limits=[0.0] * 43 + [7.0, 7.0] + [0.0] * 3,
             swiglu_limits_shared=[0.0] * 43 + [16.0, 16.0] + [0.0] * 3, tie_word_embeddings=False)


def test_published_flash(tmp_path):
    """Hand count: per layer the attention D H K 2 + 2 D G K + D H + 2 K (64 heads on the 12 global layers, 96 on the
    33 local ones), three dense MLPs 3 D I, 42 MoE layers of 288 experts 3 D 1280 + router E D + bias E + shared
    3 D 1280, two norms a layer, the final norm, embedding and LM head: 196.96B, StepFun's "196B"; active (8 experts)
    11.99B (11.46B without the input embedding), its "11B"."""
    (tmp_path / "config.json").write_text(json.dumps(FLASH))
    cfg = read_model_config(tmp_path)
    D, G, K, V, E, M = 4096, 8, 128, 128896, 288, 1280
    heads = [64 if i % 4 == 0 else 96 for i in range(45)]
    attn = sum(D * H * K * 2 + 2 * D * G * K + D * H + 2 * K for H in heads)

    def moe(e):
        return 3 * e * D * M + E * D + E + 3 * D * M

    rest = attn + 3 * 3 * D * 11264 + 45 * 2 * D + D + 2 * V * D
    acc = count_params(cfg)
    assert acc.stored == rest + 42 * moe(E)
    assert acc.active == rest + 42 * moe(8)
    assert int(acc.stored / 1e9) == 196 and int(acc.active / 1e9) == 11  # 196.96B, 11.99B: StepFun's figures cut
    assert [lay.token.KIND for lay in cfg.layers].count("attention") == 12
    assert cfg.layers[0].token.rope_scaling["rope_type"] == "llama3" and cfg.layers[1].token.window == 511


@pytest.mark.parametrize("field, value, words", [
    ("gating", "per-channel", "broadcast"),
    ("use_bidirectional_attention", True, "causal"),
    ("mlp_bias", True, "biases"),
    ("moe_layers_enum", "3,x", "layer numbers"),
    ("attention_other_setting", {"num_attention_heads": 6, "head_dim": 8}, "head_dim"),
    ("layer_types", ["minimax_m3_sparse"] * 5, "minimax_m3_sparse"),
])
def test_refused_naming_the_field(field, value, words, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "step3p7", "text_config": dict(HUB, **{field: value})}))
    with pytest.raises(CheckpointError, match=words) as e:
        read_model_config(tmp_path)
    assert field.split("_")[0] in str(e.value)
