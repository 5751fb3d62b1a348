"""Oracles: our attention vs transformers' Qwen3NextAttention, our window vs MiMoV2FlashAttention.

Tiny random models as in shared/reference/oracles.md; we capture one attention layer's input and
output, copy its weights into our store and compare in fp32.
"""

import pytest
import torch

from storelab.stores import build_store
from tests.helpers import assert_close, capture, tiny_hf_model

TINY = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
            intermediate_size=96, attn_implementation="eager")


def _randomise_(*params):
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in params:
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)


def _copy_linear(dst, src):
    with torch.no_grad():
        dst.weight.copy_(src.weight)
        if src.bias is not None:
            dst.bias.copy_(src.bias)


def test_attention_matches_qwen3_next_gated_attention():
    model = tiny_hf_model("qwen3_next", **TINY, head_dim=16, num_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=32, shared_expert_intermediate_size=32, linear_conv_kernel_dim=4,
                          linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                          linear_num_value_heads=4)
    hf = model.model.layers[3].self_attn  # i % 4 == 3: the full-attention layer
    assert model.config.layer_types[3] == "full_attention"
    _randomise_(hf.q_norm.weight, hf.k_norm.weight)  # they start at zero (scale 1 + w)
    ids = torch.randint(0, 128, (2, 13), generator=torch.Generator().manual_seed(0))
    args, kw, out = capture(model, hf, ids)
    rp = model.config.rope_parameters
    cfg = build_store({"kind": "attention", "d_model": 64, "n_heads": 4, "n_kv_heads": 2, "head_dim": 16,
                       "partial_rotary": rp["partial_rotary_factor"], "rope_theta": rp["rope_theta"],
                       "gate": True, "qk_norm": True, "norm_eps": model.config.rms_norm_eps})
    ours = cfg.build()
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        _copy_linear(getattr(ours, name), getattr(hf, name))
    with torch.no_grad():
        ours.q_norm.weight.copy_(1.0 + hf.q_norm.weight)  # Qwen3-Next norms scale by (1 + w)
        ours.k_norm.weight.copy_(1.0 + hf.k_norm.weight)
        y, state = ours(kw["hidden_states"])
    assert_close(y, out[0], 1e-5, "Qwen3NextAttention")
    # and decoding the same tokens one at a time agrees with the oracle too
    with torch.no_grad():
        st, ys = None, []
        for t in range(13):
            yt, st = ours(kw["hidden_states"][:, t:t + 1], st)
            ys.append(yt)
    assert_close(torch.cat(ys, 1), out[0], 1e-5, "Qwen3NextAttention, token by token")


@pytest.mark.parametrize("T", [6, 20])
def test_window_matches_mimo_v2_flash_sliding_attention(T):
    W = 8
    model = tiny_hf_model("mimo_v2_flash", **TINY, head_dim=24, v_head_dim=16, n_routed_experts=4,
                          num_experts_per_tok=2, moe_intermediate_size=32, sliding_window_size=W)
    layer = 1
    assert model.config.layer_types[layer] == "sliding_attention"
    assert model.config.sliding_window == W + 1  # the oracle's count includes the query itself
    hf = model.model.layers[layer].self_attn
    _randomise_(hf.sinks)
    ids = torch.randint(0, 128, (2, T), generator=torch.Generator().manual_seed(1))
    args, kw, out = capture(model, hf, ids)
    rp = model.config.rope_parameters["sliding_attention"]
    cfg = build_store({"kind": "window", "window": W, "d_model": 64, "n_heads": 4,
                       "n_kv_heads": hf.k_proj.out_features // 24, "head_dim": 24, "v_head_dim": 16,
                       "partial_rotary": rp["partial_rotary_factor"], "rope_theta": rp["rope_theta"],
                       "sink": True, "value_scale": model.config.attention_value_scale})
    ours = cfg.build()
    for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
        _copy_linear(getattr(ours, name), getattr(hf, name))
    with torch.no_grad():
        ours.sinks.copy_(hf.sinks)
        y, _ = ours(kw["hidden_states"])
        ys, st, t = [], None, 0
        for c in (3, 1, 9, T):  # straddles the window, one chunk longer than it
            yt, st = ours(kw["hidden_states"][:, t:t + c], st)
            ys.append(yt)
            t += c
            if t >= T:
                break
    assert_close(y, out[0], 1e-5, "MiMoV2FlashAttention (sliding, sinks)")
    assert_close(torch.cat(ys, 1)[:, :T], out[0], 1e-5, "MiMoV2FlashAttention, chunked")
