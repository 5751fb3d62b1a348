"""Orion and Baichuan (remote-code families: their modeling file ships beside the weights, not in transformers
5.23), each held to the transformers family its layout renames: a tiny random model of that family, its tensors
saved under the remote names with a config.json in the remote field names, loaded by storelab: logits equal in
fp32 (1e-5 of their scale) and bf16, chunked prefill then single tokens equal to one pass, transformers' cache
bytes, parameters from config.json alone equal to the saved tensors; their published configs counted by hand, and
those of MiniCPM-2B and DeepSeekMoE 16B (held to granite and qwen2_moe in test_family_remote.py).

* Orion <- ``stablelm`` with whole heads rotated and no q/k/v bias (LayerNorms with biases, Llama names);
* Baichuan 7B <- ``llama`` (multi-head), q/k/v packed in ``W_pack``; Baichuan 2's NormHead: the saved head's rows
  scaled by random factors, read back at unit length; the 13B's ALiBi accounted and refused for running;
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


BUILD = {"orion": orion, "baichuan": baichuan}


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
    check_counts(*built(name))


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

