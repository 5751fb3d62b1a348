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
import torch

from storelab.checkpoint import load, read_model_config
from storelab.models.accounting import count_params
from tests.family_harness import ids_of, tiny_hf
from tests.gguf_writer_hybrid import write_gguf
from tests.helpers import assert_close

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
}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            model_type, arch, settings = CASES[name]
            hf = tiny_hf(model_type, settings)
            folder = tmp_path_factory.mktemp(name)
            hf.save_pretrained(folder)
            cache[name] = (hf, folder, write_gguf(folder, arch, folder / f"{name}.gguf"))
        return cache[name]

    yield get
    cache.clear()


def kinds(cfg) -> list[tuple[str, str]]:
    return [(lay.token.KIND, lay.channel.KIND if lay.channel is not None else "") for lay in cfg.layers]


@pytest.mark.parametrize("name", sorted(CASES))
def test_header(built, name):
    from storelab.models.engines import engine_layers

    _, folder, path = built(name)
    ours, theirs = read_model_config(path), read_model_config(folder)
    assert kinds(ours) == kinds(theirs)
    assert count_params(ours).stored == count_params(theirs).stored
    for T, B in ((100, 1), (5000, 2)):
        assert (engine_layers(ours, T, batch=B, engine="llama.cpp")["layers"]
                == engine_layers(theirs, T, batch=B, engine="llama.cpp")["layers"])


@pytest.mark.parametrize("name", sorted(CASES))
def test_logits(built, name):
    hf, _, path = built(name)
    ours = load(path)
    ids = ids_of(13)
    with torch.no_grad():
        ref = hf(ids).logits
        got, _ = ours(ids)
    assert_close(got, ref, atol=1e-5 * ref.abs().max().item(), what=f"{name} GGUF logits")
