"""The gated short convolution (``short_conv``, LFM2): fast form vs the plain one, chunks vs one pass,
the window it keeps, the footprint vs measured bytes, and transformers' ``Lfm2ShortConv`` on the same weights."""

from __future__ import annotations

import pytest
import torch

from storelab.state import loose_views
from storelab.stores.short_conv import SHORT_CONV_KERNELS, ShortConvConfig, short_conv_reference
from tests.helpers import assert_close, capture, one_pass_and_chunks, tiny_hf_model

D = 16


def _store(kernel: str = "fused", *, W: int = 3, bias: bool = True, dtype=torch.float32):
    torch.manual_seed(0)
    m = ShortConvConfig(d_model=D, conv_kernel=W, bias=bias, kernel=kernel).build().to(dtype)
    with torch.no_grad():  # the biases start at zero: make every term count
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m


@pytest.mark.parametrize("T", [1, 2, 3, 17])
@pytest.mark.parametrize("with_tail", [False, True])
@pytest.mark.parametrize("W", [2, 4])
def test_fused_convolution_matches_the_plain_one_in_value_and_gradient(T, with_tail, W):
    g = torch.Generator().manual_seed(T * 10 + W)
    z = torch.randn(2, T, D, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(D, W, dtype=torch.float64, generator=g, requires_grad=True)
    tail = torch.randn(2, W - 1, D, dtype=torch.float64, generator=g, requires_grad=True) if with_tail else None
    outs = {}
    for name, fn in SHORT_CONV_KERNELS.items():
        s, new_tail = fn(z, w, tail_BWC=tail)
        grads = torch.autograd.grad((s * s.detach().cos()).sum(), [z, w] + ([tail] if with_tail else []))
        outs[name] = (s, new_tail, grads)
    (s_f, t_f, g_f), (s_r, t_r, g_r) = outs["fused"], outs["reference"]
    assert_close(s_f, s_r, 1e-12, "output")
    assert_close(t_f, t_r, 0, "tail")
    for a, b, what in zip(g_f, g_r, ("dz", "dw", "dtail")):
        assert_close(a, b, 1e-12, what)


def test_the_reference_is_the_textbook_sum():
    g = torch.Generator().manual_seed(1)
    z, w = torch.randn(1, 5, D, generator=g, dtype=torch.float64), torch.randn(D, 3, generator=g, dtype=torch.float64)
    s, tail = short_conv_reference(z, w)
    zp = torch.cat([z.new_zeros(1, 2, D), z], 1)
    want = torch.stack([sum(w[:, i] * zp[:, t + i] for i in range(3)) for t in range(5)], 1)
    assert_close(s, want, 1e-12, "sum over taps")
    assert_close(tail, z[:, -2:], 0, "tail")


def test_store_forms_agree_in_value_and_gradient():
    fused, ref = _store("fused", dtype=torch.float64), _store("reference", dtype=torch.float64)
    ref.load_state_dict(fused.state_dict())
    x = torch.randn(2, 9, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    ys, grads = [], []
    for m in (fused, ref):
        y, _ = m(x)
        ys.append(y)
        grads.append(torch.autograd.grad(y.square().sum(), list(m.parameters())))
    assert_close(ys[0], ys[1], 1e-12, "output")
    for (name, _), a, b in zip(fused.named_parameters(), *grads):
        assert_close(a, b, 1e-10, name)


@pytest.mark.parametrize("kernel", sorted(SHORT_CONV_KERNELS))
@pytest.mark.parametrize("chunks", [[1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1], [1, 4, 2, 1, 3], [7, 1, 1, 1, 1], [11]])
def test_prefill_in_chunks_then_steps_equals_one_pass(kernel, chunks):
    m = _store(kernel)
    x = torch.randn(2, 11, D, generator=torch.Generator().manual_seed(3))
    want, full, got, st = one_pass_and_chunks(m, x, chunks)
    assert_close(got, want, 1e-5, f"chunks {chunks}")
    assert_close(st.conv, full.conv, 1e-6, "tail")
    assert st.seen == 11 and st.entries == 2


@pytest.mark.parametrize("W", [2, 3, 5])
def test_a_token_leaves_the_window_after_w_steps(W):
    m = _store(W=W)
    x = torch.randn(1, 12, D, generator=torch.Generator().manual_seed(4))
    x2 = x.clone()
    x2[:, 3] += 1.0
    with torch.no_grad():
        y, y2 = m(x)[0], m(x2)[0]
    changed = (y - y2).abs().amax(-1)[0] > 1e-6
    assert changed.tolist() == [3 <= t < 3 + W for t in range(12)]


@pytest.mark.parametrize("L", [1, 2, 3, 10])
@pytest.mark.parametrize("W", [2, 3, 4])
def test_footprint_equals_measured_bytes(L, W):
    cfg = ShortConvConfig(d_model=D, conv_kernel=W)
    with torch.no_grad():
        _, st = cfg.build()(torch.randn(1, L, D))
    fp = cfg.footprint(L, dtype="fp32")
    assert st.nbytes() == fp.state_bytes == (W - 1) * D * 4
    assert st.entries == fp.kept == W - 1
    assert cfg.footprint(0).state_bytes == 0
    assert loose_views(st) == []  # the tail is a copy, not a view that pins the call's activations
    assert cfg.memory_terms(state="fp32").per_sequence == (W - 1) * D * 4
    assert cfg.memory_terms().per_token == 0


def test_num_params_counts_the_module():
    for bias in (False, True):
        cfg = ShortConvConfig(d_model=D, conv_kernel=3, bias=bias)
        n = sum(p.numel() for p in cfg.build().parameters())
        assert cfg.num_params().stored == cfg.num_params().active == n


@pytest.mark.parametrize("field, value", [("conv_kernel", 1), ("conv_kernel", 2.5), ("kernel", "cuda"), ("d_model", 0)])
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field}:"):
        ShortConvConfig(**{"d_model": D, field: value})


# ---------------------------------------------------------------------------- the oracle
@pytest.mark.parametrize("conv_bias", [False, True])
def test_matches_transformers_lfm2_short_conv(conv_bias):
    hf = tiny_hf_model("lfm2", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, layer_types=["conv", "full_attention"],
                       conv_bias=conv_bias, conv_L_cache=3)
    conv = hf.model.layers[0].conv
    torch.manual_seed(5)
    with torch.no_grad():
        for p in conv.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    _, kw, want = capture(hf, conv, torch.randint(3, 64, (2, 13), generator=torch.Generator().manual_seed(6)))
    x = kw["hidden_states"]
    for kernel in sorted(SHORT_CONV_KERNELS):
        m = ShortConvConfig(d_model=32, conv_kernel=3, bias=conv_bias, kernel=kernel).build()
        with torch.no_grad():
            m.in_proj.weight.copy_(conv.in_proj.weight)
            m.conv_weight.copy_(conv.conv.weight.squeeze(1))
            m.out_proj.weight.copy_(conv.out_proj.weight)
            if conv_bias:
                m.in_proj.bias.copy_(conv.in_proj.bias)
                m.conv_bias.copy_(conv.conv.bias)
                m.out_proj.bias.copy_(conv.out_proj.bias)
            got, _ = m(x)
            st, steps = None, []
            for t in range(x.shape[1]):  # token by token as well
                y, st = m(x[:, t:t + 1], st)
                steps.append(y)
        assert_close(got, want, 1e-5, f"one pass ({kernel})")
        assert_close(torch.cat(steps, 1), want, 1e-5, f"token by token ({kernel})")
