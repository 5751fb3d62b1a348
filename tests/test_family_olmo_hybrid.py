"""The Olmo Hybrid family (``storelab/checkpoint/families/olmo_hybrid.py``) against transformers 5.23's tiny
``olmo_hybrid`` model saved with ``save_pretrained``: logits equal in fp32 (1e-5 of the logits' scale) and bf16
(5 %), chunked prefill + steps equal to one pass, parameters from config.json alone equal to the saved tensors,
and transformers' cache bytes after a prefill (its linear layers' dict-held states counted), with beta_max 2
(``linear_allow_neg_eigval``) and 1.
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
from tests.family_harness import saved_fixture, tiny_hf

COMMON = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
              intermediate_size=96, bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=512,
              linear_key_head_dim=16, linear_value_head_dim=24, linear_conv_kernel_dim=3,
              layer_types=["linear_attention", "full_attention", "linear_attention", "linear_attention"])
TINY = {
    "neg_eigval": dict(COMMON),                                              # beta in (0, 2), the default
    "pos_eigval": dict(COMMON, linear_allow_neg_eigval=False, attention_bias=True),
}


saved = saved_fixture(TINY, lambda name: "olmo_hybrid", perturb=0.1)


@pytest.mark.parametrize("name", list(TINY))
def test_config_read(name, saved):
    """Layer kinds, pre norms on the linear layers and post norms on the attention, beta_max, the o_norm eps."""
    hf, folder = saved(name)
    cfg = read_model_config(folder)
    assert [lay.token.KIND for lay in cfg.layers] == ["gated_deltanet", "attention", "gated_deltanet",
                                                      "gated_deltanet"]
    assert [lay.norms for lay in cfg.layers] == ["pre", "post", "pre", "pre"]
    gdn, attn = cfg.layers[0].token, cfg.layers[1].token
    assert gdn.beta_max == (2.0 if hf.config.linear_allow_neg_eigval else 1.0)
    assert (gdn.n_heads, gdn.n_v_heads, gdn.head_k_dim, gdn.head_v_dim, gdn.conv_kernel) == (4, 4, 16, 24, 3)
    assert gdn.norm_eps == 1e-5 != hf.config.rms_norm_eps
    assert attn.qk_norm and attn.qk_norm_scope == "all" and attn.qkv_bias == hf.config.attention_bias
    assert attn.rope_theta == hf.config.rope_parameters["rope_theta"]


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


def test_neg_eigval_matters(saved):
    """The two settings give different logits on the same weights (the test above can tell them apart)."""
    hf, folder = saved("neg_eigval")
    cfg = json.loads((folder / "config.json").read_text())
    ids = ids_of(21)
    with torch.no_grad():
        a = load(folder)(ids)[0]
    (folder / "config.json").write_text(json.dumps(dict(cfg, linear_allow_neg_eigval=False)))
    try:
        with torch.no_grad():
            b = load(folder)(ids)[0]
    finally:
        (folder / "config.json").write_text(json.dumps(cfg))
    assert (a - b).abs().max().item() > 1e-3 * a.abs().max().item()


@pytest.mark.parametrize("name", list(TINY))
def test_bf16_logits(name, saved):
    hf, folder = saved(name)
    ours = load(folder, dtype="bf16")
    ids = ids_of(13)
    with torch.no_grad():
        ref = hf.to(torch.bfloat16)(ids).logits.float()
        hf.to(torch.float32)
        got = ours(ids)[0].float()
    scale = ref.abs().max().item()
    err = (got - ref).abs().max().item()
    assert err <= 0.05 * scale, f"{name}: bf16 logits differ by {err:.3e} (scale {scale:.3e})"


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
    (below, at and over the convolution's 3 taps): the attention's keys and values, each Gated DeltaNet's state and
    its convolution's whole kernel of inputs."""
    from storelab.models.engines import state_bytes

    hf, folder = saved("neg_eigval")
    cfg = read_model_config(folder)
    with torch.no_grad():
        past = hf(ids_of(T), use_cache=True).past_key_values
    assert sum(state_bytes(cfg, T, engine="transformers", dtype="fp32").values()) == _held_bytes(past)


@pytest.mark.parametrize("change, message", [
    (dict(layer_types=["linear_attention", "mamba", "full_attention", "linear_attention"]),
     r"layer_types\[1\]: 'mamba' is not an Olmo Hybrid layer type"),
    (dict(linear_num_key_heads=3, linear_num_value_heads=4), r"linear_num_value_heads: 4 value heads"),
    (dict(linear_allow_neg_eigval="yes"), r"linear_allow_neg_eigval: must be true or false"),
])
def test_refuses_naming_the_field(tmp_path, change, message):
    from storelab.checkpoint.shards import CheckpointError

    (tmp_path / "config.json").write_text(json.dumps(dict(COMMON, model_type="olmo_hybrid", **change)))
    with pytest.raises(CheckpointError, match=message):
        read_model_config(tmp_path)


def test_default_layer_types(tmp_path):
    """Without ``layer_types``: full attention at i % 4 == 3, the last layer when there is none."""
    base = {k: v for k, v in COMMON.items() if k != "layer_types"}
    for n, want in ((4, ["gated_deltanet"] * 3 + ["attention"]), (3, ["gated_deltanet"] * 2 + ["attention"])):
        (tmp_path / "config.json").write_text(json.dumps(dict(base, model_type="olmo_hybrid", num_hidden_layers=n)))
        assert [lay.token.KIND for lay in read_model_config(tmp_path).layers] == want


def test_module_names_read_too(tmp_path):
    """A folder in transformers' module names (``input_layernorm``, one fused ``conv1d``: the names after its
    load-time renaming) gives the same logits as the published layout ``save_pretrained`` writes."""
    from safetensors.torch import save_file

    hf = tiny_hf("olmo_hybrid", TINY["neg_eigval"])   # a fresh one: the bf16 test leaves the shared model's rope table rounded
    hf.config.save_pretrained(tmp_path)
    sd = {k: v.contiguous() for k, v in hf.state_dict().items()}
    assert any(k.endswith("linear_attn.conv1d.weight") for k in sd) and not any("_conv1d" in k for k in sd)
    save_file(sd, str(tmp_path / "model.safetensors"))
    ids = ids_of(9)
    with torch.no_grad():
        ref = hf(ids).logits
        got = load(tmp_path)(ids)[0]
    assert_close(got, ref, atol=1e-5 * ref.abs().max().item(), what="module names")
