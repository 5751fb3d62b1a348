"""DeepSeek-V4 GGUF files (``deepseek4``, ``storelab/checkpoint/gguf/archs_v4.py``) against transformers 5.23's tiny
``deepseek_v4``: it is saved, written as a GGUF the way llama.cpp's converter writes it (``tests/gguf_writer_v4.py``),
and then

* header: ``read_model_config`` of the GGUF gives the layer kinds, the parameter count and llama.cpp's memory
  (``storelab.models.engines``) of the transformers folder;
* logits: storelab's load of the GGUF equals transformers' logits of the original model (fp32).

The settings are oracles.md's "Tiny settings that construct" for deepseek_v4 with every attention kind (a window
layer, CSA at rate 4, HCA at rate 8) and 8 index heads (with 2, tied zero scores make top-k pick differently:
tests/test_checkpoint.py). ``hash``: the first two layers hash-routed (``tid2eid`` starts as zeros: filled with
distinct experts per token); ``scored``: every layer routed by score; ``yarn``: the releases' YaRN on the compressed
layers (header only: storelab accounts such a config and does not run it).
"""

from __future__ import annotations

import json
import os

import gguf
import numpy as np
import pytest
import torch

from storelab.checkpoint import CheckpointError, read_model_config
from storelab.checkpoint.gguf import read_gguf_config
from storelab.models.accounting import count_params
from tests.family_harness import tiny_hf
from tests.gguf_harness import check_logits
from tests.gguf_writer_v4 import write_gguf_v4

os.environ.setdefault("USE_HUB_KERNELS", "0")

TINY = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=1, vocab_size=128,
            bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=512, head_dim=32, q_lora_rank=24,
            o_groups=2, o_lora_rank=16, index_n_heads=8, index_head_dim=16, index_topk=4, sliding_window=8,
            compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
            n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=32, hc_mult=2,
            hc_sinkhorn_iters=5, layer_types=["sliding_attention", "compressed_sparse_attention",
                                              "heavily_compressed_attention", "compressed_sparse_attention"])
CASES = {"hash": dict(TINY, mlp_layer_types=["hash_moe", "hash_moe", "moe", "moe"]),
         "scored": dict(TINY, mlp_layer_types=["moe"] * 4),
         # the releases' YaRN on the compressed layers (accounted by storelab, not run: header only)
         "yarn": dict(TINY, rope_parameters={"rope_type": "yarn", "factor": 16.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                             "original_max_position_embeddings": 32})}
EPS = ("rms_norm_eps", "hc_eps")   # written as float32


def _fill_tables(hf) -> None:
    """``tid2eid`` starts as zeros: give every token distinct experts."""
    g = torch.Generator().manual_seed(2)
    E = hf.config.n_routed_experts
    with torch.no_grad():
        for name, t in hf.state_dict().items():
            if name.endswith("tid2eid"):
                t.copy_(torch.stack([torch.randperm(E, generator=g)[: t.shape[1]] for _ in range(t.shape[0])]))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            hf = tiny_hf("deepseek_v4", CASES[name])
            _fill_tables(hf)
            folder = tmp_path_factory.mktemp(name)
            hf.save_pretrained(folder)
            cache[name] = (hf, folder, write_gguf_v4(folder, folder / f"{name}.gguf"))
        return cache[name]

    yield get
    cache.clear()


def kinds(cfg) -> list[tuple[str, str, str]]:
    return [(lay.token.KIND, lay.channel.KIND, lay.channel.routing) for lay in cfg.layers]


@pytest.mark.parametrize("name", sorted(CASES))
def test_header(built, name):
    from storelab.models.engines import engine_layers

    _, folder, path = built(name)
    got, want = read_gguf_config(path), json.loads((folder / "config.json").read_text())
    for k, v in got.items():   # every field the GGUF gives is transformers' own (eps as float32)
        if k != "gguf":
            assert v == (pytest.approx(want[k], rel=1e-6) if k in EPS else want[k]), k
    ours, theirs = read_model_config(path), read_model_config(folder)
    assert kinds(ours) == kinds(theirs)
    assert [(lay.token.KIND, getattr(lay.token, "stride", 0)) for lay in ours.layers] == [
        ("v4_window", 0), ("csa", 4), ("hca", 8), ("csa", 4)]
    assert count_params(ours).stored == count_params(theirs).stored
    for T, B in ((100, 1), (5000, 2)):
        assert (engine_layers(ours, T, batch=B, engine="llama.cpp")["layers"]
                == engine_layers(theirs, T, batch=B, engine="llama.cpp")["layers"])


def test_logits(built):
    hf, _, path = built("scored")
    check_logits(hf, path, 21, "deepseek4 GGUF logits")


def test_logits_hash_layers(built):
    """The converter writes ``tid2eid`` as int32 (GGML I32): read as integers, the hash-routed layers equal
    transformers'. (The ``yarn`` case is accounted, not run: the family refuses YaRN on compressed layers.)"""
    hf, _, path = built("hash")
    ours = check_logits(hf, path, 21, "deepseek4 GGUF logits (hash)")
    tables = [t for k, t in ours.state_dict().items() if k.endswith(".table")]   # the hash tables, from tid2eid
    assert tables and all(not t.dtype.is_floating_point for t in tables)


def _header_only(path, kv: dict, tensors: dict) -> None:
    w = gguf.GGUFWriter(path, "deepseek4")
    for k, v in kv.items():
        if isinstance(v, list):
            w.add_array(f"deepseek4.{k}", v)
        elif isinstance(v, float):
            w.add_float32(f"deepseek4.{k}", v)
        else:
            w.add_uint32(f"deepseek4.{k}", v)
    for name, shape in tensors.items():
        w.add_tensor(name, np.zeros(shape, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


BASE_KV = {"block_count": 2, "embedding_length": 8, "attention.head_count": 2, "attention.key_length": 8,
           "expert_gating_func": 4, "hash_layer_count": 0, "rope.dimension_count": 2,
           "attention.compress_ratios": [0, 128]}


def test_gating_other_than_sqrt_softplus_is_refused(tmp_path):
    path = tmp_path / "v4.gguf"
    _header_only(path, dict(BASE_KV, expert_gating_func=2), {"token_embd.weight": (16, 8)})
    with pytest.raises(CheckpointError, match="deepseek4.expert_gating_func"):
        read_model_config(path)


def test_compressor_disagreeing_with_its_ratio_is_refused(tmp_path):
    """Layer 1 says ratio 128 but its ``ape`` holds 4 rows: named, not guessed."""
    path = tmp_path / "v4.gguf"
    _header_only(path, BASE_KV, {"token_embd.weight": (16, 8), "blk.1.attn_compressor_ape.weight": (4, 8)})
    with pytest.raises(CheckpointError, match=r"blk\.1\.attn_compressor_ape\.weight.*compress_ratios\[1\] = 128"):
        read_model_config(path)
