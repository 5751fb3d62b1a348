"""Mamba (arXiv 2312.00752): the selective scan's chunked form against its per-token reference (values and
gradients), the store's protocol (prefill then step, bytes, parameters), and transformers' MambaMixer,
FalconMambaMixer and JambaMambaMixer on the same weights (shared/reference/oracles.md)."""

import pytest
import torch

from storelab.ops.selective_scan import diagonal_scan, selective_ssm
from storelab.stores import build_store
from storelab.stores.base import ParamCount
from tests.helpers import assert_close, capture, one_pass_and_chunks, tiny_hf_model

B, C, N = 2, 6, 4


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _inputs(T: int, decay: str, dtype=torch.float32):
    """x, dt, A, B, C and h0 with strong (log decays down to about -50 per step) or weak (about -1e-3) decays."""
    g = _gen(T)
    x = torch.randn(B, T, C, generator=g)
    if decay == "strong":
        dt, A = 0.5 + 2.5 * torch.rand(B, T, C, generator=g), -(1 + 15 * torch.rand(C, N, generator=g))
    else:
        dt, A = 1e-3 * torch.rand(B, T, C, generator=g), -torch.rand(C, N, generator=g)
    Bm, Cm, h0 = torch.randn(B, T, N, generator=g), torch.randn(B, T, N, generator=g), torch.randn(B, C, N, generator=g)
    return [t.to(dtype) for t in (x, dt, A, Bm, Cm, h0)]


def _run(inputs, mode, chunk_size=16):
    x, dt, A, Bm, Cm, h0 = inputs
    return selective_ssm(x, dt, A, Bm, Cm, initial_state=h0, output_final_state=True, chunk_size=chunk_size,
                         mode=mode)


@pytest.mark.parametrize("decay", ["strong", "weak"])
@pytest.mark.parametrize("T", [1, 7, 64, 65, 130])
def test_chunked_scan_matches_the_reference_in_value_and_gradient(T, decay):
    """Chunks of 16: below one chunk, several, one over; the initial state and a gradient on the final state."""
    grads = {}
    outs = {}
    g = _gen(100 + T)
    w_y, w_S = torch.randn(B, T, C, generator=g), torch.randn(B, C, N, generator=g)
    for mode in ("recurrent", "chunk"):
        inputs = [t.clone().requires_grad_() for t in _inputs(T, decay)]
        y, S = _run(inputs, mode)
        ((y * w_y).sum() + (S * w_S).sum()).backward()
        outs[mode], grads[mode] = (y, S), [t.grad for t in inputs]
    scale = max(1.0, outs["recurrent"][0].abs().max().item())
    assert_close(outs["chunk"][0], outs["recurrent"][0], 2e-6 * scale, f"y T={T} {decay}")
    assert_close(outs["chunk"][1], outs["recurrent"][1], 2e-6 * scale, f"final state T={T} {decay}")
    for name, a, b in zip(("x", "dt", "A", "B", "C", "h0"), grads["chunk"], grads["recurrent"]):
        assert_close(a, b, 2e-5 * max(1.0, b.abs().max().item()), f"d{name} T={T} {decay}")


def test_diagonal_scan_backward_passes_gradcheck():
    """The hand-written backward (the adjoint scan) against finite differences, in float64, across chunks."""
    g = _gen(7)
    la = (-3 * torch.rand(2, 11, 3, 2, generator=g, dtype=torch.float64)).requires_grad_()
    b = torch.randn(2, 11, 3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(2, 3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    fn = lambda la, b, h0: diagonal_scan(la, b, initial_state=h0, chunk_size=4)  # noqa: E731
    assert torch.autograd.gradcheck(fn, (la, b, h0))


def test_chunk_size_does_not_change_the_result():
    inputs = _inputs(70, "strong")
    y1, S1 = _run(inputs, "chunk", chunk_size=8)
    y2, S2 = _run(inputs, "chunk", chunk_size=128)
    assert_close(y1, y2, 1e-5, "y, chunks of 8 vs one chunk")
    assert_close(S1, S2, 1e-5, "final state, chunks of 8 vs one chunk")


def test_bf16_inputs_keep_fp32_states():
    inputs = _inputs(40, "strong")
    y32, S32 = _run(inputs, "chunk")
    y16, S16 = _run([t.bfloat16() for t in inputs], "chunk")
    assert y16.dtype == torch.bfloat16 and S16.dtype == torch.float32
    assert_close(y16.float(), y32, 0.05 * y32.abs().max().item(), "bf16 y vs fp32")
    h, last = diagonal_scan(torch.zeros(1, 3, 2, dtype=torch.bfloat16), torch.ones(1, 3, 2, dtype=torch.bfloat16))
    assert h.dtype == last.dtype == torch.float32 and torch.equal(last, torch.full((1, 2), 3.0))


def test_scan_refuses_bad_shapes_and_modes():
    x, dt, A, Bm, Cm, h0 = _inputs(5, "weak")
    with pytest.raises(ValueError, match="A_CN"):
        selective_ssm(x, dt, A[:2], Bm, Cm)
    with pytest.raises(ValueError, match="initial_state"):
        selective_ssm(x, dt, A, Bm, Cm, initial_state=h0[:, :2])
    with pytest.raises(ValueError, match="mode"):
        selective_ssm(x, dt, A, Bm, Cm, mode="scan")


# ---------------------------------------------------------------------------- the store
def _cfg(**kw):
    return build_store({"kind": "mamba", "d_model": 16, "d_inner": 24, "d_state": 4, "dt_rank": 3, "chunk_size": 8,
                        **kw})


def _perturbed(cfg, seed=0):
    torch.manual_seed(seed)
    m = cfg.build()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m


@pytest.mark.parametrize("extra", [{}, {"bcdt_norm": "weighted", "use_bias": True},
                                   {"bcdt_norm": "weightless", "use_conv_bias": False}])
def test_prefill_then_step_equals_one_pass(extra):
    m = _perturbed(_cfg(**extra))
    x = torch.randn(2, 21, 16, generator=_gen(1))
    want, full, got, st = one_pass_and_chunks(m, x, [9, 1, 1, 10])
    assert_close(got, want, 1e-5, "chunks vs one pass")
    assert_close(st.S, full.S, 1e-5, "state after chunks vs one pass")
    assert st.seen == 21 and torch.equal(st.conv, full.conv)
    ref = _cfg(**extra, mode="recurrent").build()
    ref.load_state_dict(m.state_dict())
    with torch.no_grad():
        y_ref, st_ref = ref(x)
    assert_close(want, y_ref, 1e-5, "chunk mode vs recurrent mode")
    assert_close(full.S, st_ref.S, 1e-5, "chunk mode state vs recurrent mode")


def test_store_gradients_match_between_modes():
    m = _perturbed(_cfg(bcdt_norm="weighted"))
    ref = _cfg(bcdt_norm="weighted", mode="recurrent").build()
    ref.load_state_dict(m.state_dict())
    x = torch.randn(2, 19, 16, generator=_gen(2))
    for mod in (m, ref):
        y, st = mod(x)
        (y.square().sum() + st.S.sum()).backward()
    for (name, p), q in zip(m.named_parameters(), ref.parameters()):
        assert p.grad is not None and p.grad.abs().sum() > 0, name
        assert_close(p.grad, q.grad, 1e-4 * max(1.0, q.grad.abs().max().item()), f"d{name}")


@pytest.mark.parametrize("dtype, fmt", [(torch.float32, "fp32"), (torch.bfloat16, "bf16")])
def test_footprint_equals_measured_bytes(dtype, fmt):
    cfg = _cfg()
    m = cfg.build().to(dtype)
    with torch.no_grad():
        _, st = m(torch.randn(1, 11, 16).to(dtype))
    fp = cfg.footprint(11, dtype=fmt)
    assert st.S.dtype == torch.float32 and st.conv.dtype == dtype
    assert st.nbytes() == fp.state_bytes and st.entries == fp.kept == cfg.d_inner
    assert cfg.memory_terms(state="fp32").per_sequence == (cfg.d_inner * cfg.d_state + 3 * cfg.d_inner) * 4
    assert cfg.footprint(1 << 20, dtype=fmt).state_bytes == fp.state_bytes  # nothing grows with context


@pytest.mark.parametrize("extra", [{}, {"bcdt_norm": "weighted"}, {"use_bias": True, "use_conv_bias": False}])
def test_num_params_counts_the_module(extra):
    cfg = _cfg(**extra)
    n = sum(p.numel() for p in cfg.build().parameters())
    assert cfg.num_params() == ParamCount(n, n)


def test_defaults_follow_mamba():
    cfg = build_store(dict(kind="mamba", d_model=40))
    assert (cfg.d_inner, cfg.d_state, cfg.dt_rank, cfg.conv_kernel) == (80, 16, 3, 4)
    A = -cfg.build().A_log.exp()
    assert torch.allclose(A[0], -torch.arange(1.0, 17.0)) and torch.equal(A[0], A[-1])


@pytest.mark.parametrize("field, value", [("d_state", 0), ("bcdt_norm", "layer"), ("mode", "scan"),
                                          ("use_bias", 1), ("dt_max", 1e-4), ("chunk_size", 0)])
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field}:"):
        _cfg(**{field: value})


def test_log_decay_is_dt_times_A():
    m = _perturbed(_cfg())
    g = m._log_decay(torch.randn(1, 5, 16))
    assert g.shape == (1, 5, 24, 4) and (g < 0).all()


# ---------------------------------------------------------------------------- transformers, same weights
TINY = dict(hidden_size=32, num_hidden_layers=2, vocab_size=64)


def _copy_mixer(mixer, cfg):
    """Our store with the mixer's weights (the table in storelab/stores/mamba.py's docstring)."""
    ours = cfg.build()
    names = {"in_proj.weight": "in_proj.weight", "in_proj.bias": "in_proj.bias", "conv_weight": "conv1d.weight",
             "conv_bias": "conv1d.bias", "x_proj.weight": "x_proj.weight", "dt_proj.weight": "dt_proj.weight",
             "dt_proj.bias": "dt_proj.bias", "A_log": "A_log", "D": "D", "out_proj.weight": "out_proj.weight",
             "out_proj.bias": "out_proj.bias", "dt_norm": "dt_layernorm.weight", "b_norm": "b_layernorm.weight",
             "c_norm": "c_layernorm.weight"}
    theirs = dict(mixer.named_parameters())
    with torch.no_grad():
        for name, p in ours.named_parameters():
            p.copy_(theirs[names[name]].reshape(p.shape))
    return ours


def _perturb_(mixer, seed=1):
    """Move A_log, D, the conv bias and the norms' weights off their initialisation (every row alike)."""
    g = _gen(seed)
    with torch.no_grad():
        for name, p in mixer.named_parameters():
            if name in ("A_log", "D", "conv1d.bias") or name.endswith("layernorm.weight"):
                p.add_(0.3 * torch.randn(p.shape, generator=g))


def _check_against(model, mixer, cfg, T=13):
    _perturb_(mixer)
    ours = _copy_mixer(mixer, cfg)
    ids = torch.randint(0, TINY["vocab_size"], (2, T), generator=_gen(3))
    args, kwargs, want = capture(model, mixer, ids)
    x = args[0] if args else kwargs["hidden_states"]
    with torch.no_grad():
        got, st = ours(x)
        y_steps, st_steps = [], None
        for t in range(T):
            y, st_steps = ours(x[:, t:t + 1], st_steps)
            y_steps.append(y)
    assert_close(got, want, 1e-5, f"{type(mixer).__name__} one pass")
    assert_close(torch.cat(y_steps, 1), want, 1e-5, f"{type(mixer).__name__} token by token")
    return ours, ids, st


def test_store_matches_mamba_mixer_and_its_cache():
    model = tiny_hf_model("mamba", **TINY, state_size=8, expand=2, time_step_rank=4, conv_kernel=4)
    mixer = model.backbone.layers[0].mixer
    cfg = build_store(dict(kind="mamba", d_model=32, d_inner=64, d_state=8, dt_rank=4, chunk_size=8))
    ours, ids, st = _check_against(model, mixer, cfg)
    with torch.no_grad():
        cache = model(ids, use_cache=True).cache_params
    assert_close(st.S, cache.get_recurrent_state(0), 1e-5, "final state vs MambaMixer's cache")
    assert_close(st.conv, cache.get_conv_state(0)[..., 1:].transpose(1, 2), 0, "conv tail vs its conv state")
    # one decode step from the prefilled cache: transformers' single-token path against ours
    nxt = torch.randint(0, TINY["vocab_size"], (2, 1), generator=_gen(4))
    (x1,), _, want1 = capture(model, mixer, nxt, cache_params=cache, use_cache=True)
    with torch.no_grad():
        got1, st1 = ours(x1, st)
    assert_close(got1, want1, 1e-5, "decode step vs MambaMixer's")
    assert_close(st1.S, cache.get_recurrent_state(0), 1e-5, "state after the step vs its cache")


def test_store_matches_falcon_mamba_mixer():
    model = tiny_hf_model("falcon_mamba", **TINY, state_size=8, expand=2, time_step_rank=4, conv_kernel=4)
    cfg = build_store(dict(kind="mamba", d_model=32, d_inner=64, d_state=8, dt_rank=4, bcdt_norm="weightless",
                           bcdt_norm_eps=model.config.mixer_rms_eps, chunk_size=8))
    _check_against(model, model.backbone.layers[0].mixer, cfg)


def test_store_matches_jamba_mixer():
    model = tiny_hf_model("jamba", **TINY, num_attention_heads=2, num_key_value_heads=1, intermediate_size=48,
                          attn_layer_period=2, attn_layer_offset=1, expert_layer_period=2, expert_layer_offset=1,
                          num_experts=2, num_experts_per_tok=1, mamba_d_state=8, mamba_dt_rank=4, mamba_expand=2,
                          mamba_d_conv=4)
    c = model.config
    cfg = build_store(dict(kind="mamba", d_model=32, d_inner=64, d_state=8, dt_rank=4, bcdt_norm="weighted",
                           bcdt_norm_eps=c.rms_norm_eps, use_conv_bias=c.mamba_conv_bias,
                           use_bias=c.mamba_proj_bias, chunk_size=8))
    _check_against(model, model.model.layers[0].mamba, cfg)
