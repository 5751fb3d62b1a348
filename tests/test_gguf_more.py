"""GGUF files of ``jamba``, ``kimi-linear``, ``glm-dsa`` and ``mimo2`` (``storelab/checkpoint/gguf/archs_more.py``)
against transformers 5.23's tiny models: each is saved, written as a GGUF the way llama.cpp's converter writes it
(``tests/gguf_writer_hybrid.py``), and then

* header: ``read_model_config`` of the GGUF gives the layer kinds, the parameter count and llama.cpp's memory
  (``storelab.models.engines``) of the transformers folder;
* logits: storelab's load of the GGUF equals transformers' logits of the original model (fp32).

The settings are oracles.md's "Tiny settings that construct", with layer patterns that exercise what is read
from the file's tensors (Jamba's periods, Kimi's KDA / MLA layers, GLM's shared indexer layers, MiMo's windows).
"""

from __future__ import annotations

import os

import gguf
import numpy as np
import pytest

from storelab.checkpoint import CheckpointError, read_model_config
from tests.family_harness import tiny_hf
from tests.gguf_harness import built_fixture, check_header, check_logits
from tests.gguf_writer_hybrid import write_gguf

os.environ.setdefault("USE_HUB_KERNELS", "0")

COMMON = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
              intermediate_size=96, bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=512)
MLA = dict(num_key_value_heads=4, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16)

# name -> (transformers model_type, GGUF architecture, tiny settings)
CASES = {
    # attention at layers 1 and 3 (period 2, offset 1), experts at layer 2 (period 4, offset 2)
    "jamba": ("jamba", "jamba", dict(
        COMMON, attn_layer_period=2, attn_layer_offset=1, expert_layer_period=4, expert_layer_offset=2,
        num_experts=4, num_experts_per_tok=2, mamba_d_state=8, mamba_dt_rank=8, mamba_expand=2, mamba_d_conv=4)),
    "kimi_linear": ("kimi_linear", "kimi-linear", dict(
        COMMON, **MLA, q_lora_rank=None, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        num_shared_experts=1, linear_head_dim=16, linear_num_heads=4, routed_scaling_factor=2.5,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"])),
    # a dense first layer, then experts; IndexShare (freq 2, offset 2): the indexer on layers 0, 1 and 3, layer 2
    # reuses layer 1's selection; 8 index heads, not oracles.md's 2, whose clipped scores tie (tests/test_checkpoint.py)
    "glm_moe_dsa": ("glm_moe_dsa", "glm-dsa", dict(
        COMMON, **MLA, q_lora_rank=24, index_topk=8, index_head_dim=16, index_n_heads=8, n_routed_experts=4,
        num_experts_per_tok=2, n_group=1, topk_group=1, moe_intermediate_size=32, first_k_dense_replace=1,
        n_shared_experts=1, routed_scaling_factor=2.5, index_topk_freq=2, index_skip_topk_offset=2)),
    "mimo_v2_flash": ("mimo_v2_flash", "mimo2", dict(
        COMMON, head_dim=24, v_head_dim=16, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
        sliding_window=8)),
}


def _make(name: str, folder):
    model_type, arch, settings = CASES[name]
    hf = tiny_hf(model_type, settings)
    hf.save_pretrained(folder)
    return hf, write_gguf(folder, arch, folder / f"{name}.gguf")


built = built_fixture(_make)


@pytest.mark.parametrize("name", sorted(CASES))
def test_header(built, name):
    _, folder, path = built(name)
    check_header(folder, path)


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits(built, name):
    hf, _, path = built(name)
    check_logits(hf, path, 21, f"{name} GGUF logits")


def _header_only(path, arch: str, kv: dict, tensors: dict) -> None:
    w = gguf.GGUFWriter(path, arch)
    for k, v in kv.items():
        if isinstance(v, list):
            w.add_array(f"{arch}.{k}", v)
        else:
            w.add_uint32(f"{arch}.{k}", v)
    for name, shape in tensors.items():
        w.add_tensor(name, np.zeros(shape, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_jamba_pattern_without_a_period_is_refused(tmp_path):
    """Attention on layers 0 and 1 of 3 follows no (period, offset) rule: refused by name, not guessed."""
    path = tmp_path / "jamba.gguf"
    t = {"token_embd.weight": (16, 8), "blk.0.attn_q.weight": (8, 8), "blk.1.attn_q.weight": (8, 8)}
    _header_only(path, "jamba", dict(block_count=3, embedding_length=8, **{"attention.head_count": 2},
                                     **{"ssm.inner_size": 16, "expert_count": 1, "expert_used_count": 1}), t)
    with pytest.raises(CheckpointError, match=r"attention layers \[0, 1\] of 3 follow no \(period, offset\)"):
        read_model_config(path)


def test_mimo2_uneven_kv_heads_are_refused(tmp_path):
    """Window layers must have twice the full layers' KV heads (transformers' rule): else the key is named."""
    path = tmp_path / "mimo2.gguf"
    _header_only(path, "mimo2", {"block_count": 2, "embedding_length": 8, "attention.head_count": 2,
                                 "attention.head_count_kv": [1, 1], "attention.sliding_window_pattern": [0, 1]},
                 {"token_embd.weight": (16, 8)})
    with pytest.raises(CheckpointError, match="mimo2.attention.head_count_kv"):
        read_model_config(path)
