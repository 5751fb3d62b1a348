"""MiniMax-Text-01's lightning attention (transformers' ``MiniMaxLightningAttention``) against storelab.

What storelab has: the op ``storelab.ops.delta.linear_attention`` with a fixed per-head decay
``g_h = -slope_h`` and scale 1 is lightning's recurrence, S_t = exp(-slope_h) S_{t-1} + k_t v_t^T,
o_t = S_t^T q_t. This file checks it on the class's own q, k, v (from a tiny random MiniMax model),
in storelab's chunked and per-token forms, output and final state, then rebuilds the layer's output
with the class's own norm, gate and projections around our op.

What the ``linear_attention`` store (``storelab.stores.recurrent``) puts around the op is not
lightning's layer, so the store is not MiniMax-Text-01's layer on the same weights (left open, see
the report of issue 28 item 8): the store L2-normalises q and k and scales by K^-1/2 (lightning: neither),
runs a short convolution (lightning: SiLU of the projection alone; a width-1 convolution of ones
would do), normalises each head's output with one [V] RMSNorm (lightning: one RMSNorm over all
H*V channels), has no output gate (lightning: sigmoid(W_g x) before the output projection), and
its fixed decay is RetNet's 1 - 2^(-5-h) (lightning: exp(-slope_h) with ALiBi's slopes
2^(-8(h+1)/H) times 1 - l/(L-1) for layer l of L).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from storelab.ops.delta import linear_attention
from tests.helpers import assert_close, capture, tiny_hf_model

H, K, LAYERS = 4, 16, 4
TINY = dict(hidden_size=64, num_hidden_layers=LAYERS, num_attention_heads=H, num_key_value_heads=2, head_dim=K,
            vocab_size=128, intermediate_size=96, num_local_experts=4, num_experts_per_tok=2, block_size=8,
            layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"])


@pytest.fixture(scope="module")
def lightning():
    """(the layer, its input, its output, its final state) of layer 2 of a tiny MiniMax on a 21-token prompt."""
    hf = tiny_hf_model("minimax", **TINY)   # fp32: its experts run grouped_mm, which takes no float64
    attn = hf.model.layers[2].self_attn
    assert type(attn).__name__ == "MiniMaxLightningAttention"
    with torch.no_grad():  # the norm starts at ones: move it so a wrong normalisation shows
        attn.norm.weight.add_(0.1 * torch.randn_like(attn.norm.weight))
    ids = torch.randint(0, 128, (2, 21), generator=torch.Generator().manual_seed(0))
    args, kwargs, out = capture(hf, attn, ids)
    x = kwargs.get("hidden_states", args[0] if args else None)
    return attn, x, out[0], out[1]


def _qkv(attn, x):
    B, T, _ = x.shape
    qkv = F.silu(attn.qkv_proj(x)).view(B, T, H, 3 * K)   # per head [q | k | v]
    return qkv.split(K, dim=-1)


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
def test_linear_attention_op_is_lightnings_recurrence(lightning, mode):
    attn, x, out, state = lightning
    q, k, v = _qkv(attn, x)
    g_H = -attn.slope_rate.view(H)                        # log of the per-head decay exp(-slope)
    with torch.no_grad():
        o_BTHV, S_BHKV = linear_attention(q, k, v, g=g_H, scale=1.0, output_final_state=True, chunk_size=4,
                                          mode=mode)
        B, T = x.shape[:2]
        y = attn.out_proj(F.sigmoid(attn.output_gate(x)) * attn.norm(o_BTHV.reshape(B, T, H * K)))
    assert_close(S_BHKV, state, atol=1e-5 * state.abs().max().item(), what=f"final state ({mode})")
    assert_close(y, out, atol=1e-5 * out.abs().max().item(), what=f"layer output ({mode})")


def test_the_decay_is_lightnings_slopes(lightning):
    """exp(-slope_h) with slope_h = 2^(-8(h+1)/H) (1 - l/(L-1) + 1e-5) for layer l = 2 of L = 4: the rates
    the store's fixed decay would need (its own is RetNet's 1 - 2^(-5-h))."""
    attn = lightning[0]
    h = torch.arange(H, dtype=torch.float64)
    want = 2.0 ** (-8 * (h + 1) / H) * (1 - 2 / (LAYERS - 1 + 1e-5) + 1e-5)
    assert_close(attn.slope_rate.view(H).double(), want, atol=1e-7, what="slopes (kept in fp32)")
    assert not torch.allclose(torch.exp(-want), 1 - 2.0 ** (-5 - h))
