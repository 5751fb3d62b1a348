"""The RecurrentGemma family (``storelab/checkpoint/families/recurrent_gemma.py``) against transformers 5.23's
tiny ``recurrent_gemma`` model saved with ``save_pretrained``: logits equal in fp32 (1e-5 of the logits' scale)
and bf16 (5 %), chunked prefill + steps equal to one pass (chunks shorter and longer than the convolution and
the window), parameters from config.json alone equal to the saved tensors, transformers' state bytes after a
prefill (its attention cache plus the recurrent blocks' own ``conv1d_state`` and ``recurrent_states``), the
published RecurrentGemma 2B and 9B configs read (the cards' 2.7B and 9B, 2,682,862,080 and 8,579,977,216
saved), and refusals naming the field.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from storelab.checkpoint import load
from storelab.checkpoint.config_only import read_model_config
from storelab.checkpoint.shards import CheckpointError
from tests.helpers import assert_close
from tests.test_families import cache_bytes, ids_of

FIXTURES = Path(__file__).parent / "fixtures" / "configs"

# lru_width differs from hidden_size, the pattern from the default, the window (6) fills at 17 tokens; 5 layers:
# the pattern of 2 repeats and is cut (recurrent, attention, recurrent, attention, recurrent)
TINY = dict(hidden_size=64, num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=1, intermediate_size=192,
            vocab_size=128, attention_window_size=6, conv1d_width=4, lru_width=48,
            block_types=["recurrent", "attention"], partial_rotary_factor=0.5, logits_soft_cap=4.0, bos_token_id=1,
            eos_token_id=2, pad_token_id=0)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A tiny random transformers model saved; its norms (zeros) and biases perturbed so that a wrong mapping or
    a missing 1 + w shows in the logits."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model("recurrent_gemma", **TINY)).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for t in hf.state_dict().values():
            if t.dtype.is_floating_point and (t.dim() == 1 or bool((t == t.flatten()[0]).all())):
                t.add_(0.3 * torch.randn(t.shape, generator=g))
    d = tmp_path_factory.mktemp("recurrent_gemma")
    hf.save_pretrained(d)
    return hf, d


def test_config_read(saved):
    hf, folder = saved
    cfg = read_model_config(folder)
    assert [lay.token.KIND for lay in cfg.layers] == ["rglru", "window", "rglru", "window", "rglru"]
    assert [x == "sliding_attention" for x in hf.config.layers_block_type] == \
        [lay.token.KIND == "window" for lay in cfg.layers]
    rg, att = cfg.layers[0].token, cfg.layers[1].token
    assert (rg.lru_width, rg.n_heads, rg.conv_kernel) == (48, 4, 4)
    assert (att.window, att.head_dim, att.n_kv_heads, att.rotary_dim) == (5, 16, 1, 8)
    assert att.out_bias and not att.qkv_bias
    ch = cfg.layers[0].channel
    assert (ch.d_ff, ch.activation, ch.bias) == (96, "geglu_tanh", True)
    assert (cfg.embed_scale, cfg.logit_softcap, cfg.tie_embeddings) == (8.0, 4.0, True)


def test_logits_equal_transformers(saved):
    hf, folder = saved
    ours = load(folder)
    ids = ids_of(21)
    with torch.no_grad():
        ref = hf(ids, use_cache=False).logits
        got, _ = ours(ids)
    tol = 1e-5 * ref.abs().max().item()
    assert_close(got, ref, atol=tol, what="recurrent_gemma logits")
    with torch.no_grad():
        cache, parts = None, []
        for a, b in ((0, 2), (2, 11), (11, 12), (12, 13), (13, 21)):
            out, cache = ours(ids[:, a:b], cache)
            parts.append(out)
    assert_close(torch.cat(parts, 1), got, atol=tol, what="recurrent_gemma chunked")


def test_bf16_logits(saved):
    """bf16: the embedding scale rounded to bfloat16 as transformers' normalizer is (here sqrt(64) = 8 either way;
    the published widths are checked in test_embed_scale_rounded_as_transformers)."""
    hf, folder = saved
    ours = load(folder, dtype="bf16")
    ids = ids_of(13)
    with torch.no_grad():
        ref = hf.to(torch.bfloat16)(ids, use_cache=False).logits.float()
        hf.to(torch.float32)
        got = ours(ids)[0].float()
    scale = ref.abs().max().item()
    err = (got - ref).abs().max().item()
    assert err <= 0.05 * scale, f"bf16 logits differ by {err:.3e} (scale {scale:.3e})"


def test_config_counts_equal_transformers(saved):
    from storelab.models.accounting import count_params

    hf, folder = saved
    cfg = read_model_config(folder / "config.json")
    held = {t.data_ptr(): t.numel() for t in hf.state_dict().values() if t.dtype.is_floating_point}
    assert count_params(cfg).stored == sum(held.values())


def module_state_bytes(hf) -> int:
    """The recurrent blocks keep their state on the modules, not in the cache: ``conv1d_state`` [B, C, W - 1]
    and ``rg_lru.recurrent_states`` [B, C] (fp32)."""
    total = 0
    for layer in hf.model.layers:
        block = layer.temporal_block
        for t in (getattr(block, "conv1d_state", None), getattr(getattr(block, "rg_lru", None), "recurrent_states",
                                                                 None)):
            if t is not None:
                total += t.untyped_storage().nbytes()
    return total


@pytest.mark.parametrize("T", [2, 6, 17])
def test_memory_equals_transformers_state(T, saved):
    """``engine="transformers"`` at T tokens (fp32) equals transformers' attention cache after a prefill of T (the
    window not filled at 2, filled at 6 and 17) plus the recurrent blocks' states; those equal the ideal."""
    from transformers import DynamicCache

    from storelab.models.engines import state_bytes

    hf, folder = saved
    cfg = read_model_config(folder)
    past = DynamicCache(config=hf.config)
    with torch.no_grad():
        hf(ids_of(T), use_cache=True, past_key_values=past)
    got = state_bytes(cfg, T, engine="transformers", dtype="fp32")
    assert sum(got.values()) == cache_bytes(past) + module_state_bytes(hf)
    assert got["rglru"] == module_state_bytes(hf) == state_bytes(cfg, T, engine="ideal", dtype="fp32")["rglru"]


@pytest.mark.parametrize("name, lru, pattern, stored", [
    ("recurrentgemma-2b-it", 2560, "_block_types", 2_682_862_080),
    ("recurrentgemma-9b", 4096, "block_types", 8_579_977_216),
])
def test_published(name, lru, pattern, stored):
    """As published (2B-it names its pattern ``_block_types``): two recurrent layers to one local MQA attention
    layer (window 2048 counting the query, half the head rotated), width intermediate_size / 2, and the saved
    counts behind the cards' 2.7B and 9B."""
    from storelab.models.accounting import count_params

    path = FIXTURES / f"{name}.json"
    raw = json.loads(path.read_text())
    assert pattern in raw
    cfg = read_model_config(path)
    kinds = [lay.token.KIND for lay in cfg.layers]
    assert kinds == (["rglru", "rglru", "window"] * 20)[:raw["num_hidden_layers"]]
    att = cfg.layers[2].token
    assert (att.window, att.n_kv_heads, att.head_dim, att.rotary_dim) == (2047, 1, 256, 128)
    assert cfg.layers[0].token.lru_width == lru and cfg.layers[0].channel.d_ff == raw["intermediate_size"] // 2
    assert count_params(cfg).stored == stored


@pytest.mark.parametrize("D", [2560, 4096, 3072])
def test_embed_scale_rounded_as_transformers(D, tmp_path):
    """sqrt(D) as transformers' normalizer holds it: rounded to bfloat16 (sqrt(2560) = 50.596 -> 50.5)."""
    (tmp_path / "config.json").write_text(json.dumps(dict(TINY, model_type="recurrent_gemma", hidden_size=D,
                                                          lru_width=D)))
    want = torch.tensor(D ** 0.5, dtype=torch.bfloat16).item()
    assert read_model_config(tmp_path).embed_scale == want
    assert D != 2560 or want == 50.5


@pytest.mark.parametrize("change, message", [
    (dict(block_types=["recurrent", "mlp"]), r"block_types\[1\]: 'mlp' is not a RecurrentGemma block type"),
    (dict(block_types=[]), r"block_types: must name at least one"),
    (dict(hidden_activation="silu"), r"hidden_activation: 'silu' is not supported"),
    (dict(attention_window_size=1), r"attention_window_size: must be an integer >= 2"),
    (dict(lru_width=50), r"n_heads"),
])
def test_refuses_naming_the_field(tmp_path, change, message):
    (tmp_path / "config.json").write_text(json.dumps(dict(TINY, model_type="recurrent_gemma", **change)))
    with pytest.raises(CheckpointError, match=message):
        read_model_config(tmp_path)


def test_unscaled_embedding_not_run():
    from storelab.checkpoint.families import family_for

    hf = dict(TINY, model_type="recurrent_gemma", embeddings_scale_by_sqrt_dim=False)
    with pytest.raises(CheckpointError, match="embeddings_scale_by_sqrt_dim: false is not supported"):
        family_for(hf).runs(hf)


def test_stored_copy_of_the_tied_head_is_ignored(saved, tmp_path):
    """A checkpoint that stores ``lm_head.weight`` beside a tied embedding (as the published 9B's shards do) loads,
    the copy ignored: the same logits as without it."""
    import shutil

    from safetensors.torch import load_file, save_file

    hf, folder = saved
    shutil.copy(folder / "config.json", tmp_path / "config.json")
    tensors = load_file(folder / "model.safetensors")
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].clone()
    save_file(tensors, tmp_path / "model.safetensors")
    ids = ids_of(9)
    with torch.no_grad():
        assert torch.equal(load(tmp_path)(ids)[0], load(folder)(ids)[0])


def test_fields_left_out_take_transformers_defaults(tmp_path):
    """A file naming only its type reads as transformers' ``RecurrentGemmaConfig()`` does (RecurrentGemma 2B's
    shape): the same layers and the parameters of transformers' model built from it (meta device)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from storelab.models.accounting import count_params

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "recurrent_gemma"}))
    cfg = read_model_config(tmp_path)
    ref = AutoConfig.for_model("recurrent_gemma")
    assert [lay.token.KIND == "window" for lay in cfg.layers] == [x == "sliding_attention"
                                                                  for x in ref.layers_block_type]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(ref)
    assert count_params(cfg).stored == sum(p.numel() for p in model.parameters())


def test_weights_only_forgetting_equals_the_loaded_model(saved):
    """RG-LRU declares what its gate reads at x = 0 (``gate_params``); read from those tensors alone, the gate
    equals the loaded model's (issue 38)."""
    from storelab.probes.forgetting import rest_log_decay
    from storelab.probes.gate_weights import gate_tensors

    _, d = saved
    gates, io = gate_tensors(d)
    model = load(d)
    assert sorted(gates) == [0, 2, 4]
    for i, g in gates.items():
        assert torch.equal(g, rest_log_decay(model.blocks[i].token)), f"layer {i}"
    assert not any(n.endswith("y_proj.weight") for n in io["tensors"])
