"""The plain chunked WY/UT form (``chunk_reference``) against the per-token rule and the tuned chunk form.

Float64, all four rules (linear attention with and without decay), lengths below a chunk, a multiple,
one over and several chunks with a ragged end, with and without an initial state, two value heads
per query/key head. Values against ``mode="recurrent"`` and ``mode="chunk"``; gradients (q, k, v, g,
beta, initial state) against ``mode="recurrent"``. The tuned chunk form writes into reused buffers
(``out=``), so a chunk call whose inputs need gradients runs this form: the public ops' chunk mode
is differentiable, and its gradients are held equal to the per-token rule's too. The last tests show
the tolerance catches a wrong decay.
"""

import pytest
import torch
import torch.nn.functional as F

from storelab.ops import chunk_reference, delta_rule, gated_delta_rule, kda, linear_attention
from tests.helpers import assert_close

B, H, HV, K, V = 2, 2, 4, 8, 6
TOL = 1e-10
KINDS = ["linear_attention", "linear_attention_decay", "delta_rule", "gated_delta_rule", "kda"]
LENGTHS = [5, 32, 33, 70]


def _inputs(T, *, seed=0, requires_grad=False):
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64)  # noqa: E731
    x = dict(q=r(B, T, H, K), k=F.normalize(r(B, T, H, K), dim=-1), v=r(B, T, HV, V),
             beta=torch.rand(B, T, HV, generator=gen, dtype=torch.float64),
             g_head=F.logsigmoid(r(B, T, HV)), g_chan=F.logsigmoid(r(B, T, HV, K)), S0=r(B, HV, K, V))
    return {n: a.requires_grad_(requires_grad) for n, a in x.items()}


def _gates(kind, x):
    """The keyword arguments ``g`` and ``beta`` of ``kind``, shared by the ops and ``chunk_reference``."""
    g = {"linear_attention_decay": x["g_head"], "gated_delta_rule": x["g_head"], "kda": x["g_chan"]}.get(kind)
    beta = None if kind.startswith("linear_attention") else x["beta"]
    return g, beta


def _op(kind, x, S0, mode, chunk_size=16):
    g, beta = _gates(kind, x)
    common = dict(scale=None, initial_state=S0, output_final_state=True, chunk_size=chunk_size, mode=mode)
    if kind.startswith("linear_attention"):
        return linear_attention(x["q"], x["k"], x["v"], g=g, **common)
    if kind == "delta_rule":
        return delta_rule(x["q"], x["k"], x["v"], beta=beta, **common)
    op = gated_delta_rule if kind == "gated_delta_rule" else kda
    return op(x["q"], x["k"], x["v"], g=g, beta=beta, **common)


def _reference(kind, x, S0, chunk_size=16):
    g, beta = _gates(kind, x)
    return chunk_reference(x["q"], x["k"], x["v"], g=g, beta=beta, scale=None, initial_state=S0,
                           chunk_size=chunk_size)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("T", LENGTHS)
@pytest.mark.parametrize("chunk_size", [16, 32])
@pytest.mark.parametrize("with_state", [False, True])
def test_values_equal_the_per_token_rule_and_the_tuned_chunk_form(kind, T, chunk_size, with_state):
    x = _inputs(T)
    S0 = x["S0"] if with_state else None
    o, S = _reference(kind, x, S0, chunk_size)
    assert o.abs().max() > 0.1
    for mode in ("recurrent", "chunk"):
        o_op, S_op = _op(kind, x, S0, mode, chunk_size)
        assert_close(o, o_op, TOL, f"{kind} T={T} C={chunk_size} vs {mode}: output")
        assert_close(S, S_op, TOL, f"{kind} T={T} C={chunk_size} vs {mode}: final state")


def _grads(run, x, names):
    """Gradients of a fixed random projection of (o, final state) with respect to ``names``."""
    o, S = run()
    gen = torch.Generator().manual_seed(1)
    loss = (o * torch.randn(o.shape, generator=gen, dtype=o.dtype)).sum()
    loss = loss + (S * torch.randn(S.shape, generator=gen, dtype=S.dtype)).sum()
    return torch.autograd.grad(loss, [x[n] for n in names])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("T", LENGTHS)
@pytest.mark.parametrize("with_state", [False, True])
def test_gradients_equal_the_per_token_rule(kind, T, with_state):
    x = _inputs(T, requires_grad=True)
    S0 = x["S0"] if with_state else None
    g, beta = _gates(kind, x)
    names = ["q", "k", "v"] + (["g_chan" if kind == "kda" else "g_head"] if g is not None else [])
    names += (["beta"] if beta is not None else []) + (["S0"] if with_state else [])
    want = _grads(lambda: _op(kind, x, S0, "recurrent"), x, names)
    got = _grads(lambda: _reference(kind, x, S0), x, names)
    op_chunk = _grads(lambda: _op(kind, x, S0, "chunk", 16), x, names)  # the public op trains in its default mode
    for name, a, b, c in zip(names, got, want, op_chunk):
        assert b.abs().max() > 1e-3, f"{kind}: d/d{name} is zero, the comparison would prove nothing"
        assert_close(a, b, 1e-9, f"{kind} T={T}: gradient with respect to {name}")
        assert_close(c, b, 1e-9, f"{kind} T={T}: mode='chunk' gradient with respect to {name}")


@pytest.mark.parametrize("kind", ["delta_rule", "kda"])
def test_gradient_against_finite_differences(kind):
    """The autograd gradient of the chunked form itself, against finite differences (small sizes)."""
    gen = torch.Generator().manual_seed(2)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=torch.float64, requires_grad=True)  # noqa: E731
    q, v, S0 = r(1, 7, 1, 3), r(1, 7, 2, 2), r(1, 2, 3, 2)
    k = F.normalize(torch.randn(1, 7, 1, 3, generator=gen, dtype=torch.float64), dim=-1).requires_grad_()
    beta = torch.rand(1, 7, 2, generator=gen, dtype=torch.float64).requires_grad_()
    g = (-torch.rand(1, 7, 2, 3, generator=gen, dtype=torch.float64)).requires_grad_() if kind == "kda" else None
    inputs = (q, k, v, beta, S0) + ((g,) if g is not None else ())

    def f(q, k, v, beta, S0, g=None):
        return chunk_reference(q, k, v, g=g, beta=beta, scale=0.7, initial_state=S0, chunk_size=3)

    assert torch.autograd.gradcheck(f, inputs)


def test_a_wrong_decay_is_caught():
    """The tolerance is far below what a plausible mistake costs: the decay shifted by one token, or
    applied per head where it is per channel, fails the comparison."""
    x = _inputs(33)
    ref, _ = _op("kda", x, x["S0"], "recurrent")
    shifted = dict(x, g_chan=x["g_chan"].roll(1, dims=1))
    per_head = dict(x, g_chan=x["g_chan"].mean(-1, keepdim=True).expand_as(x["g_chan"]))
    for wrong in (shifted, per_head):
        o, _ = _reference("kda", wrong, x["S0"])
        with pytest.raises(AssertionError, match="max abs diff"):
            assert_close(o, ref, TOL, "kda with a wrong decay")


def test_a_wrong_write_is_caught():
    """Linear attention's additive write is not the delta write with beta = 1."""
    x = _inputs(20)
    ref, _ = _op("linear_attention", x, None, "recurrent")
    o, _ = chunk_reference(x["q"], x["k"], x["v"], beta=torch.ones_like(x["beta"]), scale=None)
    with pytest.raises(AssertionError, match="max abs diff"):
        assert_close(o, ref, TOL, "delta write for the additive one")


def test_shapes_are_checked_as_in_the_ops():
    x = _inputs(5)
    with pytest.raises(ValueError, match="g: expected shape"):
        chunk_reference(x["q"], x["k"], x["v"], g=x["g_head"][..., :1], beta=x["beta"], scale=None)
    with pytest.raises(ValueError, match="chunk_size"):
        chunk_reference(x["q"], x["k"], x["v"], beta=x["beta"], scale=None, chunk_size=0)


def test_training_keeps_one_state_per_chunk_not_every_chunks_products():
    """``recompute=True`` (what the ops' chunk mode runs when inputs need gradients) saves for backward
    the inputs and a K x V state per chunk; without it autograd keeps every chunk's C x C x K products."""
    gen = torch.Generator().manual_seed(3)
    B, T, H, K = 1, 256, 2, 16
    q = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1).requires_grad_()
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1).requires_grad_()
    v = torch.randn(B, T, H, K, generator=gen).requires_grad_()
    beta = torch.rand(B, T, H, generator=gen).requires_grad_()
    g = (-torch.rand(B, T, H, K, generator=gen)).requires_grad_()

    def saved_bytes(recompute):
        seen = {}

        def pack(t):
            seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            o, S = chunk_reference(q, k, v, g=g, beta=beta, scale=None, chunk_size=32, recompute=recompute)
        grads = torch.autograd.grad((o ** 2).sum() + S.sum(), [q, k, v, g, beta])
        return sum(seen.values()), grads

    kept, want = saved_bytes(False)
    light, got = saved_bytes(True)
    assert light * 4 < kept, (light, kept)
    for a, b in zip(got, want):
        assert_close(a, b, 1e-5, "recomputed chunks: gradient")
    # the public op, in its default chunk mode with inputs that need gradients, takes the light path for KDA
    seen = {}

    def pack(t):
        seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        o, S = kda(q, k, v, g=g, beta=beta, output_final_state=True)
    assert sum(seen.values()) * 4 < kept, (sum(seen.values()), kept)
    for a, b in zip(torch.autograd.grad((o ** 2).sum() + S.sum(), [q, k, v, g, beta]), want):
        assert_close(a, b, 1e-5, "kda chunk mode under autograd: gradient")
