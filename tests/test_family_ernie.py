"""ERNIE 4.5 MoE (``storelab/checkpoint/families/ernie4_5_moe.py``) against transformers 5.23's tiny
``ernie4_5_moe`` saved with ``save_pretrained`` (the release's names: per-expert ``gate/up/down_proj``,
``mlp.moe_statics.e_score_correction_bias`` [1, E]): the config read (interleaved rope, tied embeddings,
experts placed by ``moe_layer_start_index`` / ``moe_layer_end_index`` / ``moe_layer_interval`` as
transformers places them, softmax routing with the statistics bias, shared experts), logits equal in fp32
(1e-5 of the logits' scale) and bf16 (5 %), chunked prefill + steps equal to one pass, transformers' cache
bytes after a prefill, parameters from config.json equal to the saved tensors; ``use_bias`` refused by name.
"""

from __future__ import annotations

import pytest
import torch

from storelab.checkpoint import load
from storelab.checkpoint.config_only import read_model_config
from storelab.checkpoint.families.ernie4_5_moe import FAMILY
from storelab.checkpoint.shards import CheckpointError
from storelab.models.accounting import count_params
from storelab.models.engines import state_bytes
from tests.helpers import assert_close
from tests.test_families import cache_bytes, ids_of

MODEL_TYPE = "ernie4_5_moe"
COMMON = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              vocab_size=128, intermediate_size=96, moe_intermediate_size=32, moe_num_experts=4, moe_k=2,
              moe_num_shared_experts=1, moe_layer_start_index=1, moe_layer_end_index=2,
              max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)
TINY = {"ernie4_5_moe": COMMON}


def test_config_read(saved):
    hf, folder = saved("ernie4_5_moe")
    cfg = read_model_config(folder)
    att = cfg.layers[0].token
    assert att.rope_interleaved and att.partial_rotary == 1.0 and not (att.qkv_bias or att.out_bias)
    assert cfg.tie_embeddings and att.rope_theta == hf.config.rope_parameters["rope_theta"]
    assert [lay.channel.KIND for lay in cfg.layers] == ["ffn", "moe", "moe", "ffn"]
    ch = cfg.layers[1].channel
    assert (ch.router, ch.router_bias, ch.norm_topk_prob, ch.n_experts, ch.top_k) == ("softmax", True, True, 4, 2)
    assert ch.shared_width == 32 and cfg.layers[0].channel.d_ff == 96


@pytest.mark.parametrize("start,end,every", [(0, -1, 2), (1, 5, 3), (2, -1, 1)])
def test_expert_layers_placed_as_transformers_places_them(start, end, every):
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = dict(COMMON, num_hidden_layers=7, moe_layer_start_index=start, moe_layer_end_index=end,
              moe_layer_interval=every)
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(MODEL_TYPE, **kw))
    theirs = [type(lay.mlp).__name__.endswith("SparseMoeBlock") for lay in hf.model.layers]
    ours = [lay.channel.KIND == "moe" for lay in FAMILY.to_config(dict(kw, model_type=MODEL_TYPE)).layers]
    assert ours == theirs and any(ours)


def test_mtp_tensors_ignored():
    import re

    pats = FAMILY.ignored(dict(COMMON, model_type=MODEL_TYPE))
    for name in ("model.mtp_block.0.self_attn.q_proj.weight", "model.mtp_linear_proj.0.weight",
                 "model.mtp_emb_norm.0.weight"):
        assert any(re.search(p, name) for p in pats), name
    assert not any(re.search(p, "model.layers.1.mlp.gate.weight") for p in pats)


def test_use_bias_refused():
    with pytest.raises(CheckpointError, match="use_bias"):
        FAMILY.to_config(dict(COMMON, model_type=MODEL_TYPE, use_bias=True))


def tiny_hf(name: str):
    """A tiny random transformers model; tensors that start constant (norms, the choice bias) perturbed so
    that a wrong mapping shows in the logits."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(MODEL_TYPE, **TINY[name])).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for t in hf.state_dict().values():
            if t.dtype.is_floating_point and (t.dim() == 1 or bool((t == t.flatten()[0]).all())):
                t.add_(0.1 * torch.randn(t.shape, generator=g))
    return hf


_BUILT: dict = {}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    def get(name: str):
        if name not in _BUILT:
            hf = tiny_hf(name)
            d = tmp_path_factory.mktemp(name)
            hf.save_pretrained(d)
            _BUILT[name] = (hf, d)
        return _BUILT[name]

    yield get
    _BUILT.clear()


@pytest.mark.parametrize("name", list(TINY))
def test_logits_equal_transformers(name, saved):
    hf, folder = saved(name)
    ours = load(folder)
    ids = ids_of(21)
    with torch.no_grad():
        ref = hf(ids).logits
        got, _ = ours(ids)
    tol = 1e-5 * ref.abs().max().item()
    assert_close(got, ref, atol=tol, what=f"{name} logits")
    with torch.no_grad():  # chunked prefill, then single tokens, equal one pass
        cache, parts = None, []
        for a, b in ((0, 5), (5, 13), (13, 14), (14, 21)):
            out, cache = ours(ids[:, a:b], cache)
            parts.append(out)
    assert_close(torch.cat(parts, 1), got, atol=tol, what=f"{name} chunked")


@pytest.mark.parametrize("name", list(TINY))
def test_bf16_logits(name, saved):
    hf, folder = saved(name)
    ours = load(folder, dtype="bf16")
    ids = ids_of(13)
    with torch.no_grad():
        ref = hf.to(torch.bfloat16)(ids).logits.float()
        hf.to(torch.float32)
        got = ours(ids)[0].float()
    scale, err = ref.abs().max().item(), (got - ref).abs().max().item()
    assert err <= 0.05 * scale, f"{name}: bf16 logits differ by {err:.3e} (scale {scale:.3e})"


@pytest.mark.parametrize("name", list(TINY))
@pytest.mark.parametrize("T", [4, 6, 17])
def test_memory_equals_transformers_cache(name, T, saved):
    hf, folder = saved(name)
    cfg = read_model_config(folder)
    with torch.no_grad():
        past = hf(ids_of(T), use_cache=True).past_key_values
    assert sum(state_bytes(cfg, T, engine="transformers", dtype="fp32").values()) == cache_bytes(past)


@pytest.mark.parametrize("name", list(TINY))
def test_config_counts_equal_transformers(name, saved):
    """Parameters from config.json alone equal the saved tensors (the choice bias, a buffer, included)."""
    hf, folder = saved(name)
    cfg = read_model_config(folder / "config.json")
    held = {t.data_ptr(): t.numel() for t in hf.state_dict().values() if t.dtype.is_floating_point}
    assert count_params(cfg).stored == sum(held.values())
