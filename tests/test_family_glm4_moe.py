"""GLM-4.5 (``storelab/checkpoint/families/glm4_moe.py``) against transformers 5.23's tiny ``glm4_moe`` saved
with ``save_pretrained``: the config read (half-rotary heads, q/k/v biases without an o bias, per-head q/k
norms where ``use_qk_norm``, one dense layer, sigmoid experts chosen with the choice bias among the best of
two groups, a shared expert, the routed scaling), logits equal in fp32 (1e-5 of the logits' scale) and bf16
(5 %), chunked prefill + steps equal to one pass, transformers' cache bytes after a prefill, parameters from
config.json equal to the saved tensors, and the MTP layers stored after the decoder ignored.
"""

from __future__ import annotations

import re

import pytest
import torch

from storelab.checkpoint import load
from storelab.checkpoint.config_only import read_model_config
from storelab.checkpoint.families.glm4_moe import FAMILY
from storelab.models.accounting import count_params
from storelab.models.engines import state_bytes
from tests.helpers import assert_close
from tests.test_families import cache_bytes, ids_of

MODEL_TYPE = "glm4_moe"
COMMON = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
              vocab_size=128, intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8,
              num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1, n_shared_experts=1,
              routed_scaling_factor=2.5, attention_bias=True, max_position_embeddings=512, bos_token_id=1,
              eos_token_id=2, pad_token_id=0)
TINY = {"glm4_moe": dict(COMMON, use_qk_norm=True)}


def test_config_read(saved):
    hf, folder = saved("glm4_moe")
    cfg = read_model_config(folder)
    att = cfg.layers[0].token
    assert att.partial_rotary == 0.5 and att.qk_norm and att.qk_norm_scope == "head"
    assert att.qkv_bias and not att.out_bias
    assert [lay.channel.KIND for lay in cfg.layers] == ["ffn", "moe", "moe"] and cfg.layers[0].channel.d_ff == 96
    ch = cfg.layers[1].channel
    assert (ch.router, ch.router_bias, ch.norm_topk_prob, ch.routed_scaling) == ("sigmoid", True, True, 2.5)
    assert (ch.n_experts, ch.top_k, ch.d_expert, ch.n_group, ch.topk_group, ch.shared_width) == (8, 2, 32, 2, 1, 32)


def test_qk_norm_and_rotary_as_configured():
    """``use_qk_norm`` false: no norms; a config without ``partial_rotary_factor`` rotates half (GLM's default)."""
    hf = dict(COMMON, model_type="glm4_moe", use_qk_norm=False, rope_theta=1e6)
    cfg = FAMILY.to_config(hf)
    assert not cfg.layers[0].token.qk_norm and cfg.layers[0].token.partial_rotary == 0.5
    assert FAMILY.to_config(dict(hf, partial_rotary_factor=1.0)).layers[0].token.partial_rotary == 1.0


def test_mtp_layers_ignored():
    pats = FAMILY.ignored(dict(COMMON, model_type="glm4_moe"))
    assert any(re.search(p, "model.layers.3.eh_proj.weight") for p in pats)
    assert not any(re.search(p, "model.layers.2.mlp.gate.weight") for p in pats)


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
