"""GGUF files of the hybrid, MLA and other MoE architectures (``storelab/checkpoint/gguf/archs_*.py``) against
transformers 5.23's tiny models: each tiny model is saved, written as a GGUF the way llama.cpp's converter
writes it (``tests/gguf_writer_hybrid.py``), and then

* header: ``read_model_config`` of the GGUF gives the parameter count, the layer kinds and llama.cpp's memory
  (``storelab.models.engines``) of the transformers folder;
* logits: storelab's load of the GGUF equals transformers' logits of the original model (fp32), the reference
  for architectures transformers cannot read from a GGUF.
"""

from __future__ import annotations

import os

import pytest

from storelab.checkpoint import read_model_config
from tests.family_harness import tiny_hf
from tests.gguf_harness import built_fixture, check_header, check_logits
from tests.gguf_writer_hybrid import write_gguf

os.environ.setdefault("USE_HUB_KERNELS", "0")

COMMON = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
              bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=512)
LINEAR = dict(head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=16,
              linear_num_key_heads=2, linear_num_value_heads=4, layer_types=["linear_attention", "full_attention"])
QWEN_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)

# name -> (transformers model_type, GGUF architecture, tiny settings)
CASES = {
    "qwen3next": ("qwen3_next", "qwen3next", dict(COMMON, **LINEAR, **QWEN_MOE, intermediate_size=96)),
    "qwen35": ("qwen3_5_text", "qwen35", dict(COMMON, **LINEAR, intermediate_size=96)),
    "qwen35moe": ("qwen3_5_moe_text", "qwen35moe", dict(COMMON, **LINEAR, **QWEN_MOE)),
    "mamba2": ("mamba2", "mamba2", dict(COMMON, num_heads=8, head_dim=16, state_size=8, n_groups=2, expand=2,
                                        conv_kernel=4, chunk_size=8)),
    "nemotron_h": ("nemotron_h", "nemotron_h", dict(
        COMMON, num_hidden_layers=4, layers_block_type=["mamba", "mlp", "attention", "mlp"], head_dim=16,
        intermediate_size=96, mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=8, n_groups=2, conv_kernel=4,
        chunk_size=8)),
    "nemotron_h_moe": ("nemotron_h", "nemotron_h_moe", dict(
        COMMON, num_hidden_layers=4, layers_block_type=["mamba", "moe", "attention", "mlp"], head_dim=16,
        intermediate_size=96, mamba_num_heads=8, mamba_head_dim=16, ssm_state_size=8, n_groups=2, conv_kernel=4,
        chunk_size=8, n_routed_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
        moe_shared_expert_intermediate_size=48, n_group=2, topk_group=1, routed_scaling_factor=2.5)),
    # Granite 4.0-H as published: NoPE attention, experts beside the shared MLP, muP multipliers
    "granitehybrid": ("granitemoehybrid", "granitehybrid", dict(
        COMMON, layer_types=["mamba", "attention"], mamba_n_heads=8, mamba_d_head=16, mamba_d_state=8,
        mamba_n_groups=2, mamba_chunk_size=8, shared_intermediate_size=48, intermediate_size=32, num_local_experts=4,
        num_experts_per_tok=2, position_embedding_type="nope", embedding_multiplier=3.0, logits_scaling=2.0,
        residual_multiplier=0.5, attention_multiplier=0.1)),
    # grouped sigmoid routing, a dense first layer, a shared expert, query latent
    "deepseek_v3": ("deepseek_v3", "deepseek2", dict(
        COMMON, num_key_value_heads=4, intermediate_size=96, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
        first_k_dense_replace=1, n_shared_experts=1, moe_intermediate_size=32, routed_scaling_factor=2.5)),
    # softmax routing by the best score per group, no query latent
    "deepseek_v2": ("deepseek_v2", "deepseek2", dict(
        COMMON, num_key_value_heads=4, intermediate_size=96, kv_lora_rank=16, q_lora_rank=None, qk_rope_head_dim=8,
        qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=8, num_experts_per_tok=2, n_group=2, topk_group=1,
        topk_method="group_limited_greedy", first_k_dense_replace=1, n_shared_experts=1, moe_intermediate_size=32,
        routed_scaling_factor=1.5)),
    "glm4moe": ("glm4_moe", "glm4moe", dict(
        COMMON, head_dim=16, intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=2,
        n_group=2, topk_group=1, first_k_dense_replace=1, n_shared_experts=1, routed_scaling_factor=2.5,
        attention_bias=True, use_qk_norm=True)),
    "minimax_m2": ("minimax_m2", "minimax-m2", dict(
        COMMON, head_dim=16, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, rotary_dim=8)),
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
    check_logits(hf, path, 13, f"{name} GGUF logits")


def test_falcon_h1_refused(tmp_path):
    """A falcon-h1 GGUF is refused by name (no storelab family), from its header alone."""
    import gguf
    import numpy as np

    from storelab.checkpoint import CheckpointError

    path = tmp_path / "falcon.gguf"
    w = gguf.GGUFWriter(path, "falcon-h1")
    w.add_block_count(1)
    w.add_embedding_length(8)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match="general.architecture 'falcon-h1'.*no Falcon-H1 family"):
        read_model_config(path)
