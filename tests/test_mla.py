"""MLA: the store contract (chunked == full, bytes == footprint, config errors),
naive vs absorbed read, the output gate, and the parameter count."""

from __future__ import annotations

import pytest
import torch

from storelab.stores import build_store
from storelab.stores.mla import MLAConfig
from tests.helpers import assert_close

TINY = dict(d_model=32, n_heads=4, q_lora_rank=12, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4,
            v_head_dim=6)


def make(seed: int = 0, **over):
    torch.manual_seed(seed)
    cfg = MLAConfig(**{**TINY, **over})
    return cfg, cfg.build()


def run_chunks(module, x, chunks):
    state, ys, t = None, [], 0
    for c in chunks:
        y, state = module(x[:, t:t + c], state)
        ys.append(y)
        t += c
    return torch.cat(ys, dim=1), state


@pytest.mark.parametrize("over", [{}, {"q_lora_rank": None}, {"use_rope": False}, {"output_gate": True},
                                  {"absorbed": True}, {"rope_interleaved": False}])
@pytest.mark.parametrize("chunks", [[11], [1] * 11, [4, 1, 6], [3, 5, 3]])
def test_prefill_then_step_equals_full_pass(over, chunks):
    cfg, m = make(**over)
    x = torch.randn(2, 11, cfg.d_model)
    full, _ = m(x)
    got, state = run_chunks(m, x, chunks)
    assert_close(got, full, 1e-5, f"chunks {chunks}")
    assert state.seen == 11 and state.entries == 11


@pytest.mark.parametrize("over", [{}, {"use_rope": False}, {"output_gate": True}, {"q_lora_rank": None}])
def test_absorbed_read_equals_naive(over):
    _, naive = make(**over)
    _, absorbed = make(**over, absorbed=True)
    absorbed.load_state_dict(naive.state_dict())
    x = torch.randn(1, 9, TINY["d_model"])
    y0, s0 = naive(x[:, :6])
    y1, s1 = absorbed(x[:, :6])
    assert_close(y1, y0, 1e-5, "prefill")
    assert_close(absorbed(x[:, 6:], s1)[0], naive(x[:, 6:], s0)[0], 1e-5, "decode")


def test_output_gate_multiplies_each_channel_by_a_sigmoid():
    cfg, m = make(output_gate=True)
    x = torch.randn(1, 5, cfg.d_model)
    with torch.no_grad():
        m.gate.weight.zero_()           # sigmoid(0) = 1/2 on every channel
    _, plain = make(output_gate=False)
    plain.load_state_dict({k: v for k, v in m.state_dict().items() if not k.startswith("gate.")})
    assert_close(m(x)[0], plain(x)[0] / 2, 1e-6, "gate at 1/2")


def test_without_rope_order_of_the_past_does_not_matter():
    # with no rotary the last query sees a set of entries: shuffling the earlier tokens changes nothing
    cfg, m = make(use_rope=False)
    x = torch.randn(1, 7, cfg.d_model)
    shuffled = torch.cat([x[:, torch.tensor([3, 0, 5, 1, 4, 2])], x[:, 6:]], dim=1)
    assert_close(m(shuffled)[0][:, -1], m(x)[0][:, -1], 1e-6, "no rope: order-free")
    _, r = make(use_rope=True)
    r.load_state_dict(m.state_dict())
    assert (r(shuffled)[0][:, -1] - r(x)[0][:, -1]).abs().max() > 1e-4  # with rope it matters


@pytest.mark.parametrize("L", [1, 7, 13])
def test_nbytes_equals_footprint(L):
    cfg, m = make()
    _, state = m(torch.randn(1, L, cfg.d_model))
    fp = cfg.footprint(L, dtype="fp32")
    assert state.nbytes() == fp.state_bytes == L * (8 + 4) * 4
    assert state.entries == fp.kept == fp.read == L and fp.scored == 0


def test_footprint_dtypes_and_published_sizes():
    # GLM-5.3's MLA: 512 + 64 numbers per token; DeepSeek's 656-byte fp8 entry would add scales
    glm = MLAConfig(d_model=6144, n_heads=64, q_lora_rank=2048, kv_lora_rank=512, qk_nope_head_dim=192,
                    qk_rope_head_dim=64, v_head_dim=256, rope_theta=8e6)
    assert glm.footprint(1000, dtype="bf16").state_bytes == 1000 * 576 * 2
    assert glm.footprint(1000, dtype="fp8").state_bytes == 1000 * 576
    assert glm.footprint(3, dtype="fp4").state_bytes == 3 * 576 // 2
    with pytest.raises(ValueError, match="dtype"):
        glm.footprint(10, dtype="int3")


@pytest.mark.parametrize("over", [{}, {"q_lora_rank": None}, {"output_gate": True}])
def test_num_params_is_exact(over):
    cfg, m = make(**over)
    n = sum(p.numel() for p in m.parameters())
    assert cfg.num_params().stored == cfg.num_params().active == n


@pytest.mark.parametrize("bad,field", [({"n_heads": 0}, "n_heads"), ({"kv_lora_rank": -1}, "kv_lora_rank"),
                                       ({"qk_rope_head_dim": 3}, "qk_rope_head_dim"),
                                       ({"q_lora_rank": 0}, "q_lora_rank"), ({"rope_theta": 0}, "rope_theta"),
                                       ({"softmax_scale": -1.0}, "softmax_scale")])
def test_bad_config_names_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        MLAConfig(**{**TINY, **bad})


def test_from_dict_and_bad_input():
    with pytest.raises(ValueError, match="qk_pe_dim"):
        build_store({"kind": "mla", **TINY, "qk_pe_dim": 4})
    cfg = build_store({"kind": "mla", **TINY})
    with pytest.raises(ValueError, match=r"\[B, T, 32\]"):
        cfg.build()(torch.randn(2, 3, 31))
