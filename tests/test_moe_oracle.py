"""Our MoE and FFN against transformers' (the oracles): Qwen3-Next's sparse block with a
sigmoid-gated shared expert and its dense MLP; DeepSeek-V4's hash-routed and
bias-routed blocks (sqrt-softplus scores, clipped SwiGLU, routed scaling)."""

import pytest
import torch

from storelab.stores import observe
from storelab.stores.ffn import FFNConfig
from storelab.stores.moe import MoEConfig
from tests.helpers import assert_close, capture, tiny_hf_model

V = 128
TINY = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=V,
            intermediate_size=96)


@pytest.fixture(scope="module")
def qwen3_next():
    return tiny_hf_model("qwen3_next", **TINY, head_dim=16, num_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=32, shared_expert_intermediate_size=32, linear_conv_kernel_dim=4,
                         linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                         linear_num_value_heads=4, mlp_only_layers=[0])


@pytest.fixture(scope="module")
def deepseek_v4():
    # (deepseek_v4 maps intermediate_size onto moe_intermediate_size: leave it out)
    tiny = {k: v for k, v in TINY.items() if k != "intermediate_size"}
    m = tiny_hf_model("deepseek_v4", **{**tiny, "num_key_value_heads": 1}, head_dim=32, q_lora_rank=24, o_groups=2,
                      o_lora_rank=16, index_n_heads=2, index_head_dim=16, index_topk=4, sliding_window=8,
                      compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
                      num_experts_per_tok=2, n_routed_experts=4, moe_intermediate_size=32, hc_mult=2,
                      hc_sinkhorn_iters=5, swiglu_limit=0.1)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for layer in m.model.layers:
            gate = layer.mlp.gate
            if hasattr(gate, "tid2eid"):                   # starts as zeros: give every token 2 experts
                gate.tid2eid.copy_(torch.rand(V, 4, generator=g).argsort(-1)[:, :2])
            else:                                          # the balancing bias starts as zeros too
                gate.e_score_correction_bias.copy_(torch.randn(4, generator=g) * 0.3)
    return m


def _ids(seed=0):
    return torch.randint(0, V, (2, 9), generator=torch.Generator().manual_seed(seed))


def _copy_experts(ours, experts):
    with torch.no_grad():
        ours.gate_up.copy_(experts.gate_up_proj)
        ours.down.copy_(experts.down_proj)


def _copy_shared(ours, mlp):
    with torch.no_grad():
        ours.shared_gate_proj.weight.copy_(mlp.gate_proj.weight)
        ours.shared_up_proj.weight.copy_(mlp.up_proj.weight)
        ours.shared_down_proj.weight.copy_(mlp.down_proj.weight)


def test_qwen3_next_sparse_block(qwen3_next):
    hf = qwen3_next.model.layers[2].mlp
    (x,), _, want = capture(qwen3_next, hf, _ids())
    cfg = MoEConfig(d_model=64, n_experts=4, top_k=2, d_expert=32, router="softmax", norm_topk_prob=True,
                    n_shared=1, d_shared=32, shared_gate=True)
    ours = cfg.build()
    with torch.no_grad():
        ours.router.weight.copy_(hf.gate.weight)
        ours.shared_gate.weight.copy_(hf.shared_expert_gate.weight)
    _copy_experts(ours, hf.experts)
    _copy_shared(ours, hf.shared_expert)
    with observe() as seen:
        y, _ = ours(x)
    assert_close(y, want, 1e-5, "qwen3_next moe")
    assert int(seen.last(ours, "load").sum()) == x.shape[0] * x.shape[1] * 2
    assert cfg.num_params().stored == sum(p.numel() for p in hf.parameters())


def test_qwen3_next_dense_mlp_is_our_swiglu_ffn(qwen3_next):
    hf = qwen3_next.model.layers[0].mlp
    (x,), _, want = capture(qwen3_next, hf, _ids(1))
    cfg = FFNConfig(d_model=64, d_ff=96, activation="swiglu")
    ours = cfg.build()
    ours.load_state_dict(hf.state_dict())
    assert_close(ours(x)[0], want, 1e-5, "qwen3_next mlp")
    assert cfg.num_params().stored == sum(p.numel() for p in hf.parameters())


def _v4_config(**kw):
    return MoEConfig(d_model=64, n_experts=4, top_k=2, d_expert=32, router="sqrtsoftplus", routed_scaling=1.5,
                     n_shared=1, swiglu_limit=0.1, **kw)


def test_deepseek_v4_hash_routing(deepseek_v4):
    hf = deepseek_v4.model.layers[0].mlp
    assert hf.is_hash
    ids = _ids(2)
    (x,), kw, want = capture(deepseek_v4, hf, ids)
    assert torch.equal(kw["input_ids"], ids)
    ours = _v4_config(routing="hash", vocab_size=V).build()
    with torch.no_grad():
        ours.router.weight.copy_(hf.gate.weight)
        ours.table.copy_(hf.gate.tid2eid)
    _copy_experts(ours, hf.experts)
    _copy_shared(ours, hf.shared_experts)
    with observe() as seen:
        y, _ = ours(x, token_ids=ids)
    assert_close(y, want, 1e-5, "deepseek_v4 hash moe")
    assert torch.equal(seen.last(ours, "load"), torch.bincount(hf.gate.tid2eid[ids].reshape(-1), minlength=4))
    # the clip is active here: without it the output differs
    ours.cfg.swiglu_limit = None
    assert (ours(x, token_ids=ids)[0] - want).abs().max() > 1e-3


def test_deepseek_v4_bias_routing(deepseek_v4):
    hf = deepseek_v4.model.layers[3].mlp
    assert not hf.is_hash
    (x,), _, want = capture(deepseek_v4, hf, _ids(3))
    ours = _v4_config(router_bias=True).build()
    with torch.no_grad():
        ours.router.weight.copy_(hf.gate.weight)
        ours.choice_bias.copy_(hf.gate.e_score_correction_bias)
    _copy_experts(ours, hf.experts)
    _copy_shared(ours, hf.shared_experts)
    y, _ = ours(x)
    assert_close(y, want, 1e-5, "deepseek_v4 moe")
