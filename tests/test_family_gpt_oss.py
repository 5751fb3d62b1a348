"""gpt-oss (``storelab/checkpoint/families/gpt_oss.py``) and the two moe-store devices it needs.

The devices: a learned bias on the router's logits (``router_logit_bias``) and per-expert biases on gate/up
and down (``expert_biases``): the grouped dispatch equals the dense reference with the biases, in value and
gradient; the store equals a per-token loop written from the formula; the counts are exact.

The family against transformers 5.23's tiny ``gpt_oss`` saved with ``save_pretrained``: the config read
(window 127 = sliding_window - 1, sinks on every layer, biases, the clamped SwiGLU), logits equal in fp32
(1e-5 of the logits' scale) and bf16 (5 %), chunked prefill + steps equal to one pass, transformers'
cache bytes after a prefill of 4, 6, 17 tokens (the window of 6 not filled, filled, passed), parameters from
config.json equal to the saved tensors; with YaRN where storelab runs it, else the refusal naming the field.
The published gpt-oss-20b / 120b configs against the paper's table (arXiv 2508.10925, Table 1: 20.91B / 3.61B,
116.83B / 5.13B; its active count leaves out the unembedding).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from storelab.checkpoint import load
from storelab.checkpoint.config_only import read_model_config
from storelab.checkpoint.families._reader import RUNS_ROPE
from storelab.checkpoint.shards import CheckpointError
from storelab.models.accounting import count_params
from storelab.models.engines import state_bytes
from storelab.ops.routing import clamped_swiglu, dense_moe_reference, grouped_swiglu
from storelab.stores.moe import MoEConfig
from tests.helpers import assert_close
from tests.test_families import cache_bytes, ids_of

FIXTURES = Path(__file__).parent / "fixtures" / "configs"


# -- the moe store's biases ----------------------------------------------------------------------------
def test_grouped_dispatch_with_biases_matches_dense_reference():
    torch.manual_seed(0)
    N, D, E, K, I = 13, 8, 5, 2, 6
    x = torch.randn(N, D, dtype=torch.float64, requires_grad=True)
    experts = torch.randint(0, E, (N, K))
    experts[:, 0] = torch.arange(N) % 4              # expert 4 only where chosen second, some experts unused
    w = torch.rand(N, K, dtype=torch.float64)
    params = [torch.randn(E, 2 * I, D, dtype=torch.float64), torch.randn(E, D, I, dtype=torch.float64),
              torch.randn(E, 2 * I, dtype=torch.float64), torch.randn(E, D, dtype=torch.float64)]
    for p in params:
        p.requires_grad_(True)
    gu, dn, gub, dnb = params

    def act(g, u):
        return clamped_swiglu(g, u, alpha=1.702, limit=1.5, up_shift=1.0)

    fast = grouped_swiglu(x, experts, w, gu, dn, act=act, gate_up_bias_EF=gub, down_bias_ED=dnb)
    ref = dense_moe_reference(x, experts, w, gu, dn, act=act, gate_up_bias_EF=gub, down_bias_ED=dnb)
    assert_close(fast, ref, 1e-10, "dispatch with biases")
    g = torch.randn_like(ref)
    got = torch.autograd.grad((fast * g).sum(), [x] + params)
    want = torch.autograd.grad((ref * g).sum(), [x] + params)
    for name, a, b in zip(("x", "gate_up", "down", "gate_up_bias", "down_bias"), got, want):
        assert_close(a, b, 1e-10, f"gradient of {name}")
    # by hand for one token: w * (W_down act(W_gu x + b_gu) + b_down), summed over its K experts
    n = 3
    h = sum(w[n, k] * (dn[e] @ act(*(gu[e] @ x[n] + gub[e]).chunk(2)) + dnb[e])
            for k, e in enumerate(experts[n].tolist()))
    assert_close(fast[n], h, 1e-10, "token 3 by hand")


def test_store_with_router_and_expert_biases_equals_a_loop():
    """gpt-oss's routing (softmax over the top-k of W x + b) and biased clamped experts, token by token."""
    torch.manual_seed(1)
    cfg = MoEConfig(d_model=8, n_experts=4, top_k=2, d_expert=6, router_logit_bias=True, expert_biases=True,
                    activation="clamped_swiglu", swiglu_limit=1.0)
    m = cfg.build().double()
    with torch.no_grad():
        for p in (m.router.bias, m.gate_up_bias, m.down_bias):
            p.normal_()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    y, _ = m(x)
    want = torch.zeros_like(x)
    for b in range(2):
        for t in range(5):
            logits = m.router.weight @ x[b, t] + m.router.bias
            top = torch.topk(logits, 2)
            for wt, e in zip(torch.softmax(top.values, -1), top.indices.tolist()):
                g, u = (m.gate_up[e] @ x[b, t] + m.gate_up_bias[e]).chunk(2)
                h = clamped_swiglu(g, u, alpha=1.702, limit=1.0, up_shift=1.0)
                want[b, t] += wt * (m.down[e] @ h + m.down_bias[e])
    assert_close(y, want, 1e-10, "moe with biases")
    y.sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in (m.router.bias, m.gate_up_bias, m.down_bias))


@pytest.mark.parametrize("kw", [dict(router_logit_bias=True), dict(expert_biases=True),
                                dict(router_logit_bias=True, expert_biases=True, n_shared=1, router_bias=True)])
def test_bias_counts_are_exact(kw):
    cfg = MoEConfig(d_model=8, n_experts=5, top_k=2, d_expert=6, **kw)
    m = cfg.build()
    stored = sum(p.numel() for p in m.parameters()) + (cfg.n_experts if cfg.router_bias else 0)
    assert cfg.num_params().stored == stored
    per_expert = 3 * 6 * 8 + (2 * 6 + 8 if cfg.expert_biases else 0)
    assert cfg.num_params().active == stored - 3 * per_expert


# -- the family against transformers ----------------------------------------------------------------------
COMMON = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
              intermediate_size=32, head_dim=16, num_local_experts=4, num_experts_per_tok=2, sliding_window=6,
              swiglu_limit=1.5, max_position_embeddings=512, bos_token_id=1, eos_token_id=2, pad_token_id=0)
TINY = {
    "plain": dict(COMMON, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
    # YaRN with a short pretraining length, so that it changes the frequencies of a 21-token test
    "yarn": dict(COMMON, max_position_embeddings=32,
                 rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32.0,
                                  "beta_slow": 1.0, "original_max_position_embeddings": 8, "truncate": False}),
}


def tiny_hf(name: str):
    """A tiny random transformers model; tensors that start constant (norms, the experts' biases) perturbed so
    that a wrong mapping shows in the logits."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model("gpt_oss", **TINY[name])).eval()
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


def test_config_read(saved):
    hf, folder = saved("plain")
    cfg = read_model_config(folder)
    kinds = [type(lay.token).__name__ for lay in cfg.layers]
    assert kinds == ["WindowConfig", "AttentionConfig"] * 2 and hf.config.layer_types[0] == "sliding_attention"
    assert cfg.layers[0].token.window == 5 and all(lay.token.sink for lay in cfg.layers)
    assert all(lay.token.qkv_bias and lay.token.out_bias for lay in cfg.layers)
    ch = cfg.layers[0].channel
    assert (ch.KIND, ch.router, ch.norm_topk_prob, ch.router_logit_bias, ch.expert_biases) == ("moe", "softmax", True,
                                                                                              True, True)
    assert (ch.activation, ch.swiglu_alpha, ch.swiglu_limit, ch.swiglu_up_shift) == ("clamped_swiglu", 1.702, 1.5, 1)
    assert not ch.router_bias and (ch.n_experts, ch.top_k, ch.d_expert) == (4, 2, 32)


def _runs(name):
    return name == "plain" or TINY[name]["rope_parameters"]["rope_type"] in RUNS_ROPE


@pytest.mark.parametrize("name", list(TINY))
def test_logits_equal_transformers(name, saved):
    hf, folder = saved(name)
    if not _runs(name):
        with pytest.raises(CheckpointError, match="rope_type"):
            load(folder)
        return
    ours = load(folder)
    ids = ids_of(21)
    with torch.no_grad():
        ref = hf(ids).logits
        got, _ = ours(ids)
    tol = 1e-5 * ref.abs().max().item()
    assert_close(got, ref, atol=tol, what=f"gpt_oss {name} logits")
    with torch.no_grad():  # chunks across the window of 5 earlier tokens, then single tokens
        cache, parts = None, []
        for a, b in ((0, 3), (3, 11), (11, 12), (12, 13), (13, 21)):
            out, cache = ours(ids[:, a:b], cache)
            parts.append(out)
    assert_close(torch.cat(parts, 1), got, atol=tol, what=f"gpt_oss {name} chunked")


def test_bf16_logits(saved):
    hf, folder = saved("plain")
    ours = load(folder, dtype="bf16")
    ids = ids_of(13)
    with torch.no_grad():
        ref = hf.to(torch.bfloat16)(ids).logits.float()
        hf.to(torch.float32)
        got = ours(ids)[0].float()
    scale, err = ref.abs().max().item(), (got - ref).abs().max().item()
    assert err <= 0.05 * scale, f"gpt_oss bf16 logits differ by {err:.3e} (scale {scale:.3e})"


@pytest.mark.parametrize("T", [4, 6, 17])
def test_memory_equals_transformers_cache(T, saved):
    hf, folder = saved("plain")
    cfg = read_model_config(folder)
    with torch.no_grad():
        past = hf(ids_of(T), use_cache=True).past_key_values
    assert sum(state_bytes(cfg, T, engine="transformers", dtype="fp32").values()) == cache_bytes(past)


def test_config_counts_equal_transformers(saved):
    hf, folder = saved("plain")
    cfg = read_model_config(folder / "config.json")
    held = {t.data_ptr(): t.numel() for t in hf.state_dict().values() if t.dtype.is_floating_point}
    assert count_params(cfg).stored == sum(held.values())


# -- the published configs ------------------------------------------------------------------------------------
@pytest.mark.parametrize("stem,total,active", [("gpt-oss-20b", 20.91, 3.61), ("gpt-oss-120b", 116.83, 5.13)])
def test_published_counts(stem, total, active):
    """The paper's Table 1 to its two decimals; its active count leaves out the unembedding (V x D)."""
    hf = json.loads((FIXTURES / f"{stem}.json").read_text())
    cfg = read_model_config(FIXTURES / f"{stem}.json")
    pa = count_params(cfg)
    assert round(pa.stored / 1e9, 2) == total
    assert round((pa.active - hf["vocab_size"] * hf["hidden_size"]) / 1e9, 2) == active
    assert [lay.token.KIND for lay in cfg.layers[:2]] == ["window", "attention"]
    assert cfg.layers[0].token.window == 127 and cfg.layers[0].channel.n_experts == hf["num_local_experts"]


def test_mxfp4_release_refused_for_running_not_for_accounting():
    from storelab.checkpoint.families.gpt_oss import FAMILY

    hf = json.loads((FIXTURES / "gpt-oss-20b.json").read_text())
    FAMILY.to_config(hf)  # accounting reads it
    with pytest.raises(CheckpointError, match=r"quantization_config\.quant_method: 'mxfp4'"):
        FAMILY.runs(dict(hf, rope_scaling=None))
    FAMILY.runs(dict(hf, rope_scaling=None, quantization_config=None))  # the bf16 copies run
