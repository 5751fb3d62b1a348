"""Chunked attention (``chunked``, Llama 4) and Llama 4's attention options: the store against the plain
masked form (value and gradient), calls cut anywhere vs one pass, what it keeps between calls vs its
footprint, and transformers' ``Llama4TextAttention`` on a chunked RoPE layer and a NoPE layer."""

from __future__ import annotations

import math

import pytest
import torch

from storelab.ops.attention import KERNELS, attend_reference
from storelab.state import loose_views
from storelab.stores.attention import AttentionConfig, temperature_factor
from storelab.stores.chunked import ChunkedConfig
from tests.helpers import assert_close, capture, one_pass_and_chunks, tiny_hf_model

D = 16
DIMS = dict(d_model=D, n_heads=4, n_kv_heads=2, head_dim=8)
LLAMA4 = dict(rope_interleaved=True, qk_l2_norm=True)


def _store(chunk: int, *, kernel: str = "fused", dtype=torch.float32, **kw):
    torch.manual_seed(0)
    m = ChunkedConfig(**{**DIMS, **kw}, chunk=chunk, kernel=kernel).build().to(dtype)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m


def chunk_mask(T: int, chunk: int) -> torch.Tensor:
    """[T, T] bool: causal, and the key in the query's chunk."""
    p = torch.arange(T)
    return (p[None, :] <= p[:, None]) & (p[None, :] // chunk == p[:, None] // chunk)


def plain(m, x: torch.Tensor) -> torch.Tensor:
    """The store's output in the plain form: every score materialised under the chunk mask."""
    q, k, v, gate = m.project(x, torch.arange(x.shape[1]))
    o = attend_reference(q, k, v, scale=m.cfg.scale, mask_TL=chunk_mask(x.shape[1], m.cfg.chunk), sinks_H=m.sinks)
    return m.finish(o, gate)


OPTIONS = [dict(), dict(LLAMA4), dict(sink=True, gate=True, v_head_dim=4), dict(partial_rotary=0.0,
           attn_temperature_tuning=True, floor_scale=3, attn_temperature_scale=0.5)]


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("chunk", [1, 3, 4, 16])
@pytest.mark.parametrize("opts", OPTIONS, ids=["plain", "llama4", "sink-gate-v4", "nope-temperature"])
def test_store_matches_the_plain_masked_form_in_value_and_gradient(kernel, chunk, opts):
    m = _store(chunk, kernel=kernel, dtype=torch.float64, **opts)
    x = torch.randn(2, 11, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    y, st = m(x)
    want = plain(m, x)
    assert_close(y, want, 1e-12, "output")
    params = [x, *m.parameters()]
    g, g_want = (torch.autograd.grad((t * t.detach().sin()).sum(), params) for t in (y, want))
    for (name, a, b) in zip(["x"] + [n for n, _ in m.named_parameters()], g, g_want):
        assert_close(a, b, 1e-10, f"grad {name}")
    assert st.seen == 11 and st.entries == 11 % chunk
    with torch.no_grad():  # without autograd the fused kernel takes its other path (the flash parts, merged)
        assert_close(m(x)[0], want, 1e-12, "output without gradient")


def test_a_chunk_longer_than_the_context_is_full_attention():
    m = _store(16, **LLAMA4)
    full = AttentionConfig(**DIMS, **LLAMA4).build()
    full.load_state_dict(m.state_dict())
    x = torch.randn(2, 11, D, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        assert_close(m(x)[0], full(x)[0], 1e-5, "chunk 16 over 11 tokens")


def test_a_query_reads_nothing_before_its_chunk():
    m = _store(4)
    x = torch.randn(1, 12, D, generator=torch.Generator().manual_seed(3))
    x2 = x.clone()
    x2[:, 5] += 1.0  # in the second chunk (positions 4..7)
    with torch.no_grad():
        changed = (m(x)[0] - m(x2)[0]).abs().amax(-1)[0] > 1e-6
    assert changed.tolist() == [5 <= t < 8 for t in range(12)]


@pytest.mark.parametrize("kernel", sorted(KERNELS))
@pytest.mark.parametrize("chunks", [[1] * 11, [3, 1, 4, 2, 1], [4, 4, 3], [5, 6], [11], [2, 9]])
def test_prefill_in_chunks_then_steps_equals_one_pass(kernel, chunks):
    m = _store(4, kernel=kernel, **LLAMA4, attn_temperature_tuning=True, floor_scale=2)
    x = torch.randn(2, 11, D, generator=torch.Generator().manual_seed(4))
    want, full, got, st = one_pass_and_chunks(m, x, chunks)
    assert_close(got, want, 1e-5, f"calls {chunks}")
    assert st.seen == full.seen == 11 and st.entries == full.entries == 3
    assert_close(st.k, full.k, 1e-6, "kept keys")


@pytest.mark.parametrize("chunk", [1, 3, 4])
def test_footprint_equals_measured_bytes_at_every_length(chunk):
    cfg = ChunkedConfig(**DIMS, v_head_dim=4, chunk=chunk)
    m = cfg.build()
    st = None
    with torch.no_grad():
        for L in range(1, 10):
            _, st = m(torch.randn(1, 1, D), st)
            fp = cfg.footprint(L, dtype="fp32")
            assert st.entries == fp.kept == fp.read == L % chunk, L
            assert st.nbytes() == fp.state_bytes == (L % chunk) * 2 * (8 + 4) * 4, L
            assert st.k is None if L % chunk == 0 else st.k.untyped_storage().nbytes() == st.k.numel() * 4
    with torch.no_grad():  # a call that crosses chunks and ends inside one keeps copies, not views of its keys
        _, st = m(torch.randn(1, 2 * chunk + 1, D), st)
    assert loose_views(st) == [] and st.entries == (9 + 2 * chunk + 1) % chunk
    assert cfg.memory_terms(cache="bf16").per_sequence == (chunk - 1) * 2 * (8 + 4) * 2
    assert cfg.memory_terms().per_token == 0


def test_num_params_counts_the_module():
    cfg = ChunkedConfig(**DIMS, chunk=4, sink=True, qkv_bias=True, **LLAMA4)
    assert cfg.num_params().stored == sum(p.numel() for p in cfg.build().parameters())


@pytest.mark.parametrize("field, value", [("chunk", 0), ("chunk", 2.0), ("floor_scale", 0),
                                          ("attn_temperature_scale", -1)])
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field}:"):
        ChunkedConfig(**{**DIMS, "chunk": 4, field: value})


def test_temperature_factor_is_one_below_floor_scale_then_the_log():
    f = temperature_factor(torch.tensor([0, 6, 7, 8, 15, 8191]), 8, 0.1)
    floors = [0, 0, 1, 1, 2, 1024]  # floor((p + 1) / 8)
    want = torch.tensor([1 + 0.1 * math.log1p(n) for n in floors])
    assert_close(f, want, 1e-6, "factor")


# ---------------------------------------------------------------------------- the oracle
@pytest.fixture(scope="module")
def llama4():
    # layer 0: RoPE, chunked (4 tokens), qk L2 norm; layer 1: NoPE, global, temperature tuning (floor 3)
    model = tiny_hf_model("llama4_text", vocab_size=64, hidden_size=32, intermediate_size=32, intermediate_size_mlp=32,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                          num_local_experts=2, no_rope_layers=[1, 0], attention_chunk_size=4, use_qk_norm=True,
                          attn_temperature_tuning=True, floor_scale=3, attn_scale=0.5,
                          rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    torch.manual_seed(5)
    with torch.no_grad():  # sharper than the 0.02 initialisation, so that a wrong position or mask shows
        for layer in model.model.layers:
            for p in layer.self_attn.parameters():
                p.copy_(torch.randn_like(p) * 0.3)
    return model


def _ours_from(attn, cfg):
    m = cfg.build()
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            getattr(m, name).weight.copy_(getattr(attn, name).weight)
    return m


@pytest.mark.parametrize("layer", [0, 1], ids=["chunked-rope", "nope-global"])
@pytest.mark.parametrize("kernel", sorted(KERNELS))
def test_matches_transformers_llama4_attention(llama4, layer, kernel):
    hf = llama4.config
    assert hf.layer_types == ["chunked_attention", "full_attention"]
    attn = llama4.model.layers[layer].self_attn
    ids = torch.randint(3, 64, (2, 13), generator=torch.Generator().manual_seed(6))
    _, kw, out = capture(llama4, attn, ids)
    x, want = kw["hidden_states"], out[0]
    common = dict(d_model=32, n_heads=4, n_kv_heads=2, head_dim=8, norm_eps=hf.rms_norm_eps, kernel=kernel)
    if layer == 0:
        cfg = ChunkedConfig(**common, chunk=hf.attention_chunk_size, rope_theta=500000.0, rope_interleaved=True,
                            qk_l2_norm=True)
    else:
        cfg = AttentionConfig(**common, partial_rotary=0.0, attn_temperature_tuning=True, floor_scale=hf.floor_scale,
                              attn_temperature_scale=hf.attn_scale)
    m = _ours_from(attn, cfg)
    with torch.no_grad():
        got, _ = m(x)
        st, steps = None, []
        for t0, t1 in ((0, 5), (5, 6), (6, 9), (9, 13)):  # calls across the chunk boundaries
            y, st = m(x[:, t0:t1], st)
            steps.append(y)
    assert_close(got, want, 1e-5, f"layer {layer} one pass")
    assert_close(torch.cat(steps, 1), want, 1e-5, f"layer {layer} in calls")
