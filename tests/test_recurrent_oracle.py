"""Oracles for the recurrent stores (shared/reference/oracles.md), fp32, max abs diff <= 1e-5.

* our ops vs transformers' pure-torch Gated DeltaNet (Qwen3-Next) and KDA (Kimi Linear) functions;
* our ``gated_deltanet`` store with Qwen3NextGatedDeltaNet's weights copied in, and our ``kda`` store
  with KimiLinearDeltaAttention's, on the inputs captured from a tiny random model, in one pass and
  token by token.
"""

import pytest
import torch
import torch.nn.functional as F
from transformers.models.kimi_linear.modeling_kimi_linear import (chunk_kimi_delta_attention,
                                                                  recurrent_kimi_delta_attention)
from transformers.models.qwen3_next.modeling_qwen3_next import (torch_chunk_gated_delta_rule,
                                                                torch_recurrent_gated_delta_rule)

from storelab.ops import gated_delta_rule, kda
from storelab.stores import build_store
from tests.helpers import assert_close, capture, tiny_hf_model

TINY = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
            intermediate_size=96, attn_implementation="eager")


def _randn(*shape, seed):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("T", [13, 70])
def test_gated_delta_rule_matches_transformers(T):
    B, H, HV, K, V = 2, 2, 4, 16, 16
    q, k, v = _randn(B, T, H, K, seed=1), F.normalize(_randn(B, T, H, K, seed=2), dim=-1), _randn(B, T, HV, V, seed=3)
    g = F.logsigmoid(_randn(B, T, HV, seed=4))
    beta = torch.sigmoid(_randn(B, T, HV, seed=5))
    S0 = _randn(B, HV, K, V, seed=6)
    want, S_want = torch_chunk_gated_delta_rule(q, k, v, g, beta, initial_state=S0, output_final_state=True)
    want_r, S_want_r = torch_recurrent_gated_delta_rule(q, k, v, g, beta, initial_state=S0, output_final_state=True)
    for mode, (w, Sw) in (("chunk", (want, S_want)), ("recurrent", (want_r, S_want_r))):
        o, S = gated_delta_rule(q, k, v, g=g, beta=beta, initial_state=S0, output_final_state=True, mode=mode)
        assert_close(o, w, 1e-5, f"gated_delta_rule {mode} vs transformers")
        assert_close(S, Sw, 1e-5, f"gated_delta_rule {mode} state vs transformers")


@pytest.mark.parametrize("T", [13, 70])
def test_kda_matches_transformers(T):
    B, H, K, V = 2, 3, 16, 8
    q, k, v = _randn(B, T, H, K, seed=1), F.normalize(_randn(B, T, H, K, seed=2), dim=-1), _randn(B, T, H, V, seed=3)
    g = F.logsigmoid(_randn(B, T, H, K, seed=4)) * 2
    beta = torch.sigmoid(_randn(B, T, H, seed=5))
    S0 = _randn(B, H, K, V, seed=6)
    want, S_want = chunk_kimi_delta_attention(q, k, v, g, beta, initial_state=S0, output_final_state=True)
    want_r, S_want_r = recurrent_kimi_delta_attention(q, k, v, g, beta, initial_state=S0, output_final_state=True)
    for mode, (w, Sw) in (("chunk", (want, S_want)), ("recurrent", (want_r, S_want_r))):
        o, S = kda(q, k, v, g=g, beta=beta, initial_state=S0, output_final_state=True, mode=mode)
        assert_close(o, w, 1e-5, f"kda {mode} vs transformers")
        assert_close(S, Sw, 1e-5, f"kda {mode} state vs transformers")


def _unit_scale_(module, seed=1):
    """Matrices ~ N(0, 1/fan_in) so outputs are O(1); gains 1 + N(0, 0.1^2); A_log and dt_bias kept."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
            elif name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))


def _step_by_step(ours, x):
    st, ys = None, []
    for t in range(x.shape[1]):
        y, st = ours(x[:, t:t + 1], st)
        ys.append(y)
    return torch.cat(ys, 1)


def test_gated_deltanet_store_matches_qwen3_next():
    model = tiny_hf_model("qwen3_next", **TINY, head_dim=16, num_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=32, shared_expert_intermediate_size=32, linear_conv_kernel_dim=4,
                          linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                          linear_num_value_heads=4)
    assert model.config.layer_types[0] == "linear_attention"
    hf = model.model.layers[0].linear_attn
    _unit_scale_(hf)
    ids = torch.randint(0, 128, (2, 21), generator=torch.Generator().manual_seed(0))
    _, kw, want = capture(model, hf, ids)
    x = kw["hidden_states"]

    cfg = build_store({"kind": "gated_deltanet", "d_model": 64, "n_heads": 2, "n_v_heads": 4, "head_k_dim": 16,
                       "head_v_dim": 16, "conv_kernel": 4, "norm_eps": model.config.rms_norm_eps, "chunk_size": 8})
    ours = cfg.build()
    H, HV, K, V, D = 2, 4, 16, 16, 64
    r = HV // H
    with torch.no_grad():
        # Qwen3-Next fuses q, k, v, z per key head group: [q (K), k (K), v (r V), z (r V)] for each of H groups
        qw, kw_, vw, zw = hf.in_proj_qkvz.weight.view(H, 2 * K + 2 * r * V, D).split([K, K, r * V, r * V], dim=1)
        bw, aw = hf.in_proj_ba.weight.view(H, 2 * r, D).split([r, r], dim=1)
        ours.q_proj.weight.copy_(qw.reshape(H * K, D))
        ours.k_proj.weight.copy_(kw_.reshape(H * K, D))
        ours.v_proj.weight.copy_(vw.reshape(HV * V, D))
        ours.z_proj.weight.copy_(zw.reshape(HV * V, D))
        ours.b_proj.weight.copy_(bw.reshape(HV, D))
        ours.a_proj.weight.copy_(aw.reshape(HV, D))
        ours.conv_weight.copy_(hf.conv1d.weight.squeeze(1))
        ours.A_log.copy_(hf.A_log)
        ours.dt_bias.copy_(hf.dt_bias)
        ours.o_norm.copy_(hf.norm.weight)
        ours.o_proj.weight.copy_(hf.out_proj.weight)
        y, _ = ours(x)
        assert want.abs().max() > 0.1
        assert_close(y, want, 1e-5, "gated_deltanet vs Qwen3NextGatedDeltaNet")
        assert_close(_step_by_step(ours, x), want, 1e-5, "gated_deltanet token by token vs Qwen3NextGatedDeltaNet")


def test_kda_store_matches_kimi_linear():
    model = tiny_hf_model("kimi_linear", **dict(TINY, num_key_value_heads=4), kv_lora_rank=16, q_lora_rank=None,
                          qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, moe_intermediate_size=32,
                          num_experts_per_tok=2, num_experts=4, num_shared_experts=1, pad_token_id=0, bos_token_id=1,
                          eos_token_id=2, linear_head_dim=16, linear_num_heads=4,
                          layer_types=["linear_attention"] * 3 + ["full_attention"])
    hf = model.model.layers[0].self_attn
    assert type(hf).__name__ == "KimiLinearDeltaAttention"
    _unit_scale_(hf)
    ids = torch.randint(0, 128, (2, 21), generator=torch.Generator().manual_seed(0))
    _, kw, want = capture(model, hf, ids)
    x = kw["hidden_states"]

    cfg = build_store({"kind": "kda", "d_model": 64, "n_heads": 4, "head_k_dim": 16, "head_v_dim": 16,
                       "conv_kernel": 4, "gate_rank": 16, "gate_lower_bound": None,
                       "norm_eps": model.config.rms_norm_eps, "chunk_size": 8})
    ours = cfg.build()
    fg = hf.forget_gate
    with torch.no_grad():
        for name in ("q_proj", "k_proj", "v_proj", "b_proj", "g_a_proj", "g_b_proj", "o_proj"):
            getattr(ours, name).weight.copy_(getattr(hf, name).weight)
        ours.f_a_proj.weight.copy_(fg.f_a_proj.weight)
        ours.f_b_proj.weight.copy_(fg.f_b_proj.weight)
        ours.A_log.copy_(fg.A_log.view(-1))
        ours.dt_bias.copy_(fg.dt_bias)
        ours.conv_weight.copy_(hf.conv1d.weight.squeeze(1))
        ours.o_norm.copy_(hf.o_norm.weight)
        y, _ = ours(x)
        assert want.abs().max() > 0.1
        assert_close(y, want, 1e-5, "kda vs KimiLinearDeltaAttention")
        assert_close(_step_by_step(ours, x), want, 1e-5, "kda token by token vs KimiLinearDeltaAttention")
