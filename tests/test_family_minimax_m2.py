"""MiniMax-M2 (``storelab/checkpoint/families/minimax_m2.py``) against transformers 5.23's tiny ``minimax_m2``
saved with ``save_pretrained`` (which writes the release's names: ``block_sparse_moe``, per-expert
``w1/w3/w2``, ``block_sparse_moe.e_score_correction_bias``): the config read (q/k norms over all heads,
``rotary_dim`` as the rotated fraction, sigmoid routing with the choice bias), logits equal in fp32 (1e-5 of
the logits' scale) and bf16 (5 %), chunked prefill + steps equal to one pass, transformers' cache bytes
after a prefill, parameters from config.json equal to the saved tensors; the published MiniMax-M2.7 config
against the model card (230B total, 10B active, as rounded there); the fields it refuses, named.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from storelab.checkpoint import load
from storelab.checkpoint.config_only import read_model_config
from storelab.checkpoint.families.minimax_m2 import FAMILY
from storelab.checkpoint.shards import CheckpointError
from storelab.models.accounting import count_params
from storelab.models.engines import state_bytes
from tests.helpers import assert_close
from tests.test_families import cache_bytes, ids_of

FIXTURES = Path(__file__).parent / "fixtures" / "configs"
MODEL_TYPE = "minimax_m2"
COMMON = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              vocab_size=128, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, rotary_dim=8,
              max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)
TINY = {"minimax_m2": COMMON}


def test_config_read(saved):
    hf, folder = saved("minimax_m2")
    cfg = read_model_config(folder)
    att, ch = cfg.layers[0].token, cfg.layers[0].channel
    assert att.KIND == "attention" and att.qk_norm and att.qk_norm_scope == "all"
    assert att.partial_rotary == 0.5 and not (att.qkv_bias or att.out_bias) and att.rope_theta == 5e6
    assert (ch.KIND, ch.router, ch.router_bias, ch.norm_topk_prob) == ("moe", "sigmoid", True, True)
    assert (ch.n_experts, ch.top_k, ch.d_expert, ch.shared_width) == (4, 2, 32, 0)
    assert all(lay.channel.KIND == "moe" for lay in cfg.layers)


def test_release_fields_read_and_refused():
    """The release's own fields: ``rotary_dim`` (no rope_parameters), ``use_routing_bias``, ``use_qk_norm``;
    lightning-attention layers and a shared expert refused naming the field."""
    hf = json.loads((FIXTURES / "MiniMax-M2.7.json").read_text())
    cfg = FAMILY.to_config(dict(hf, use_routing_bias=False, use_qk_norm=False))
    assert not cfg.layers[0].channel.router_bias and not cfg.layers[0].token.qk_norm
    assert cfg.layers[0].token.partial_rotary == 64 / 128
    with pytest.raises(CheckpointError, match=r"attn_type_list\[3\]"):
        FAMILY.to_config(dict(hf, attn_type_list=[1, 1, 1, 0] + [1] * 58))
    with pytest.raises(CheckpointError, match="shared_intermediate_size"):
        FAMILY.to_config(dict(hf, shared_intermediate_size=1536))


def test_mtp_modules_ignored():
    hf = json.loads((FIXTURES / "MiniMax-M2.7.json").read_text())
    import re

    pats = FAMILY.ignored(hf)
    assert any(re.search(p, "model.layers.62.mlp.gate.weight") for p in pats)
    assert any(re.search(p, "model.mtp.layers.0.self_attn.q_proj.weight") for p in pats)
    assert not any(re.search(p, "model.layers.61.block_sparse_moe.gate.weight") for p in pats)


def test_published_counts():
    """MiniMax-M2's card: 230B total, 10B active; ours 228.69B and 10.42B active beside the input embedding
    (a lookup, not read as weights), which round to the card's figures."""
    hf = json.loads((FIXTURES / "MiniMax-M2.7.json").read_text())
    pa = count_params(read_model_config(FIXTURES / "MiniMax-M2.7.json"))
    assert round(pa.stored / 1e10) * 10 == 230 and abs(pa.stored / 1e9 - 230) <= 0.015 * 230
    assert round((pa.active - hf["vocab_size"] * hf["hidden_size"]) / 1e9) == 10


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
