"""The four recurrent stores: chunked prefill + decode == one pass, bytes == footprint, params, configs."""

import pytest
import torch

from storelab.state import RecurrentState
from storelab.stores import build_store
from tests.helpers import assert_close, one_pass_and_chunks

SMALL = dict(d_model=32, n_heads=2, head_k_dim=8, head_v_dim=6, chunk_size=4)
CASES = {
    "linear_attention": {},
    "linear_attention_fixed": {"kind": "linear_attention", "decay": "fixed"},
    "deltanet": {},
    "gated_deltanet": {"n_v_heads": 4},
    "kda": {},
    "kda_softplus_gate": {"kind": "kda", "gate_lower_bound": None},
}


def _cfg(case, **over):
    d = {"kind": case, **SMALL, **CASES[case], **over}
    return build_store(d)


def _module(case, **over):
    torch.manual_seed(0)
    m = _cfg(case, **over).build()
    with torch.no_grad():  # O(1) outputs, so a wrong carry cannot hide under the tolerance
        for p in m.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, p.shape[-1] ** -0.5)
    return m


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("chunks", [[1] * 11, [3, 4, 4], [4, 0, 1, 6], [2, 9]])
def test_prefill_then_step_equals_one_pass(case, chunks):
    m = _module(case)
    x = torch.randn(2, 11, 32, generator=torch.Generator().manual_seed(1))
    want, full, got, st = one_pass_and_chunks(m, x, chunks)
    scale = want.abs().max().item()
    assert scale > 0.1
    assert_close(got, want, 1e-5 * max(1.0, scale), f"{case} chunks {chunks}")  # fp32, relative to O(1)
    assert_close(st.S, full.S, 1e-5, f"{case} state")
    assert st.seen == 11 and isinstance(st, RecurrentState)


@pytest.mark.parametrize("case", list(CASES))
def test_reference_modes_agree_with_the_chunked_store(case):
    x = torch.randn(1, 9, 32, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want, _ = _module(case)(x)
        for mode in ("recurrent", "scan"):
            y, _ = _module(case, mode=mode)(x)
            assert_close(y, want, 1e-5, f"{case} mode {mode}")


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("L", [1, 3, 10])
def test_state_bytes_equal_the_footprint(case, L):
    cfg = _cfg(case)
    m = _module(case)
    with torch.no_grad():
        _, st = m(torch.randn(1, L, 32))
    fp = cfg.footprint(L, dtype="fp32")
    assert st.nbytes() == fp.state_bytes
    assert st.entries == fp.kept == fp.read == cfg.n_value_heads
    assert st.S.dtype == torch.float32
    # the matrix does not grow with the context; bf16 entries shrink only the conv tail
    assert cfg.footprint(10**6, dtype="fp32").state_bytes == fp.state_bytes
    HV, K, V, W = cfg.n_value_heads, cfg.head_k_dim, cfg.head_v_dim, cfg.conv_kernel
    assert cfg.footprint(L, dtype="bf16").state_bytes == HV * K * V * 4 + (W - 1) * cfg.conv_channels * 2


def test_bf16_store_keeps_an_fp32_matrix():
    cfg = _cfg("gated_deltanet")
    m = _module("gated_deltanet").to(torch.bfloat16)
    with torch.no_grad():
        y, st = m(torch.randn(1, 5, 32, dtype=torch.bfloat16))
    assert y.dtype == torch.bfloat16 and st.S.dtype == torch.float32 and st.conv.dtype == torch.bfloat16
    assert st.nbytes() == cfg.footprint(5, dtype="bf16").state_bytes


@pytest.mark.parametrize("case", list(CASES))
def test_num_params_is_exact(case):
    cfg = _cfg(case)
    n = sum(p.numel() for p in cfg.build().parameters())
    assert cfg.num_params().stored == cfg.num_params().active == n


def test_kda_lower_bound_keeps_each_step_above_e_to_the_bound():
    m = _module("kda", gate_lower_bound=-5.0)
    with torch.no_grad():
        m.dt_bias.fill_(30.0)  # push the gate to its bound
        g = m._log_decay(torch.randn(2, 7, 32) * 10)
    assert g.shape == (2, 7, 2, 8)
    assert (g >= -5.0).all() and (g <= 0).all() and g.min() < -4.9


def test_beta_stays_below_beta_max():
    m = _module("deltanet", beta_max=2.0)
    with torch.no_grad():
        x = torch.randn(2, 50, 32) * 10
        b = m._beta(x)
    assert (b >= 0).all() and (b <= 2.0).all() and b.max() > 1.5  # saturates at beta_max in fp32
    assert_close(b, 2.0 * torch.sigmoid(m.b_proj(x)), 1e-6, "beta = beta_max * sigmoid")


@pytest.mark.parametrize("bad,field", [
    ({"kind": "deltanet", "beta_max": 2.5}, "beta_max"),
    ({"kind": "deltanet", "beta_max": 0.0}, "beta_max"),
    ({"kind": "gated_deltanet", "n_heads": 3, "n_v_heads": 4}, "n_v_heads"),
    ({"kind": "kda", "gate_lower_bound": 1.0}, "gate_lower_bound"),
    ({"kind": "kda", "gate_rank": 0}, "gate_rank"),
    ({"kind": "linear_attention", "decay": "learned"}, "decay"),
    ({"kind": "deltanet", "conv_kernel": 0}, "conv_kernel"),
    ({"kind": "deltanet", "chunk_size": 0}, "chunk_size"),
    ({"kind": "deltanet", "head_k_dim": -1}, "head_k_dim"),
    ({"kind": "deltanet", "mode": "fast"}, "mode"),
    ({"kind": "deltanet", "n_v_heads": 4}, "n_v_heads"),  # only gated_deltanet has value heads of its own
])
def test_bad_configs_name_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        build_store({**SMALL, **bad})


def test_wrong_input_shape_names_the_expected_shape():
    with pytest.raises(ValueError, match=r"\[B, T, 32\]"):
        _module("kda")(torch.randn(2, 5, 31))


@pytest.mark.parametrize("case", list(CASES))
def test_card_and_round_trip(case):
    cfg = _cfg(case)
    assert build_store(cfg.to_dict()) == cfg
    assert "arXiv" in cfg.CARD.source
