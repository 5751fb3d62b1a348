"""MiniMax-Text-01's lightning attention (transformers' ``MiniMaxLightningAttention``) against storelab.

Issue 28 item 8 asked whether the ``linear_attention`` store with a fixed decay is lightning attention.
Its op is: ``storelab.ops.delta.linear_attention`` with a fixed per-head decay ``g_h = -slope_h`` and
scale 1 is lightning's recurrence, S_t = exp(-slope_h) S_{t-1} + k_t v_t^T, o_t = S_t^T q_t (checked
here on the class's own q, k, v, in the chunked and per-token forms, output and final state). The store
around it is not: it L2-normalises q and k and scales by K^-1/2 (lightning: neither), runs a short
convolution (lightning: SiLU of the projection alone), normalises each head with one [V] RMSNorm
(lightning: one RMSNorm over all H*K channels), has no output gate (lightning: sigmoid(W_g x) before
the output projection), and its fixed decay is RetNet's 1 - 2^(-5-h) (lightning: exp(-slope_h), ALiBi's
slopes 2^(-8(h+1)/H) times 1 - l/(L-1) for layer l of L). So lightning is its own store kind,
``lightning`` (``storelab.stores.lightning``), checked here against the class on the same weights.
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
    seen = capture(hf, attn, ids)
    return attn, _input(seen), seen[2][0], seen[2][1]


def _input(captured):
    """The hidden states a captured call gave the layer (a keyword or the first argument)."""
    args, kwargs, _ = captured
    return kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]


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


def _store_from(attn, mode: str = "chunk"):
    """Our lightning store with the class's weights (same names, same [q | k | v] per-head layout)."""
    from storelab.stores.lightning import LightningConfig

    cfg = LightningConfig(d_model=TINY["hidden_size"], n_heads=H, head_dim=K, chunk_size=4, mode=mode,
                          slope_scale=1 - 2 / (LAYERS - 1 + 1e-5) + 1e-5)   # layer 2 of 4, as MiniMax scales it
    m = cfg.build()
    m.load_state_dict({"qkv_proj.weight": attn.qkv_proj.weight, "output_gate.weight": attn.output_gate.weight,
                       "norm": attn.norm.weight, "out_proj.weight": attn.out_proj.weight})
    return cfg, m


@pytest.mark.parametrize("mode", ["chunk", "recurrent"])
def test_the_lightning_store_is_the_class_on_the_same_weights(lightning, mode):
    attn, x, out, state = lightning
    cfg, m = _store_from(attn, mode)
    assert_close(cfg.log_decay().view(H, 1, 1), -attn.slope_rate, atol=1e-7, what="slopes")
    assert_close(m._log_decay(x)[0, 0], cfg.log_decay(), atol=0, what="the probes' decay")
    with torch.no_grad():
        y, st = m(x)
    assert_close(y, out, atol=1e-5 * out.abs().max().item(), what=f"store output ({mode})")
    assert_close(st.S, state, atol=1e-5 * state.abs().max().item(), what=f"store state ({mode})")


def test_the_lightning_store_steps_as_transformers_decodes():
    """Transformers' decode branch (a cache: token by token) against ours after the same prefill, and ours
    prefilled then stepped against one pass; the state's bytes are what the config says."""
    hf = tiny_hf_model("minimax", **TINY)
    attn = hf.model.layers[2].self_attn
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        first = capture(hf, attn, ids[:, :9], use_cache=True)
        cache = hf(ids[:, :9], use_cache=True).past_key_values
        step = capture(hf, attn, ids[:, 9:10], past_key_values=cache, use_cache=True)
    _, m = _store_from(attn)
    with torch.no_grad():
        _, st = m(_input(first))
        y, st = m(_input(step), st)
    assert_close(y, step[2][0], atol=1e-5 * step[2][0].abs().max().item(), what="decode step")
    x = torch.cat([_input(first), _input(step)], dim=1)
    with torch.no_grad():
        full, _ = m(x)
    _, m2 = _store_from(attn)
    ys, st2 = [], None
    with torch.no_grad():
        for a, b in ((0, 4), (4, 5), (5, 10)):
            y2, st2 = m2(x[:, a:b], st2)
            ys.append(y2)
    assert_close(torch.cat(ys, 1), full, atol=1e-5 * full.abs().max().item(), what="chunks then steps")
    B = x.shape[0]
    assert st2.seen == 10 and st2.nbytes() == B * m.cfg.footprint(st2.seen).state_bytes
    assert B * m.cfg.memory_terms().per_sequence == st2.nbytes() and m.cfg.memory_terms().per_token == 0
    assert m.cfg.num_params().stored == sum(p.numel() for p in m.parameters())


def test_lightning_config_errors_name_the_field():
    from storelab.stores.lightning import LightningConfig

    for kw, field in ((dict(n_heads=0), "n_heads"), (dict(slope_scale=-1.0), "slope_scale"), (dict(mode="x"), "mode")):
        with pytest.raises(ValueError, match=f"^{field}:"):
            LightningConfig(d_model=8, **kw)
