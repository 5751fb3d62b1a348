"""Orion, Baichuan, MiniCPM and DeepSeekMoE (remote-code families: their modeling file ships beside the weights, not
in transformers 5.23), each held to the transformers family its layout renames: a tiny random model of that family,
its tensors saved under the remote names with a config.json in the remote field names, loaded by storelab: logits
equal in fp32 (1e-5 of their scale) and bf16, chunked prefill then single tokens equal to one pass, transformers'
cache bytes, parameters from config.json alone equal to the saved tensors; their published configs counted by hand.

* Orion <- ``stablelm`` with whole heads rotated and no q/k/v bias (LayerNorms with biases, Llama names);
* Baichuan 7B <- ``llama`` (multi-head), q/k/v packed in ``W_pack``; Baichuan 2's NormHead: the saved head's rows
  scaled by random factors, read back at unit length; the 13B's ALiBi accounted and refused for running;
* MiniCPM <- ``granite`` with embedding_multiplier = scale_emb, residual_multiplier = scale_depth / sqrt(n),
  logits_scaling = hidden_size / dim_model_base, attention_multiplier = head_dim^-1/2;
* DeepSeekMoE <- ``qwen2_moe`` (softmax top-k, not renormalised) with its shared-expert gate at zero, the factor
  1/2 it leaves folded into the file's shared down projection; experts written one by one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from storelab.checkpoint import CheckpointError
from storelab.checkpoint.families import family_for
from storelab.checkpoint.config_only import read_model_config
from storelab.models.accounting import count_params
from storelab.models.engines import state_bytes
from tests.family_harness import check_bf16, check_cache, check_counts, check_logits, tiny_hf

FIXTURES = Path(__file__).parent / "fixtures" / "configs"
SPLITS = ((0, 3), (3, 11), (11, 12), (12, 13), (13, 21))
SHAPE = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, vocab_size=128, intermediate_size=96,
             max_position_embeddings=256)
IDS = dict(bos_token_id=1, eos_token_id=2, pad_token_id=0)


def write(folder: Path, config: dict, tensors: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def orion(tmp: Path):
    hf = tiny_hf("stablelm", dict(SHAPE, **IDS, num_key_value_heads=2, use_qkv_bias=False, layer_norm_eps=1e-5,
                                  rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                                       partial_rotary_factor=1.0)), perturb=0.3)
    config = dict(SHAPE, model_type="orion", architectures=["OrionForCausalLM"], num_key_value_heads=2,
                  hidden_act="silu", rms_norm_eps=1e-5, rope_theta=10000.0, rope_scaling=None,
                  tie_word_embeddings=False)
    return hf, write(tmp / "orion", config, hf.state_dict())


def baichuan(tmp: Path, shape: dict = SHAPE, head_scale: bool = False):
    hf = tiny_hf("llama", dict(shape, **IDS, num_key_value_heads=shape["num_attention_heads"], rms_norm_eps=1e-6),
                 perturb=0.3)
    sd = dict(hf.state_dict())
    for i in range(shape["num_hidden_layers"]):
        a = f"model.layers.{i}.self_attn"
        sd[f"{a}.W_pack.weight"] = torch.cat([sd.pop(f"{a}.{p}_proj.weight") for p in "qkv"], 0)
    if head_scale:  # transformers' head at unit rows; the file's rows scaled, as Baichuan 2 trains them
        with torch.no_grad():
            hf.lm_head.weight /= hf.lm_head.weight.norm(dim=-1, keepdim=True)
        scale = 0.5 + torch.rand(hf.lm_head.weight.shape[0], 1, generator=torch.Generator().manual_seed(3))
        sd["lm_head.weight"] = hf.lm_head.weight * scale
    config = dict(shape, model_type="baichuan", architectures=["BaichuanForCausalLM"], hidden_act="silu",
                  rms_norm_eps=1e-6, tie_word_embeddings=False, model_max_length=shape["max_position_embeddings"])
    return hf, write(tmp / f"baichuan{shape['vocab_size']}", config, sd)


MINICPM = dict(scale_emb=12.0, scale_depth=1.4, dim_model_base=16)


def minicpm(tmp: Path):
    D, n, K = SHAPE["hidden_size"], SHAPE["num_hidden_layers"], SHAPE["hidden_size"] // SHAPE["num_attention_heads"]
    hf = tiny_hf("granite", dict(SHAPE, **IDS, num_key_value_heads=2, tie_word_embeddings=True, rms_norm_eps=1e-5,
                                 embedding_multiplier=MINICPM["scale_emb"], logits_scaling=D / MINICPM["dim_model_base"],
                                 residual_multiplier=MINICPM["scale_depth"] / n ** 0.5, attention_multiplier=K ** -0.5),
                 perturb=0.3)
    config = dict(SHAPE, **MINICPM, model_type="minicpm", architectures=["MiniCPMForCausalLM"], num_key_value_heads=2,
                  hidden_act="silu", rms_norm_eps=1e-5, tie_word_embeddings=True)
    sd = {k: v for k, v in hf.state_dict().items() if k != "lm_head.weight"}  # tied: the embedding once
    return hf, write(tmp / "minicpm", config, sd)


def deepseek(tmp: Path):
    """qwen2_moe with its shared-expert gate at zero (sigmoid 1/2: the file's shared down projection is halved),
    no q/k/v bias, layer 0 dense; its 3-D experts written per expert."""
    E, M, S = 4, 16, 2
    hf = tiny_hf("qwen2_moe", dict(SHAPE, **IDS, num_key_value_heads=2, qkv_bias=False, num_experts=E,
                                   num_experts_per_tok=2, moe_intermediate_size=M, shared_expert_intermediate_size=S * M,
                                   mlp_only_layers=[0], norm_topk_prob=False, rms_norm_eps=1e-6), perturb=0.3)
    sd = {}
    for k, v in hf.state_dict().items():
        m = k.rsplit(".mlp.", 1)[0] + ".mlp"
        if k.endswith("shared_expert_gate.weight"):
            v.zero_()  # in the transformers model too: its shared expert is weighted by sigmoid(0)
        elif k.endswith("experts.gate_up_proj"):
            for e in range(E):
                sd[f"{m}.experts.{e}.gate_proj.weight"], sd[f"{m}.experts.{e}.up_proj.weight"] = v[e, :M], v[e, M:]
        elif k.endswith("experts.down_proj"):
            for e in range(E):
                sd[f"{m}.experts.{e}.down_proj.weight"] = v[e]
        elif ".shared_expert." in k:
            sd[k.replace(".shared_expert.", ".shared_experts.")] = v * 0.5 if "down_proj" in k else v
        else:
            sd[k] = v
    config = dict(SHAPE, model_type="deepseek", architectures=["DeepseekForCausalLM"], num_key_value_heads=2,
                  attention_bias=False, hidden_act="silu", rms_norm_eps=1e-6, rope_theta=10000.0,
                  first_k_dense_replace=1, moe_layer_freq=1, n_routed_experts=E, n_shared_experts=S,
                  moe_intermediate_size=M, num_experts_per_tok=2, norm_topk_prob=False, scoring_func="softmax",
                  tie_word_embeddings=False)
    return hf, write(tmp / "deepseek", config, sd)


BUILD = {"orion": orion, "baichuan": baichuan, "minicpm": minicpm, "deepseek": deepseek}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            cache[name] = BUILD[name](tmp_path_factory.mktemp(name))
        return cache[name]

    return get


@pytest.mark.parametrize("name", list(BUILD))
def test_logits_equal_transformers(name, built):
    check_logits(*built(name), what=name, splits=SPLITS)


@pytest.mark.parametrize("name", list(BUILD))
def test_bf16_logits(name, built):
    check_bf16(*built(name), what=name)


@pytest.mark.parametrize("name", list(BUILD))
def test_cache_bytes_and_counts(name, built):
    for T in (5, 17):
        check_cache(*built(name), T)
    check_counts(*built(name), leave_out=("shared_expert_gate",) if name == "deepseek" else ())  # fixed at 0


def test_baichuan2_norm_head(tmp_path):
    """Baichuan 2's vocabulary (125696) reads its head through unit rows: logits equal a Llama whose head is the
    normalised one, though the saved rows are scaled."""
    shape = dict(SHAPE, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=48,
                 vocab_size=125696)
    hf, folder = baichuan(tmp_path, shape, head_scale=True)
    check_logits(hf, folder, what="baichuan2 norm head", splits=((0, 7), (7, 8)))


def _published(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def _kv_per_token(path: Path) -> int:
    return sum(state_bytes(read_model_config(path), 1, engine="transformers", dtype="bf16").values())


def test_baichuan2_13b_alibi_accounted_not_run(tmp_path):
    """The 13B width (5120) means ALiBi: keys and values as any multi-head layer (40 layers x 2 x 5120 x 2 bytes
    a token), no rotation; loading refuses it naming hidden_size."""
    hf = dict(_published("Baichuan2-7B-Chat"), hidden_size=5120, num_hidden_layers=40, num_attention_heads=40,
              intermediate_size=13696)
    (tmp_path / "config.json").write_text(json.dumps(hf))
    cfg = read_model_config(tmp_path)
    assert {lay.token.partial_rotary for lay in cfg.layers} == {0.0}
    assert _kv_per_token(tmp_path) == 40 * 2 * 5120 * 2
    with pytest.raises(CheckpointError, match="hidden_size.*ALiBi"):
        family_for(hf).runs(hf)


def test_published_counted_by_hand():
    """Orion-14B and Baichuan2-7B by hand (parameters; bf16 keys and values a token)."""
    D, I, V, n = 5120, 15360, 84608, 40  # Orion-14B: LayerNorms of 2D, untied
    orion_params = 2 * V * D + n * (4 * D * D + 3 * D * I + 4 * D) + 2 * D
    assert count_params(read_model_config(FIXTURES / "Orion-14B-Chat.json")).stored == orion_params
    assert _kv_per_token(FIXTURES / "Orion-14B-Chat.json") == 40 * 2 * 5120 * 2
    D, I, V, n = 4096, 11008, 125696, 32  # Baichuan2-7B: multi-head, untied
    assert count_params(read_model_config(FIXTURES / "Baichuan2-7B-Chat.json")).stored == \
        2 * V * D + n * (4 * D * D + 3 * D * I + 2 * D) + D
    assert _kv_per_token(FIXTURES / "Baichuan2-7B-Chat.json") == 32 * 2 * 4096 * 2


# -- the published MiniCPM and DeepSeekMoE configs (families minicpm.py, deepseek.py) ------------------------------
def test_minicpm_2b_counted_by_hand():
    """MiniCPM-2B-sft: tied embeddings, the muP scalars read; 2.72B parameters (2.44B without the embedding)."""
    D, I, V, n = 2304, 5760, 122753, 40
    cfg = read_model_config(FIXTURES / "MiniCPM-2B-sft-bf16.json")
    assert count_params(cfg).stored == V * D + n * (4 * D * D + 3 * D * I + 2 * D) + D
    assert (cfg.embed_scale, cfg.logit_scale) == (12.0, 256 / 2304) and cfg.tie_embeddings
    assert _kv_per_token(FIXTURES / "MiniCPM-2B-sft-bf16.json") == 40 * 2 * 2304 * 2


def test_deepseek_moe_16b():
    """deepseek-moe-16b: layer 0 a dense MLP of 10944, then 27 layers of 64 experts of 1408 (top 6, softmax, not
    renormalised) beside 2 shared ones; 16.4B parameters (the paper's figure), 28 x 2 x 2048 x 2 bytes a token."""
    path = FIXTURES / "deepseek-moe-16b-base.json"
    cfg = read_model_config(path)
    assert [lay.channel.KIND for lay in cfg.layers] == ["ffn"] + ["moe"] * 27
    moe = cfg.layers[1].channel
    assert (moe.n_experts, moe.top_k, moe.router, moe.norm_topk_prob, moe.shared_width) == (64, 6, "softmax", False,
                                                                                            2 * 1408)
    D, V = 2048, 102400
    per_moe = 64 * 3 * D * 1408 + 64 * D + 3 * D * 2 * 1408
    hand = 2 * V * D + 28 * (4 * D * D + 2 * D) + 3 * D * 10944 + 27 * per_moe + D
    assert count_params(cfg).stored == hand and abs(hand / 16.4e9 - 1) < 0.01
    assert _kv_per_token(path) == 28 * 2 * 2048 * 2


@pytest.mark.parametrize("change, field", [(dict(num_experts=8), "num_experts"), (dict(scale_depth=0), "scale_depth"),
                                           (dict(dim_model_base="x"), "dim_model_base")])
def test_minicpm_refuses_naming_the_field(tmp_path, change, field):
    (tmp_path / "config.json").write_text(json.dumps(dict(_published("MiniCPM-2B-sft-bf16"), **change)))
    with pytest.raises(CheckpointError, match=field):
        read_model_config(tmp_path)
