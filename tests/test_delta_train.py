"""The hand-written chunked backward (``storelab.ops.delta_train``): the path training takes, its
gradients against the per-token rule, its range handling for per-channel decays, bf16 inputs, what
it keeps for backward (linear in T) and gradients arriving expanded (``o.sum()``). Small states train
through the per-token C kernel (``delta_step``, tests/test_delta_step.py), so every test here turns it off."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from storelab.ops import gated_delta_rule, kda
from storelab.ops.delta_train import fits_factored, training_chunk

B, T, H, HV, K, V = 2, 45, 1, 2, 8, 6


@pytest.fixture(autouse=True)
def _chunked_form(monkeypatch):
    import storelab.ops.delta_step as ds

    monkeypatch.setattr(ds, "MAX_STATE", 0)  # no state is small enough for the per-token kernel


def _inputs(per_channel, *, T=T, dtype=torch.float64, strength=1.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), dim=-1)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen, dtype=torch.float64), dim=-1)
    v = torch.randn(B, T, HV, V, generator=gen, dtype=torch.float64)
    beta = torch.rand(B, T, HV, generator=gen, dtype=torch.float64)
    shape = (B, T, HV, K) if per_channel else (B, T, HV)
    g = F.logsigmoid(torch.randn(*shape, generator=gen, dtype=torch.float64) + 2.0) * strength
    h0 = torch.randn(B, HV, K, V, generator=gen, dtype=torch.float64)
    return [t.to(dtype).requires_grad_() for t in (q, k, v, g, beta, h0)]


def _grads(op, x, mode, chunk_size=16):
    q, k, v, g, beta, h0 = x
    o, S = op(q, k, v, g=g, beta=beta, initial_state=h0, output_final_state=True, chunk_size=chunk_size, mode=mode)
    gen = torch.Generator().manual_seed(1)
    do, dS = torch.randn(o.shape, generator=gen).to(o.dtype), torch.randn(S.shape, generator=gen).to(S.dtype)
    return o, S, torch.autograd.grad((o * do).sum() + (S * dS).sum(), x)


@pytest.mark.parametrize("op, per_channel", [(gated_delta_rule, False), (kda, True)])
def test_training_takes_the_hand_written_backward_and_equals_the_per_token_rule(op, per_channel):
    x = _inputs(per_channel)
    o, S, got = _grads(op, x, "chunk")
    assert "DeltaChunks" in o.grad_fn.name()  # not an autograd graph of the chunk products
    o_ref, S_ref, want = _grads(op, x, "recurrent")
    torch.testing.assert_close(o, o_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(S, S_ref, rtol=0, atol=1e-12)
    for name, a, b in zip("q k v g beta h0".split(), got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11, msg=lambda m: f"d{name}: {m}")


@pytest.mark.parametrize("op, per_channel", [(gated_delta_rule, False), (kda, True)])
@pytest.mark.parametrize("chunks_per_group", [1, 2])
def test_chunks_in_groups_give_the_same_gradients(op, per_channel, chunks_per_group, monkeypatch):
    # T = 45 is three chunks of 16, the last one padded: groups of one chunk, and of two then one, carry the state
    # forward and its gradient back across their boundaries
    import storelab.ops.delta_train as dt

    x = _inputs(per_channel)
    monkeypatch.setattr(dt, "GROUP_FLOATS", chunks_per_group * B * HV * 16 * 16 // (64 // K))
    assert len(dt._groups(3, B * HV, 16, K, V)) == (3 if chunks_per_group == 1 else 2)
    o, S, got = _grads(op, x, "chunk")
    o_ref, S_ref, want = _grads(op, x, "recurrent")
    torch.testing.assert_close(o, o_ref, rtol=0, atol=1e-12)
    torch.testing.assert_close(S, S_ref, rtol=0, atol=1e-12)
    for name, a, b in zip("q k v g beta h0".split(), got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-11, msg=lambda m: f"d{name}: {m}")


def test_the_training_chunk_follows_the_key_width():
    # min(chunk_size, max(16, K / 2)), K rounded down to a power of two; never above what was asked
    assert [training_chunk(None, 32, K) for K in (8, 16, 32, 48, 64, 128, 256)] == [16, 16, 16, 16, 32, 32, 32]
    assert [training_chunk(None, 64, K) for K in (16, 64, 128, 256)] == [16, 32, 64, 64]
    assert training_chunk(None, 8, 128) == 8 and training_chunk(torch.zeros(1, 4, 1), 64, 128) == 64


def test_per_channel_decays_beyond_the_factored_range_halve_the_chunk_then_fall_back():
    g = torch.full((1, 64, 1, 4), -1.0)                     # a span of 64 per chunk of 64: within 2 x 40
    assert fits_factored(g, 64) and training_chunk(g, 64, 128) == 64
    g[:, :, :, 0] = -3.0                                    # 192 over 64 tokens: the chunk halves to 16
    assert not fits_factored(g, 64) and training_chunk(g, 64, 128) == 16
    g[0, 5, 0, 1] = -100.0                                  # one token alone beyond the range: no chunk fits
    assert training_chunk(g, 64, 128) == 0
    for strength in (30.0, 300.0):                          # strong decays: both answers still exact
        x = [t.detach().float().requires_grad_() for t in _inputs(True, strength=strength)]
        o, S, got = _grads(kda, x, "chunk", chunk_size=32)
        x64 = [t.detach().double().requires_grad_() for t in x]
        o_ref, S_ref, want = _grads(kda, x64, "recurrent")
        assert (o.double() - o_ref).abs().max() < 1e-4
        for a, b in zip(got, want):
            assert torch.isfinite(a).all()
            assert (a.double() - b).abs().max() <= 1e-3 * max(1.0, b.abs().max().item())


def test_bf16_inputs_keep_fp32_state_and_return_bf16_gradients():
    x = [t.detach().to(torch.bfloat16).requires_grad_() for t in _inputs(False)]
    o, S, got = _grads(gated_delta_rule, x, "chunk")
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32
    assert all(a.dtype == torch.bfloat16 and torch.isfinite(a).all() for a in got)
    x32 = [t.detach().float().requires_grad_() for t in x]
    _, _, want = _grads(gated_delta_rule, x32, "chunk")
    for a, b in zip(got, want):
        assert (a.float() - b).pow(2).mean().sqrt() <= 0.02 * b.pow(2).mean().sqrt()


def _saved_bytes(per_channel, T):
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    q, k, v, g, beta, _ = [t.detach().float().requires_grad_() for t in _inputs(per_channel, T=T)]
    op = kda if per_channel else gated_delta_rule
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        o, _ = op(q, k, v, g=g, beta=beta)
    o.sum().backward()  # a gradient arriving expanded (stride 0) is taken as it is
    assert torch.isfinite(q.grad).all() and q.grad.abs().sum() > 0
    return sum(seen.values())


@pytest.mark.parametrize("per_channel", [False, True])
def test_what_backward_keeps_grows_linearly_with_length(per_channel):
    short, long = _saved_bytes(per_channel, 256), _saved_bytes(per_channel, 1024)
    assert 3.6 <= long / short <= 4.4, (short, long)
