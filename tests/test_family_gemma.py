"""The Gemma family (``storelab/checkpoint/families/gemma.py``) against transformers 5.23's tiny ``gemma2``,
``gemma3_text`` and ``gemma3`` (image-text wrapper, a one-layer SigLIP tower) models saved with
``save_pretrained``: logits equal in fp32 (1e-5 of the logits' scale) and bf16 (5 %), chunked prefill +
steps equal to one pass, transformers' cache bytes after a prefill (windows filled and not), parameters
from config.json alone equal to the saved text model's tensors; the attention soft cap against a plain
computation in value and gradient; the published Gemma 2 9B and Gemma 3 1B configs read (the model cards'
counts), Gemma 4 read by its own family (tests/test_family_gemma4.py).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from storelab.checkpoint.config_only import read_model_config
from storelab.checkpoint.shards import CheckpointError
from tests.helpers import assert_close
from tests.family_harness import check_bf16, check_cache, check_counts, check_logits, saved_fixture

SPLITS_A = ((0, 2), (2, 11), (11, 12), (12, 13), (13, 21))  # single tokens between chunks

FIXTURES = Path(__file__).parent / "fixtures" / "configs"

# query_pre_attn_scalar differs from head_dim and the caps are small, so that each shows in the logits
TEXT = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            intermediate_size=96, vocab_size=128, bos_token_id=1, eos_token_id=2, pad_token_id=0,
            max_position_embeddings=512, sliding_window=6, query_pre_attn_scalar=24)
GEMMA3_TEXT = dict(TEXT, sliding_window_pattern=2, rope_theta=10000.0, rope_local_base_freq=100.0)
TINY = {
    "gemma2": dict(TEXT, attn_logit_softcapping=2.0, final_logit_softcapping=3.0),
    "gemma3_text": GEMMA3_TEXT,
    # Gemma 3 4B and up: the global layers' rotation scaled linearly (transformers puts it under full_attention)
    "gemma3_linear": dict(GEMMA3_TEXT, rope_scaling=dict(rope_type="linear", factor=8.0)),
    # the wrapper with both caps set: transformers' Gemma 3 applies neither (Gemma3Attention passes no softcap on,
    # Gemma3ForConditionalGeneration caps no logits), and storelab reads it so
    "gemma3": dict(text_config=dict(GEMMA3_TEXT, attn_logit_softcapping=2.0, final_logit_softcapping=3.0),
                   mm_tokens_per_image=4,
                   vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, image_size=28, patch_size=14)),
}

TYPE = {"gemma3_linear": "gemma3_text"}  # entries of TINY that are another setting of a family


saved = saved_fixture(TINY, lambda name: TYPE.get(name, name), perturb=0.3)

@pytest.mark.parametrize("name", list(TINY))
def test_logits_equal_transformers(name, saved):
    check_logits(*saved(name), what=name, splits=SPLITS_A)


@pytest.mark.parametrize("name", list(TINY))
def test_bf16_logits(name, saved):
    check_bf16(*saved(name), what=name)


@pytest.mark.parametrize("name", list(TINY))
@pytest.mark.parametrize("T", [4, 6, 17])
def test_memory_equals_transformers_cache(name, T, saved):
    check_cache(*saved(name), T)


@pytest.mark.parametrize("name", list(TINY))
def test_config_counts_equal_transformers(name, saved):
    """The text model's saved tensors: the wrapper's vision tower and projector are not loaded, nor counted in it."""
    wrapper = ("vision_tower", "multi_modal_projector") if name == "gemma3" else ()
    check_counts(*saved(name), leave_out=wrapper)


def text_config(hf):
    return getattr(hf.config, "text_config", hf.config)


@pytest.mark.parametrize("model_type", list(TINY))
def test_config_read(model_type, saved):
    """Layer kinds per the pattern, windows one less than sliding_window, the scale, caps, thetas, norms."""
    hf, folder = saved(model_type)
    tc = text_config(hf)
    cfg = read_model_config(folder)
    kinds = [lay.token.KIND for lay in cfg.layers]
    assert kinds == ["window" if x == "sliding_attention" else "attention" for x in tc.layer_types]
    assert kinds == ["window", "attention"] * 2
    assert {lay.norms for lay in cfg.layers} == {"sandwich"} and cfg.tie_embeddings
    assert {lay.channel.activation for lay in cfg.layers} == {"geglu_tanh"}
    local, glob = cfg.layers[0].token, cfg.layers[1].token
    assert local.window == tc.sliding_window - 1
    assert local.attn_scale == glob.attn_scale == 24 ** -0.5
    assert cfg.embed_scale == pytest.approx(math.sqrt(64))
    if model_type == "gemma2":
        assert (local.softcap, cfg.logit_softcap, local.qk_norm) == (2.0, 3.0, False)
        assert local.rope_theta == glob.rope_theta == tc.rope_parameters["rope_theta"]
    else:
        assert (local.softcap, cfg.logit_softcap, local.qk_norm) == (None, None, True)
    if model_type != "gemma2":
        assert (local.rope_theta, glob.rope_theta) == (100.0, 10000.0)
        assert local.rope_scaling is None
        assert glob.rope_scaling == (dict(rope_type="linear", factor=8.0, original_max_position_embeddings=512)
                                     if model_type == "gemma3_linear" else None)


def plain_capped(q, k, v, scale, cap, window=None):
    """Softmax attention written out: scores * scale, capped, causal (and windowed) mask, per head."""
    B, T, H, K = q.shape
    G = k.shape[2]
    k, v = k.repeat_interleave(H // G, 2), v.repeat_interleave(H // G, 2)
    s = torch.einsum("bthk,blhk->bhtl", q, k) * scale
    s = cap * torch.tanh(s / cap)
    pos = torch.arange(T)
    mask = pos[None, :] <= pos[:, None]
    if window is not None:
        mask &= pos[None, :] >= pos[:, None] - window
    p = torch.softmax(s.masked_fill(~mask, float("-inf")), -1)
    return torch.einsum("bhtl,blhk->bthk", p, v)


@pytest.mark.parametrize("kind", ["attention", "window"])
def test_softcap_value_and_gradient(kind):
    """An attention store with ``softcap`` equals the written-out capped softmax in value and gradient (fp64),
    prefill in two chunks equals one pass, and a cap changes the output."""
    from storelab.stores.attention import AttentionConfig, WindowConfig

    torch.manual_seed(0)
    common = dict(d_model=32, n_heads=4, n_kv_heads=2, head_dim=8, attn_scale=0.4, softcap=1.5)
    cfg = WindowConfig(window=3, **common) if kind == "window" else AttentionConfig(**common)
    mod = cfg.build().double()
    x = torch.randn(2, 11, 32, dtype=torch.float64, requires_grad=True)
    y, _ = mod(x)
    q, k, v, _ = mod.project(x, torch.arange(11))
    want = mod.o_proj(plain_capped(q, k, v, 0.4, 1.5, 3 if kind == "window" else None).flatten(2))
    assert_close(y, want, atol=1e-12, what=f"{kind} capped")
    g = torch.randn_like(y)
    (gx,) = torch.autograd.grad(y, x, g, retain_graph=True)
    (gw,) = torch.autograd.grad(want, x, g)
    assert_close(gx, gw, atol=1e-12, what=f"{kind} capped gradient")
    with torch.no_grad():
        a, st = mod(x[:, :5])
        b, _ = mod(x[:, 5:], st)
    assert_close(torch.cat([a, b], 1), y.detach(), atol=1e-12, what=f"{kind} chunked")
    uncapped = AttentionConfig(**dict(common, softcap=None)) if kind == "attention" else \
        WindowConfig(window=3, **dict(common, softcap=None))
    free = uncapped.build().double()
    free.load_state_dict(mod.state_dict())
    assert (free(x)[0] - y).abs().max().item() > 1e-3


def test_softcap_refused_naming_the_field():
    from storelab.stores.attention import AttentionConfig

    with pytest.raises(ValueError, match="softcap"):
        AttentionConfig(d_model=32, n_heads=4, head_dim=8, softcap=0.0)


def test_published_gemma_2_9b():
    """google/gemma-2-9b as published (no ``layer_types``: local and global alternate, the first local): the
    caps and scalar read, and the model card's 9.24B parameters (9,241,705,984 in its safetensors)."""
    from storelab.models.accounting import count_params

    cfg = read_model_config(FIXTURES / "gemma-2-9b.json")
    kinds = [lay.token.KIND for lay in cfg.layers]
    assert kinds == ["window", "attention"] * 21
    tok = cfg.layers[0].token
    assert (tok.window, tok.softcap, tok.attn_scale, cfg.logit_softcap) == (4095, 50.0, 256 ** -0.5, 30.0)
    assert (tok.n_heads, tok.n_kv_heads, tok.head_dim, cfg.tie_embeddings) == (16, 8, 256, True)
    assert count_params(cfg).stored == 9_241_705_984


def test_published_gemma_3_1b():
    """google/gemma-3-1b-it as published (v4 rope fields): five local layers (theta 10,000, window 512) to one
    global (theta 1,000,000), per-head q/k norms, no caps; the model card's 1B (999,885,952 saved)."""
    from storelab.models.accounting import count_params

    cfg = read_model_config(FIXTURES / "gemma-3-1b-it.json")
    glob = [i for i, lay in enumerate(cfg.layers) if lay.token.KIND == "attention"]
    assert glob == [5, 11, 17, 23]
    local, g = cfg.layers[0].token, cfg.layers[5].token
    assert (local.rope_theta, g.rope_theta, local.window) == (10000.0, 1_000_000.0, 511)
    assert local.qk_norm and local.softcap is None and cfg.logit_softcap is None
    assert count_params(cfg).stored == 999_885_952


def test_rope_scaling_as_published(tmp_path):
    """Gemma 3 4B and up scale the global layers' rotation (v4 ``rope_scaling``: linear, 8): carried by the global
    layers only and run (the logits: ``gemma3_linear`` above); a scaling storelab does not compute is read for
    accounting and refused for running, naming the field."""
    from storelab.checkpoint.families import family_for

    hf = json.loads((FIXTURES / "gemma-3-1b-it.json").read_text())
    hf["rope_scaling"] = {"rope_type": "linear", "factor": 8.0}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    cfg = read_model_config(tmp_path)
    assert cfg.layers[0].token.rope_theta == 10000.0 and cfg.layers[0].token.rope_scaling is None
    assert cfg.layers[5].token.rope_scaling["factor"] == 8.0
    family_for(hf).runs(hf)
    hf["rope_scaling"] = {"rope_type": "dynamic", "factor": 8.0}
    (tmp_path / "config.json").write_text(json.dumps(hf))
    assert cfg.layers[5].token.num_params() == read_model_config(tmp_path).layers[5].token.num_params()
    with pytest.raises(CheckpointError, match=r"rope_scaling.rope_type: 'dynamic'"):
        family_for(hf).runs(hf)


@pytest.mark.parametrize("change, message", [
    (dict(layer_types=["sliding_attention", "chunked_attention", "full_attention", "full_attention"]),
     r"layer_types\[1\]: 'chunked_attention' is not a Gemma layer type"),
    (dict(hidden_activation="silu"), r"hidden_activation: 'silu' is not supported"),
    (dict(use_bidirectional_attention=True), r"use_bidirectional_attention: true is not supported"),
    (dict(sliding_window=1), r"sliding_window: must be an integer >= 2"),
])
def test_refuses_naming_the_field(tmp_path, change, message):
    hf = dict(TINY["gemma3_text"], model_type="gemma3_text", **change)
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(CheckpointError, match=message):
        read_model_config(tmp_path)


def test_null_cap_is_no_cap(tmp_path):
    """``attn_logit_softcapping: null`` in a Gemma 2 file means no cap (transformers' reading), absent means 50."""
    hf = dict(TINY["gemma2"], model_type="gemma2")
    del hf["attn_logit_softcapping"]
    (tmp_path / "config.json").write_text(json.dumps(dict(hf, final_logit_softcapping=None)))
    cfg = read_model_config(tmp_path)
    assert cfg.layers[0].token.softcap == 50.0 and cfg.logit_softcap is None


def test_minimal_wrapper_reads_transformers_defaults(tmp_path):
    """Google's Gemma 3 4B-27B files give the text model in a few fields (Gemma 3 4B's: width 2560, MLP 10240,
    34 layers, linear rope scaling 8, window 1024) and leave heads, head_dim and vocabulary to
    ``Gemma3TextConfig``'s defaults: read as transformers reads them, and the text model's parameters equal those
    of transformers' ``Gemma3ForCausalLM`` built from the same config (on the meta device, no weights)."""
    from transformers import AutoConfig, Gemma3ForCausalLM

    from storelab.models.accounting import count_params

    text = dict(hidden_size=2560, intermediate_size=10240, model_type="gemma3_text", num_hidden_layers=34,
                rope_scaling=dict(factor=8.0, rope_type="linear"), sliding_window=1024)
    hf = dict(architectures=["Gemma3ForConditionalGeneration"], model_type="gemma3", mm_tokens_per_image=256,
              text_config=text, vision_config=dict(hidden_size=1152, image_size=896, intermediate_size=4304,
                                                   model_type="siglip_vision_model", num_attention_heads=16,
                                                   num_hidden_layers=27, patch_size=14, vision_use_head=False))
    (tmp_path / "config.json").write_text(json.dumps(hf))
    cfg = read_model_config(tmp_path)
    tc = AutoConfig.for_model(**hf).text_config
    tok = cfg.layers[5].token
    assert (tok.n_heads, tok.n_kv_heads, tok.head_dim) == (tc.num_attention_heads, tc.num_key_value_heads,
                                                           tc.head_dim) == (8, 4, 256)
    assert (cfg.vocab_size, cfg.context, cfg.tie_embeddings) == (tc.vocab_size, tc.max_position_embeddings, True)
    assert tok.rope_scaling["factor"] == 8.0 and cfg.layers[0].token.rope_scaling is None
    with torch.device("meta"):
        ref = Gemma3ForCausalLM(tc)
    held = sum(p.numel() for n, p in ref.named_parameters())  # the tied head is one tensor
    assert count_params(cfg).stored == held
