"""The recurrent ops: recurrent loop, chunked form, token-by-token steps and the affine scan agree.

Float64 at edge lengths around a chunk of 16 (below, exactly, one over, two and one over), with and
without an initial state; the essay's worked example 3 with its own numbers; the short conv's tail.
"""

import math

import pytest
import torch
import torch.nn.functional as F

from storelab.ops import (affine_scan, causal_conv1d, delta_rule, delta_states_by_scan, gated_delta_rule, kda,
                          linear_attention, recurrent_step)
from tests.helpers import assert_close

B, H, K, V, C = 2, 2, 8, 6, 16


def _inputs(T, *, HV=H, dtype=torch.float64, decay=1.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=dtype)  # noqa: E731
    return dict(
        q=r(B, T, H, K), k=F.normalize(r(B, T, H, K), dim=-1), v=r(B, T, HV, V),
        beta=torch.rand(B, T, HV, generator=g, dtype=dtype),
        g_head=F.logsigmoid(r(B, T, HV)) * decay, g_chan=F.logsigmoid(r(B, T, HV, K)) * decay,
        S0=r(B, HV, K, V),
    )


def _call(kind, x, **kw):
    q, k, v = x["q"], x["k"], x["v"]
    if kind == "linear_attention":
        return linear_attention(q, k, v, **kw)
    if kind == "linear_attention_decay":
        return linear_attention(q, k, v, g=x["g_head"], **kw)
    if kind == "delta_rule":
        return delta_rule(q, k, v, beta=x["beta"], **kw)
    if kind == "gated_delta_rule":
        return gated_delta_rule(q, k, v, g=x["g_head"], beta=x["beta"], **kw)
    return kda(q, k, v, g=x["g_chan"], beta=x["beta"], **kw)


KINDS = ["linear_attention", "linear_attention_decay", "delta_rule", "gated_delta_rule", "kda"]


@pytest.fixture(params=["C kernel", "tensor form"])
def chunk_form(request, monkeypatch):
    """The two evaluations of the chunked form: the whole of it in C (asserted to build here), the tensor form
    (as where no C compiler is found)."""
    import storelab.ops.delta as delta_mod
    from storelab.ops.compiled import compiled_library

    if request.param == "C kernel":
        assert compiled_library("delta_chunk", delta_mod._KERNEL_SIGNATURE) is not None, "delta_chunk did not build"
    else:
        monkeypatch.setattr(delta_mod, "_chunked_compiled", lambda *a: None)
    return request.param


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("T", [7, 16, 17, 33])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.usefixtures("chunk_form")
def test_recurrent_chunk_scan_and_steps_agree(kind, T, with_state):
    x = _inputs(T)
    S0 = x["S0"] if with_state else None
    ref, S_ref = _call(kind, x, initial_state=S0, output_final_state=True, mode="recurrent")
    assert ref.abs().max() > 0.1
    for mode in ("chunk", "scan"):
        o, S = _call(kind, x, initial_state=S0, output_final_state=True, chunk_size=C, mode=mode)
        assert_close(o, ref, 1e-10, f"{kind} {mode} output")
        assert_close(S, S_ref, 1e-10, f"{kind} {mode} final state")
    if T > 17:
        return
    # one token at a time through the op, carrying the state
    S, outs = S0, []
    for t in range(T):
        xt = {n: (a[:, t:t + 1] if n != "S0" else a) for n, a in x.items()}
        o, S = _call(kind, xt, initial_state=S, output_final_state=True, chunk_size=C)
        outs.append(o)
    assert_close(torch.cat(outs, 1), ref, 1e-10, f"{kind} token by token")
    assert_close(S, S_ref, 1e-10, f"{kind} token by token, state")


@pytest.mark.parametrize("T", [5, 17])
@pytest.mark.usefixtures("chunk_form")
def test_grouped_value_heads(T):
    """Qwen3-Next's layout: 2 query/key heads serve 4 value heads (value head h reads h // 2)."""
    x = _inputs(T, HV=4)
    ref, _ = gated_delta_rule(x["q"].repeat_interleave(2, 2), x["k"].repeat_interleave(2, 2), x["v"], g=x["g_head"],
                              beta=x["beta"], mode="recurrent")
    o, _ = gated_delta_rule(x["q"], x["k"], x["v"], g=x["g_head"], beta=x["beta"], chunk_size=C)
    assert_close(o, ref, 1e-10, "grouped heads")


@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 2e-5)])
@pytest.mark.parametrize("decay", [20.0, 400.0])
@pytest.mark.usefixtures("chunk_form")
def test_kda_chunk_survives_strong_per_channel_decay(dtype, tol, decay):
    """Cumulative decays far beyond exp's range inside one chunk: the sub-chunk factorisation stays exact."""
    x = _inputs(40, dtype=dtype, decay=decay)
    ref, S_ref = kda(x["q"], x["k"], x["v"], g=x["g_chan"], beta=x["beta"], initial_state=x["S0"],
                     output_final_state=True, mode="recurrent")
    o, S = kda(x["q"], x["k"], x["v"], g=x["g_chan"], beta=x["beta"], initial_state=x["S0"], output_final_state=True,
               chunk_size=32)
    assert torch.isfinite(o).all()
    assert_close(o, ref, tol, "kda strong decay")
    assert_close(S, S_ref, tol, "kda strong decay, state")


@pytest.mark.parametrize("kind", ["gated_delta_rule", "kda"])
@pytest.mark.usefixtures("chunk_form")
def test_fast_path_at_the_edge_of_exp_range(kind):
    """A chunk decaying by about e^-108: the factored scores overflow above the diagonal, never below."""
    x = _inputs(70, dtype=torch.float64)
    x["g_head"] = torch.full_like(x["g_head"], -1.7)
    x["g_chan"] = -1.7 + 0.01 * x["g_chan"]
    ref, S_ref = _call(kind, x, initial_state=x["S0"], output_final_state=True, mode="recurrent")
    x32 = {n: a.float() for n, a in x.items()}
    o, S = _call(kind, x32, initial_state=x32["S0"], output_final_state=True, chunk_size=64)
    assert torch.isfinite(o).all() and torch.isfinite(S).all()
    assert_close(o, ref, 2e-5, f"{kind} near the exp limit")
    assert_close(S, S_ref, 2e-5, f"{kind} near the exp limit, state")


@pytest.mark.parametrize("kind", ["gated_delta_rule", "kda"])
@pytest.mark.parametrize("strong", [False, True])
@pytest.mark.usefixtures("chunk_form")
def test_many_groups_with_mixed_decay_regimes(kind, strong, monkeypatch):
    """Two chunks per group over 165 tokens, the decay changing regime along the sequence: mild (the state
    carried as S / P through a group), medium (P beyond exp's range: the state decays chunk by chunk; the
    scores above the diagonal too large for a 0/1 mask), one such chunk in a group still carried as
    S / P, and, with ``strong``, a chunk beyond the fast range (per-head decays then made group by
    group). Every group must equal the per-token loop."""
    import storelab.ops.delta as delta_mod

    monkeypatch.setattr(delta_mod, "GROUP_FLOATS", 2 * B * H * C * max(K, V, C))
    T = 165
    x = _inputs(T, dtype=torch.float32, decay=0.05)
    per_token = torch.full((T,), -0.05)
    per_token[40:100] = -3.0                  # a chunk decays by e^-48, a group by e^-96
    per_token[130:143] = -3.0                 # one chunk by e^-39 (no 0/1 mask), its group within range
    if strong:
        per_token[100:112] = -10.0            # a chunk decays by e^-132
    x["g_head"] = per_token[None, :, None] * (1 + 0.1 * x["g_head"].abs())
    x["g_chan"] = per_token[None, :, None, None] * (1 + 0.1 * x["g_chan"].abs())
    ref, S_ref = _call(kind, x, initial_state=x["S0"], output_final_state=True, mode="recurrent")
    o, S = _call(kind, x, initial_state=x["S0"], output_final_state=True, chunk_size=C)
    assert torch.isfinite(o).all() and torch.isfinite(S).all()
    assert_close(o, ref, 2e-5, f"{kind} mixed decays")
    assert_close(S, S_ref, 2e-5, f"{kind} mixed decays, state")


@pytest.mark.usefixtures("chunk_form")
def test_gdn_chunk_survives_strong_decay():
    x = _inputs(40, dtype=torch.float32, decay=300.0)
    ref, _ = gated_delta_rule(x["q"], x["k"], x["v"], g=x["g_head"], beta=x["beta"], mode="recurrent")
    o, _ = gated_delta_rule(x["q"], x["k"], x["v"], g=x["g_head"], beta=x["beta"], chunk_size=32)
    assert_close(o, ref, 2e-5, "gdn strong decay")


@pytest.mark.usefixtures("chunk_form")
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.float64, 1e-10)])
@pytest.mark.parametrize("K_,V_,C_,T", [(64, 64, 32, 100), (64, 128, 16, 41), (128, 64, 64, 130), (32, 40, 32, 64)])
def test_real_head_widths_against_the_per_token_loop(kind, dtype, tol, K_, V_, C_, T):
    """The widths real models use (64, 128: the kernels' full panels of registers, one or two of them) and one
    that fills no panel; B = 2, three heads, a last chunk cut short or not; the inputs strided (q, k and v are
    slices of wider tensors, as a fused projection leaves them)."""
    g = torch.Generator().manual_seed(1)
    Bx, Hx = 2, 3
    r = lambda *s: torch.randn(*s, generator=g, dtype=dtype)  # noqa: E731
    x = dict(q=r(Bx, T, Hx + 1, K_)[:, :, 1:], k=F.normalize(r(Bx, T, Hx + 1, K_), dim=-1)[:, :, :Hx],
             v=r(Bx, T, Hx, 2 * V_)[..., :V_], beta=torch.rand(Bx, T, Hx, generator=g, dtype=dtype),
             g_head=F.logsigmoid(r(Bx, T, Hx)) * 0.3, g_chan=F.logsigmoid(r(Bx, T, Hx, K_)) * 0.3,
             S0=r(Bx, Hx, K_, V_))
    x64 = {n: a.double() for n, a in x.items()}
    ref, S_ref = _call(kind, x64, initial_state=x64["S0"], output_final_state=True, mode="recurrent")
    o, S = _call(kind, x, initial_state=x["S0"], output_final_state=True, chunk_size=C_)
    scale = ref.abs().max().item()
    assert_close(o.double() / scale, ref / scale, tol, f"{kind} output")
    assert_close(S.double() / S_ref.abs().max(), S_ref / S_ref.abs().max(), tol, f"{kind} state")


@pytest.mark.parametrize("kind", ["delta_rule", "gated_delta_rule", "linear_attention_decay", "kda"])
def test_the_c_kernel_gives_the_same_numbers_on_one_thread_or_two(kind):
    """Heads are split between threads, each head's sums in one order: the outputs are bit for bit the same."""
    x = _inputs(70, dtype=torch.float32)
    before = torch.get_num_threads()
    try:
        outs = []
        for threads in (1, 2):
            torch.set_num_threads(threads)
            outs.append(_call(kind, x, initial_state=x["S0"], output_final_state=True, chunk_size=C))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


def test_recurrent_step_is_the_one_token_rule():
    x = _inputs(1)
    o, S = recurrent_step(x["q"][:, 0], x["k"][:, 0], x["v"][:, 0], x["S0"], g=x["g_head"][:, 0],
                          beta=x["beta"][:, 0], scale=0.5)
    a = x["g_head"][:, 0].exp()[..., None, None]
    Sd = a * x["S0"]
    k, v, b = x["k"][:, 0], x["v"][:, 0], x["beta"][:, 0]
    want = Sd + k[..., :, None] * (b[..., None] * (v - torch.einsum("bhkv,bhk->bhv", Sd, k)))[..., None, :]
    assert_close(S, want, 1e-12, "state")
    assert_close(o, torch.einsum("bhkv,bhk->bhv", want, 0.5 * x["q"][:, 0]), 1e-12, "output")


def test_worked_example_3_per_channel_forgetting():
    """Essay section 3: row (2, 1), key (1, 0), value 3, beta 1/2.

    The essay's memory maps keys to values, W = sum v k^T; our state is its transpose, S [K, V], so the
    essay's row (over the two key channels) is the column of S for the one value channel: K = 2, V = 1.
    """
    S0 = torch.tensor([[2.0], [1.0]], dtype=torch.float64).view(1, 1, 2, 1)
    k = torch.tensor([1.0, 0.0], dtype=torch.float64).view(1, 1, 1, 2)
    q = torch.tensor([0.0, 1.0], dtype=torch.float64).view(1, 1, 1, 2)   # reads the second channel
    v = torch.tensor([3.0], dtype=torch.float64).view(1, 1, 1, 1)
    beta = torch.full((1, 1, 1), 0.5, dtype=torch.float64)
    half = math.log(0.5)
    for mode in ("chunk", "recurrent", "scan"):
        _, S = gated_delta_rule(q, k, v, g=torch.full((1, 1, 1), half, dtype=torch.float64), beta=beta, scale=1.0,
                                initial_state=S0, output_final_state=True, mode=mode)
        assert S.flatten().tolist() == [2.0, 0.5], f"Gated DeltaNet ({mode}): the row becomes (2, 1/2)"
        o, S = kda(q, k, v, g=torch.tensor([half, 0.0], dtype=torch.float64).view(1, 1, 1, 2), beta=beta, scale=1.0,
                   initial_state=S0, output_final_state=True, mode=mode)
        assert S.flatten().tolist() == [2.0, 1.0], f"KDA ({mode}): the row becomes (2, 1)"
        assert o.item() == 1.0, "the second channel's content survived"


@pytest.mark.parametrize("L", [1, 2, 5, 8, 13])
def test_affine_scan_takes_log_rounds_and_equals_the_recurrence(L):
    g = torch.Generator().manual_seed(L)
    A = torch.randn(3, L, 4, 4, generator=g, dtype=torch.float64) * 0.5
    b = torch.randn(3, L, 4, 2, generator=g, dtype=torch.float64)
    S0 = torch.randn(3, 4, 2, generator=g, dtype=torch.float64)
    A_pref, b_pref, rounds = affine_scan(A, b)
    assert rounds == math.ceil(math.log2(L))
    S = S0
    for t in range(L):
        S = A[:, t] @ S + b[:, t]
        assert_close(A_pref[:, t] @ S0 + b_pref[:, t], S, 1e-12, f"prefix {t}")


def test_delta_states_by_scan_reports_rounds():
    x = _inputs(33)
    S_all, rounds = delta_states_by_scan(x["k"], x["v"], g=x["g_head"], beta=x["beta"])
    assert rounds == 6 and S_all.shape == (B, 33, H, K, V)
    _, S_ref = _call("gated_delta_rule", x, output_final_state=True, mode="recurrent")
    assert_close(S_all[:, -1], S_ref, 1e-10, "last state")


@pytest.fixture(params=["C kernel", "tensor form"])
def conv_form(request, monkeypatch):
    """Both forms of the short convolution: the C kernel (asserted to build here) and the tensor form."""
    import storelab.ops.conv as conv

    if request.param == "tensor form":
        monkeypatch.setattr(conv, "_compiled_fits", lambda u: False)
    else:
        assert conv._compiled_fits(torch.zeros(1, 1, 1)), "the short_conv kernel did not build"
    return request.param


@pytest.mark.usefixtures("conv_form")
@pytest.mark.parametrize("chunks", [[9], [1] * 9, [2, 5, 2], [3, 1, 5]])
def test_causal_conv_tail_carries_across_calls(chunks):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 9, 5, generator=g)
    w = torch.randn(5, 4, generator=g)
    full, _ = causal_conv1d(x, w)
    ref = F.silu(F.conv1d(F.pad(x.transpose(1, 2), (3, 0)), w[:, None], groups=5)).transpose(1, 2)
    assert_close(full, ref, 1e-6, "conv vs torch")
    tail, ys, t = None, [], 0
    for c in chunks:
        y, tail = causal_conv1d(x[:, t:t + c], w, tail_BWC=tail)
        ys.append(y)
        t += c
    assert_close(torch.cat(ys, 1), full, 1e-6, "chunked conv")
    assert_close(tail, x[:, -3:], 0, "tail = last 3 inputs")


@pytest.mark.usefixtures("conv_form")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("activation", ["silu", None])
@pytest.mark.parametrize("T, with_tail", [(11, True), (11, False), (2, True), (2, False), (1, False), (20, True)])
def test_conv_gradients_match_torch_conv1d_and_gradcheck(activation, T, with_tail, threads, monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: threads)  # the C kernel splits its rows between threads
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, T, 5, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(5, 4, generator=g, dtype=torch.float64, requires_grad=True)
    tail = torch.randn(2, 3, 5, generator=g, dtype=torch.float64, requires_grad=True) if with_tail else None
    dy = torch.randn(2, T, 5, generator=g, dtype=torch.float64)
    inputs = (x, w, tail) if with_tail else (x, w)

    def ref(x, w, tail=None):
        full = torch.cat([torch.zeros(2, 3, 5, dtype=x.dtype) if tail is None else tail, x], 1)
        y = F.conv1d(full.transpose(1, 2), w[:, None], groups=5).transpose(1, 2)
        return F.silu(y) if activation else y

    def ours(x, w, tail=None):
        return causal_conv1d(x, w, tail_BWC=tail, activation=activation)[0]

    assert_close(ours(*inputs), ref(*inputs), 1e-12, "conv vs torch")
    got = torch.autograd.grad(ours(*inputs), inputs, dy)
    want = torch.autograd.grad(ref(*inputs), inputs, dy)
    for name, a, b in zip(("dx", "dw", "dtail"), got, want):
        assert_close(a, b, 1e-12, name)
    assert torch.autograd.gradcheck(ours, inputs)
    _, new_tail = causal_conv1d(x, w, tail_BWC=tail)
    full = torch.cat([torch.zeros(2, 3, 5, dtype=x.dtype) if tail is None else tail, x], 1)
    assert_close(new_tail, full[:, -3:], 0, "tail = the last 3 inputs, zeros before the start")


def test_bad_arguments_name_the_problem():
    x = _inputs(4)
    with pytest.raises(ValueError, match="mode"):
        _call("delta_rule", x, mode="fast")
    with pytest.raises(ValueError, match="g: expected"):
        kda(x["q"], x["k"], x["v"], g=x["g_head"], beta=x["beta"])
    with pytest.raises(ValueError, match="beta"):
        delta_rule(x["q"], x["k"], x["v"], beta=x["beta"][..., :1])
    with pytest.raises(ValueError, match="initial_state"):
        delta_rule(x["q"], x["k"], x["v"], beta=x["beta"], initial_state=x["S0"][:, :, :3])
