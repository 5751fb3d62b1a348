"""RG-LRU (arXiv 2402.19427): the chunked recurrence against its per-token reference (values and gradients),
the store's protocol (prefill then step, bytes, parameters), and transformers' RecurrentGemmaRecurrentBlock
on the same weights, with its states after a prefill and one decode step (shared/reference/oracles.md)."""

import pytest
import torch

from storelab.ops.rglru import rg_lru
from storelab.stores import build_store
from storelab.stores.base import ParamCount
from tests.helpers import assert_close, capture, one_pass_and_chunks, tiny_hf_model

B, C = 2, 6


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _inputs(T: int, decay: str, dtype=torch.float32):
    """x, input gate, recurrence gate, p and h0; strong decays (a down to about e^-40) or weak (a near 0.9999)."""
    g = _gen(T)
    x, i, h0 = torch.randn(B, T, C, generator=g), torch.rand(B, T, C, generator=g), torch.randn(B, C, generator=g)
    r = torch.rand(B, T, C, generator=g)
    p = 2 + 3 * torch.rand(C, generator=g) if decay == "strong" else -9 - torch.rand(C, generator=g)
    return [t.to(dtype) for t in (x, i, r, p, h0)]


def _run(inputs, mode, reset=None, chunk_size=16):
    x, i, r, p, h0 = inputs
    return rg_lru(x, input_gate=i, recurrent_gate=r, recurrent_param=p, reset=reset, initial_state=h0,
                  output_final_state=True, chunk_size=chunk_size, mode=mode)


@pytest.mark.parametrize("decay", ["strong", "weak"])
@pytest.mark.parametrize("T", [1, 7, 64, 65, 130])
def test_chunked_rglru_matches_the_reference_in_value_and_gradient(T, decay):
    """Chunks of 16: below one chunk, several, one over; the initial state and a gradient on the final state."""
    g = _gen(100 + T)
    w_h, w_S = torch.randn(B, T, C, generator=g), torch.randn(B, C, generator=g)
    outs, grads = {}, {}
    for mode in ("recurrent", "chunk"):
        inputs = [t.clone().requires_grad_() for t in _inputs(T, decay)]
        h, S = _run(inputs, mode)
        ((h * w_h).sum() + (S * w_S).sum()).backward()
        outs[mode], grads[mode] = (h, S), [t.grad for t in inputs]
    assert_close(outs["chunk"][0], outs["recurrent"][0], 2e-6, f"h T={T} {decay}")
    assert_close(outs["chunk"][1], outs["recurrent"][1], 2e-6, f"final state T={T} {decay}")
    for name, a, b in zip(("x", "input gate", "recurrence gate", "p", "h0"), grads["chunk"], grads["recurrent"]):
        assert_close(a, b, 1e-5 * max(1.0, b.abs().max().item()), f"d{name} T={T} {decay}")


def test_reset_forgets_the_state_and_takes_the_input_whole():
    x, i, r, p, h0 = _inputs(9, "weak")
    reset = torch.zeros(B, 9, dtype=torch.bool)
    reset[0, 0] = reset[1, 4] = True              # row 0: a fresh context; row 1: a document starts at 4
    for mode in ("recurrent", "chunk"):
        h, _ = _run((x, i, r, p, h0), mode, reset=reset, chunk_size=4)
        assert_close(h[0, 0], x[0, 0] * i[0, 0], 1e-7, f"{mode}: first token of a context")
        assert_close(h[1, 4], x[1, 4] * i[1, 4], 1e-7, f"{mode}: first token of a document")
        h_no_h0, _ = _run((x, i, r, p, torch.zeros_like(h0)), mode, reset=reset, chunk_size=4)
        assert torch.equal(h[0], h_no_h0[0]) and torch.equal(h[1, 4:], h_no_h0[1, 4:])
    x.requires_grad_()
    h, S = _run((x, i, r, p, h0), "chunk", reset=reset, chunk_size=4)
    (h.sum() + S.sum()).backward()
    assert torch.isfinite(x.grad).all()


def test_bf16_inputs_keep_fp32_states():
    inputs = _inputs(40, "strong")
    h32, S32 = _run(inputs, "chunk")
    h16, S16 = _run([t.bfloat16() for t in inputs], "chunk")
    assert h16.dtype == torch.bfloat16 and S16.dtype == torch.float32
    assert_close(h16.float(), h32, 0.05 * h32.abs().max().item(), "bf16 h vs fp32")


def test_rglru_refuses_bad_shapes_and_modes():
    x, i, r, p, h0 = _inputs(5, "weak")
    with pytest.raises(ValueError, match="recurrent_param"):
        _run((x, i, r, p[:2], h0), "chunk")
    with pytest.raises(ValueError, match="mode"):
        _run((x, i, r, p, h0), "scan")


# ---------------------------------------------------------------------------- the store
def _cfg(**kw):
    return build_store({"kind": "rglru", "d_model": 16, "lru_width": 24, "n_heads": 3, "chunk_size": 8, **kw})


def _perturbed(cfg, seed=0):
    torch.manual_seed(seed)
    m = cfg.build()
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return m


def test_prefill_then_step_equals_one_pass():
    m = _perturbed(_cfg())
    x = torch.randn(2, 21, 16, generator=_gen(1))
    want, full, got, st = one_pass_and_chunks(m, x, [9, 1, 1, 10])
    assert_close(got, want, 1e-5, "chunks vs one pass")
    assert_close(st.S, full.S, 1e-5, "state after chunks vs one pass")
    assert st.seen == 21 and torch.equal(st.conv, full.conv)
    ref = _cfg(mode="recurrent").build()
    ref.load_state_dict(m.state_dict())
    with torch.no_grad():
        y_ref, st_ref = ref(x)
    assert_close(want, y_ref, 1e-5, "chunk mode vs recurrent mode")
    assert_close(full.S, st_ref.S, 1e-5, "chunk mode state vs recurrent mode")


def test_store_gradients_match_between_modes():
    m = _perturbed(_cfg())
    ref = _cfg(mode="recurrent").build()
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
    assert st.nbytes() == fp.state_bytes and st.entries == fp.kept == cfg.lru_width
    assert cfg.memory_terms(state="fp32").per_sequence == (24 + 3 * 24) * 4
    assert cfg.footprint(1 << 20, dtype=fmt).state_bytes == fp.state_bytes  # nothing grows with context


def test_num_params_counts_the_module():
    for cfg in (_cfg(), build_store({"kind": "rglru", "d_model": 20})):
        n = sum(p.numel() for p in cfg.build().parameters())
        assert cfg.num_params() == ParamCount(n, n)


@pytest.mark.parametrize("field, value", [("n_heads", 5), ("lru_width", 0), ("mode", "scan"), ("gate_exponent", 0)])
def test_bad_config_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"^{field}:"):
        _cfg(**{field: value})


def test_initial_decays_are_recurrentgemmas():
    """a = sigmoid(-p)^(c r): at r = 1/8 (c r = 1), a lies in [0.9, 0.999]."""
    m = _cfg().build()
    a = torch.sigmoid(-m.recurrent_param)
    assert ((a >= 0.9 - 1e-6) & (a <= 0.999 + 1e-6)).all()
    g = m._log_decay(torch.randn(1, 5, 16))
    assert g.shape == (1, 5, 24) and (g < 0).all()


# ---------------------------------------------------------------------------- transformers, same weights
NAMES = {"y_proj.weight": "linear_y.weight", "y_proj.bias": "linear_y.bias", "x_proj.weight": "linear_x.weight",
         "x_proj.bias": "linear_x.bias", "conv_weight": "conv_1d.weight", "conv_bias": "conv_1d.bias",
         "input_gate_weight": "rg_lru.input_gate_weight", "input_gate_bias": "rg_lru.input_gate_bias",
         "recurrent_gate_weight": "rg_lru.recurrent_gate_weight", "recurrent_gate_bias": "rg_lru.recurrent_gate_bias",
         "recurrent_param": "rg_lru.recurrent_param", "out_proj.weight": "linear_out.weight",
         "out_proj.bias": "linear_out.bias"}


def test_store_matches_recurrent_gemma_block_and_its_states():
    model = tiny_hf_model("recurrent_gemma", hidden_size=32, num_hidden_layers=3, vocab_size=64, num_attention_heads=4,
                          lru_width=32, intermediate_size=48, attention_window_size=16,
                          block_types=["recurrent", "recurrent", "attention"])
    block = model.model.layers[0].temporal_block
    g = _gen(5)
    with torch.no_grad():  # biases off zero, so every term counts
        for name, p in block.named_parameters():
            if name.endswith("bias"):
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    cfg = build_store({"kind": "rglru", "d_model": 32, "lru_width": 32, "n_heads": 4, "conv_kernel": 4,
                       "chunk_size": 4})
    ours = cfg.build()
    theirs = dict(block.named_parameters())
    with torch.no_grad():
        for name, p in ours.named_parameters():
            p.copy_(theirs[NAMES[name]].reshape(p.shape))
    T = 11
    ids = torch.randint(0, 64, (2, T), generator=_gen(3))
    (x,), kw, (want, _) = capture(model, block, ids, use_cache=True)
    S_want, conv_want = block.rg_lru.recurrent_states.clone(), block.conv1d_state.clone()
    with torch.no_grad():
        got, st = ours(x)
        steps, st_steps = [], None
        for t in range(T):
            y, st_steps = ours(x[:, t:t + 1], st_steps)
            steps.append(y)
    assert_close(got, want, 1e-5, "RecurrentGemmaRecurrentBlock one pass")
    assert_close(torch.cat(steps, 1), want, 1e-5, "RecurrentGemmaRecurrentBlock token by token")
    assert_close(st.S, S_want, 1e-5, "final state vs rg_lru.recurrent_states")
    assert_close(st.conv, conv_want.transpose(1, 2), 0, "conv tail vs conv1d_state")
    # one decode step from the states the prefill left on the block
    nxt = torch.randint(0, 64, (2, 1), generator=_gen(4))
    (x1,), _, (want1, _) = capture(model, block, nxt, past_key_values=kw["past_key_values"], use_cache=True)
    with torch.no_grad():
        got1, st1 = ours(x1, st)
    assert_close(got1, want1, 1e-5, "decode step vs RecurrentGemmaRecurrentBlock")
    assert_close(st1.S, block.rg_lru.recurrent_states, 1e-5, "state after the step")


# ---------------------------------------------------------------------------- in a model, beside mamba and attention
def test_a_hybrid_of_rglru_mamba_and_attention_prefills_in_chunks_and_accounts_its_bytes():
    """Griffin's pattern (two recurrent layers, then attention) with a Mamba layer: chunked prefill equals one
    call, the states clone independently, and the analytic bytes and parameters equal the built model's."""
    from storelab.models.accounting import analytic_state_bytes, count_params
    from storelab.models.config import ModelConfig
    from storelab.models.model import Model, cache_bytes_by_kind, prefill

    cfg = ModelConfig.from_dict({
        "name": "griffin-mamba", "vocab_size": 64, "n_layers": 3, "d_model": 16,
        "stores": {"lru": {"kind": "rglru", "lru_width": 24, "n_heads": 2, "chunk_size": 4},
                   "ssm": {"kind": "mamba", "d_state": 4, "chunk_size": 4},
                   "attn": {"kind": "attention", "n_heads": 2, "head_dim": 8},
                   "ffn": {"kind": "ffn", "d_ff": 32}, "depth": {"kind": "residual"}},
        "layers": [{"at": [0], "token": "lru", "channel": "ffn", "depth": "depth"},
                   {"at": [1], "token": "ssm", "channel": "ffn", "depth": "depth"},
                   {"at": [2], "token": "attn", "channel": "ffn", "depth": "depth"}]})
    torch.manual_seed(0)
    model = Model(cfg).eval()
    assert count_params(cfg).stored == sum(p.numel() for p in model.parameters())
    ids = torch.randint(0, 64, (1, 13), generator=_gen(6))
    with torch.no_grad():
        want, full = prefill(model, ids)
        got, cache = prefill(model, ids, chunk=5)
    assert_close(got, want, 1e-5, "logits after a prefill in chunks of 5 vs one call")
    for i in (0, 1):
        assert_close(cache[i].token.S, full[i].token.S, 1e-5, f"layer {i}: state after chunks vs one call")
    assert cache_bytes_by_kind(model, cache) == analytic_state_bytes(cfg, [st.seen for st in cache], dtype="fp32")
    for lay, st in zip(cfg.layers[:2], cache[:2]):
        assert st.token.entries == lay.token.footprint(st.seen).kept
        c = st.token.clone()
        assert c.S is not st.token.S and torch.equal(c.S, st.token.S) and torch.equal(c.conv, st.token.conv)
