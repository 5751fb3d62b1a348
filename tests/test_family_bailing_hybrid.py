"""The Ling / Ring linear-hybrid family (``storelab/checkpoint/families/bailing_hybrid.py``) against
transformers 5.23's tiny ``bailing_hybrid`` model saved with ``save_pretrained``: logits equal in fp32 (1e-5 of
the logits' scale) and bf16 (5 %), chunked prefill + steps equal to one pass, parameters from config.json alone
equal to the saved tensors, transformers' cache bytes after a prefill (the delta layers' dict-held states
counted), with the bounded forget gate (``kda_safe_gate``, the default) and Kimi Linear's softplus gate.
"""

from __future__ import annotations

import json

import pytest
import torch

from storelab.checkpoint import load
from storelab.checkpoint.config_only import read_model_config
from tests.helpers import assert_close
from tests.test_engines import _held_bytes
from tests.test_families import ids_of
from tests.family_harness import saved_fixture

COMMON = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4, vocab_size=128,
              intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, n_group=2,
              topk_group=1, first_k_dense_replace=1, kv_lora_rank=32, qk_rope_head_dim=8, qk_nope_head_dim=16,
              v_head_dim=16, head_dim=16, layer_group_size=2, num_mtp_layers=0, short_conv_kernel_size=3,
              pad_token_id=0, bos_token_id=1, eos_token_id=2)
TINY = {"bounded": dict(COMMON), "softplus": dict(COMMON, kda_safe_gate=False, routed_scaling_factor=1.5)}


saved = saved_fixture(TINY, lambda name: "bailing_hybrid", perturb=0.1)


@pytest.mark.parametrize("name", list(TINY))
def test_config_read(name, saved):
    hf, folder = saved(name)
    cfg = read_model_config(folder)
    assert [lay.token.KIND for lay in cfg.layers] == ["kda", "mla", "kda", "mla"]
    assert [lay.channel.KIND for lay in cfg.layers] == ["ffn", "moe", "moe", "moe"]
    kda, mla, moe = cfg.layers[0].token, cfg.layers[1].token, cfg.layers[1].channel
    assert (kda.n_heads, kda.head_k_dim, kda.conv_kernel) == (4, 16, 3)    # linear_head_dim, not head_dim (8)
    assert kda.full_rank_forget_gate and kda.full_rank_output_gate
    assert kda.gate_lower_bound == (-5.0 if hf.config.kda_safe_gate else None)
    assert mla.head_gate and mla.q_lora_rank is None and mla.rope_interleaved
    assert (moe.router, moe.router_bias, moe.n_group, moe.topk_group, moe.n_shared) == ("sigmoid", True, 2, 1, 1)
    assert moe.routed_scaling == hf.config.routed_scaling_factor and moe.norm_topk_prob


@pytest.mark.parametrize("name", list(TINY))
def test_logits_equal_transformers(name, saved):
    hf, folder = saved(name)
    ours = load(folder)
    ids = ids_of(21)
    with torch.no_grad():
        ref = hf(ids).logits
        got, _ = ours(ids)
    tol = 1e-5 * ref.abs().max().item()
    assert_close(got, ref, atol=tol, what=f"{name} logits")
    with torch.no_grad():                      # chunks shorter and longer than the convolution, then steps
        cache, parts = None, []
        for a, b in ((0, 2), (2, 9), (9, 10), (10, 11), (11, 21)):
            out, cache = ours(ids[:, a:b], cache)
            parts.append(out)
    assert_close(torch.cat(parts, 1), got, atol=tol, what=f"{name} chunked")


@pytest.mark.parametrize("name", list(TINY))
def test_bf16_logits(name, saved):
    """Within 5 % of transformers in bf16, and within 2 % of the fp32 logits: transformers rounds the log decay
    to bf16 before its scan (softplus gate: 4.9 % from its own fp32 logits on this model; ours 1.0 %)."""
    hf, folder = saved(name)
    ours = load(folder, dtype="bf16")
    ids = ids_of(13)
    with torch.no_grad():
        ref32 = hf(ids).logits
        ref = hf.to(torch.bfloat16)(ids).logits.float()
        hf.to(torch.float32)
        got = ours(ids)[0].float()
    scale = ref.abs().max().item()
    err = (got - ref).abs().max().item()
    assert err <= 0.05 * scale, f"{name}: bf16 logits differ by {err:.3e} (scale {scale:.3e})"
    assert (got - ref32).abs().max().item() <= 0.02 * ref32.abs().max().item()


@pytest.mark.parametrize("name", list(TINY))
def test_config_counts_equal_transformers(name, saved):
    from storelab.models.accounting import count_params

    hf, folder = saved(name)
    cfg = read_model_config(folder / "config.json")
    held = {t.data_ptr(): t.numel() for t in hf.state_dict().values() if t.dtype.is_floating_point}
    assert count_params(cfg).stored == sum(held.values())


@pytest.mark.parametrize("T", [2, 3, 17])
def test_memory_equals_transformers_cache(T, saved):
    """``engine="transformers"`` at T tokens (fp32) equals the bytes of transformers' cache after a prefill of T
    (below, at and over the convolution's 3 taps): MLA's latents and rotary keys, each delta layer's state and its
    convolution's whole kernel of inputs."""
    from storelab.models.engines import state_bytes

    hf, folder = saved("bounded")
    cfg = read_model_config(folder)
    with torch.no_grad():
        past = hf(ids_of(T), use_cache=True).past_key_values
    assert sum(state_bytes(cfg, T, engine="transformers", dtype="fp32").values()) == _held_bytes(past)


@pytest.mark.parametrize("change, message", [
    (dict(layer_types=["linear_attention", "mamba", "full_attention", "full_attention"]),
     r"layer_types\[1\]: 'mamba' is not a Bailing hybrid layer type"),
    (dict(attention_bias=True), r"attention_bias: true is not supported"),
    (dict(kda_safe_gate="yes"), r"kda_safe_gate: must be true or false"),
])
def test_refuses_naming_the_field(tmp_path, change, message):
    from storelab.checkpoint.shards import CheckpointError

    (tmp_path / "config.json").write_text(json.dumps(dict(COMMON, model_type="bailing_hybrid", **change)))
    with pytest.raises(CheckpointError, match=message):
        read_model_config(tmp_path)
