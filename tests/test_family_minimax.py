"""The MiniMax family (``storelab/checkpoint/families/minimax.py``) against transformers 5.23's tiny ``minimax``
model saved with ``save_pretrained``: read for accounting (layer kinds from ``layer_types`` or the published
``attn_type_list``, the lightning layers' per-layer slope scale equal to transformers' slopes, parameters from
config.json alone equal to the model's parameters, ``engine="transformers"`` equal to the bytes of its cache
after a prefill), and loading refused naming the residual's alpha field (no logits to compare: storelab's
layers do not add residuals to the normed stream).
"""

from __future__ import annotations

import json

import pytest
import torch

from storelab.checkpoint import load
from storelab.checkpoint.config_only import read_model_config
from storelab.checkpoint.shards import CheckpointError
from tests.test_engines import _held_bytes
from tests.test_families import ids_of

TINY = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            vocab_size=128, intermediate_size=32, num_local_experts=4, num_experts_per_tok=2, bos_token_id=1,
            eos_token_id=2, max_position_embeddings=512, block_size=8,
            layer_types=["linear_attention", "linear_attention", "full_attention", "linear_attention"],
            full_attn_alpha_factor=1.5, linear_attn_alpha_factor=1.25, mlp_alpha_factor=1.5, mlp_beta_factor=0.5)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model("minimax", **TINY)).eval()
    d = tmp_path_factory.mktemp("minimax")
    hf.save_pretrained(d)
    return hf, d


def test_config_read(saved):
    """Layer kinds, widths, the experts, and each lightning layer's slopes equal to transformers' ``slope_rate``."""
    hf, folder = saved
    cfg = read_model_config(folder)
    assert [lay.token.KIND for lay in cfg.layers] == ["lightning", "lightning", "attention", "lightning"]
    attn = cfg.layers[2].token
    assert (attn.n_heads, attn.n_kv_heads, attn.head_dim) == (4, 2, 16)
    assert attn.rope_theta == hf.config.rope_parameters["rope_theta"]
    for i, lay in enumerate(cfg.layers):
        moe = lay.channel
        assert (moe.KIND, moe.n_experts, moe.top_k, moe.d_expert, moe.router) == ("moe", 4, 2, 32, "softmax")
        if lay.token.KIND == "lightning":
            slopes = -lay.token.log_decay()
            assert torch.allclose(slopes, hf.model.layers[i].self_attn.slope_rate.flatten(), rtol=1e-6)


def test_config_counts_equal_transformers(saved):
    """Parameters from config.json alone equal the model's parameters; what else the saved file holds is the
    lightning layers' decay tables (buffers derived from the slopes and ``block_size``)."""
    from storelab.models.accounting import count_params

    hf, folder = saved
    cfg = read_model_config(folder / "config.json")
    assert count_params(cfg).stored == sum(p.numel() for p in hf.parameters())
    params = {n for n, _ in hf.named_parameters()}
    extra = {n.rsplit(".", 1)[1] for n in hf.state_dict() if n not in params}
    assert extra == {"slope_rate", "query_decay", "key_decay", "diagonal_decay"}


@pytest.mark.parametrize("T", [1, 5, 17])
def test_memory_equals_transformers_cache(T, saved):
    """``engine="transformers"`` at T tokens (fp32) equals the bytes of transformers' cache after a prefill of T:
    the softmax layers' keys and values and the lightning layers' states (``MiniMaxCache.linear_cache``)."""
    from storelab.models.engines import state_bytes

    hf, folder = saved
    cfg = read_model_config(folder)
    with torch.no_grad():
        past = hf(ids_of(T), use_cache=True).past_key_values
    linear = sum(t.untyped_storage().nbytes() for t in past.linear_cache if isinstance(t, torch.Tensor))
    assert linear > 0
    assert sum(state_bytes(cfg, T, engine="transformers", dtype="fp32").values()) == _held_bytes(past) + linear


def test_loading_refused_naming_the_field(saved):
    hf, folder = saved
    with pytest.raises(CheckpointError, match=r"full_attn_alpha_factor: 1\.5: MiniMax adds each sublayer's output "
                                              r"to its normed input"):
        load(folder)


def _write(tmp_path, raw):
    (tmp_path / "config.json").write_text(json.dumps(raw))
    return tmp_path


def test_published_field_names(tmp_path):
    """The published files' ``attn_type_list`` and ``layernorm_*_alpha`` names."""
    base = {k: v for k, v in TINY.items() if not k.endswith("_factor") and k != "layer_types"}
    raw = dict(base, model_type="minimax", attn_type_list=[0, 1, 0, 0], layernorm_full_attention_alpha=3.5,
               layernorm_full_attention_beta=1.0)
    cfg = read_model_config(_write(tmp_path, raw))
    assert [lay.token.KIND for lay in cfg.layers] == ["lightning", "attention", "lightning", "lightning"]
    with pytest.raises(CheckpointError, match=r"layernorm_full_attention_alpha: 3\.5"):
        from storelab.checkpoint.families import family_for
        family_for(raw).runs(raw)


@pytest.mark.parametrize("change, message", [
    (dict(attn_type_list=[0, 2, 0, 0]), r"attn_type_list\[1\]: must be 0 \(lightning\) or 1 \(softmax\)"),
    (dict(layer_types=["linear_attention", "mamba", "full_attention", "full_attention"]),
     r"layer_types\[1\]: 'mamba' is not a MiniMax layer type"),
    (dict(sliding_window=8), r"sliding_window: 8"),
])
def test_refuses_naming_the_field(tmp_path, change, message):
    raw = dict(TINY, model_type="minimax", **change)
    if "attn_type_list" in change:
        del raw["layer_types"]
    with pytest.raises(CheckpointError, match=message):
        read_model_config(_write(tmp_path, raw))
