"""The Llama 4 family (``storelab/checkpoint/families/llama4.py``) against transformers 5.23's tiny ``llama4_text``
model saved with ``save_pretrained``: the layers read (chunked RoPE layers with the L2 norm, NoPE layers with the
temperature, experts every second layer), logits equal in fp32 (1e-5 of the logits' scale) and bf16, chunked
prefill + steps equal to one pass (chunks of 6 closed and open), parameters from config.json alone equal to the
saved tensors, transformers' cache bytes after a prefill; the ``llama4`` wrapper's text model loaded and its vision
tower counted exactly; the moe store's ``scale_input`` against a plain per-token reference in value and gradient;
Scout's and Maverick's published configs read.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from storelab.checkpoint import load
from storelab.checkpoint.config_only import read_model_config
from tests.helpers import assert_close
from tests.test_families import cache_bytes, ids_of

FIXTURES = Path(__file__).parent / "fixtures" / "configs"

# chunks of 6 (not a power of two, unlike the published 8,192); NoPE on every second layer; experts on layers 1, 3;
# floor_scale 4 and attn_scale 0.5 so that the temperature changes within 21 tokens; 2 experts a token so that
# the input scaling sums two terms
TINY = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
            bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=512, head_dim=16,
            intermediate_size=24, intermediate_size_mlp=96, num_local_experts=4, num_experts_per_tok=2,
            interleave_moe_layer_step=2, attention_chunk_size=6, no_rope_layer_interval=2, floor_scale=4,
            attn_scale=0.5)


def tiny_hf(settings: dict = TINY):
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model("llama4_text", **settings)).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for t in hf.state_dict().values():
            if t.dtype.is_floating_point and (t.dim() == 1 or bool((t == t.flatten()[0]).all())):
                t.add_(0.1 * torch.randn(t.shape, generator=g))
    return hf


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    hf = tiny_hf()
    d = tmp_path_factory.mktemp("llama4")
    hf.save_pretrained(d)
    return hf, d


def test_config_read(saved):
    hf, folder = saved
    cfg = read_model_config(folder)
    assert [lay.token.KIND for lay in cfg.layers] == ["chunked", "attention", "chunked", "attention"]
    rope, nope = cfg.layers[0].token, cfg.layers[1].token
    assert rope.chunk == 6 and rope.rope_interleaved and rope.qk_l2_norm and rope.partial_rotary == 1.0
    assert rope.rope_theta == 5e5 and not rope.attn_temperature_tuning
    assert nope.partial_rotary == 0.0 and nope.attn_temperature_tuning and not nope.qk_l2_norm
    assert (nope.floor_scale, nope.attn_temperature_scale) == (4, 0.5)
    assert [lay.channel.KIND for lay in cfg.layers] == ["ffn", "moe", "ffn", "moe"]
    assert cfg.layers[0].channel.d_ff == 96
    moe = cfg.layers[1].channel
    assert (moe.router, moe.norm_topk_prob, moe.scale_input, moe.top_k) == ("sigmoid", False, True, 2)
    assert (moe.n_experts, moe.d_expert, moe.shared_width) == (4, 24, 24)


def test_logits_equal_transformers(saved):
    hf, folder = saved
    ours = load(folder)
    ids = ids_of(21)
    with torch.no_grad():
        ref = hf(ids).logits
        got, _ = ours(ids)
    tol = 1e-5 * ref.abs().max().item()
    assert_close(got, ref, atol=tol, what="llama4 logits")
    with torch.no_grad():  # pieces that end inside a chunk, on its boundary and across two
        cache, parts = None, []
        for a, b in ((0, 5), (5, 6), (6, 7), (7, 19), (19, 21)):
            out, cache = ours(ids[:, a:b], cache)
            parts.append(out)
    assert_close(torch.cat(parts, 1), got, atol=tol, what="llama4 chunked")


def test_other_settings_logits_equal_transformers(tmp_path):
    """Maverick's settings (no q/k norm, one expert a token) on every layer's experts, with the options Scout and
    Maverick leave off: attention biases, no temperature tuning, NoPE layers placed by an explicit
    ``no_rope_layers``."""
    from tests.test_family_jamba import check_logits

    other = dict(TINY, use_qk_norm=False, num_experts_per_tok=1, interleave_moe_layer_step=1, attention_bias=True,
                 attn_temperature_tuning=False, no_rope_layers=[1, 1, 0, 1], layer_types=None)
    hf = tiny_hf(other)
    hf.save_pretrained(tmp_path)
    cfg = read_model_config(tmp_path)
    assert [lay.token.KIND for lay in cfg.layers] == ["chunked", "chunked", "attention", "chunked"]
    assert {lay.channel.KIND for lay in cfg.layers} == {"moe"} and cfg.layers[0].token.qkv_bias
    assert not cfg.layers[0].token.qk_l2_norm and not cfg.layers[2].token.attn_temperature_tuning
    check_logits(hf, tmp_path, ((0, 5), (5, 6), (6, 7), (7, 19), (19, 21)), "llama4 (other settings)")


def test_output_scaling_would_differ(saved):
    """The experts' weight on their output instead of their input changes the logits: the test above sees it."""
    import dataclasses

    from storelab.models.model import Model

    hf, folder = saved
    ours = load(folder)
    cfg = ours.cfg
    layers = [dataclasses.replace(lay, channel=dataclasses.replace(lay.channel, scale_input=False))
              if lay.channel.KIND == "moe" else lay for lay in cfg.layers]
    other = Model(dataclasses.replace(cfg, layers=layers))
    other.load_state_dict(ours.state_dict())
    ids = ids_of(21)
    with torch.no_grad():
        ref = hf(ids).logits
        diff = (other(ids)[0] - ref).abs().max().item()
    assert diff > 1e-3 * ref.abs().max().item()


def test_bf16_logits(saved):
    hf, folder = saved
    ours = load(folder, dtype="bf16")
    ids = ids_of(13)
    with torch.no_grad():
        ref = hf.to(torch.bfloat16)(ids).logits.float()
        hf.to(torch.float32)
        got = ours(ids)[0].float()
    scale = ref.abs().max().item()
    err = (got - ref).abs().max().item()
    assert err <= 0.05 * scale, f"llama4: bf16 logits differ by {err:.3e} (scale {scale:.3e})"


def test_config_counts_equal_transformers(saved):
    from storelab.models.accounting import count_params

    hf, folder = saved
    cfg = read_model_config(folder / "config.json")
    held = {t.data_ptr(): t.numel() for t in hf.state_dict().values() if t.dtype.is_floating_point}
    assert count_params(cfg).stored == sum(held.values())


@pytest.mark.parametrize("T", [4, 6, 17])
def test_memory_equals_transformers_cache(T, saved):
    """transformers keeps a chunked layer as a sliding one of window attention_chunk_size (a view of the whole
    prefill's storage, as every window layer's); ``engine="transformers"`` says so, the ideal keeps T mod 6."""
    from storelab.models.engines import state_bytes

    hf, folder = saved
    cfg = read_model_config(folder)
    with torch.no_grad():
        past = hf(ids_of(T), use_cache=True).past_key_values
    assert sum(state_bytes(cfg, T, engine="transformers", dtype="fp32").values()) == cache_bytes(past)
    entry = 2 * 2 * 16 * 4  # G (K + V) fp32
    assert state_bytes(cfg, T, engine="ideal", dtype="fp32")["chunked"] == 2 * (T % 6) * entry


def test_wrapper_loads_the_text_model_and_counts_the_vision_tower(tmp_path):
    """The ``llama4`` wrapper (``Llama4ForConditionalGeneration``, saved under ``language_model.model.`` as the
    published files): the text model loads with the vision tensors ignored, its logits on text equal the
    wrapper's, and ``vision_params`` from the config equals the tower's and projector's saved parameters."""
    from transformers import Llama4Config, Llama4ForConditionalGeneration

    from storelab.checkpoint.families.llama4 import vision_params

    vision = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2, image_size=42,
                  patch_size=14, vision_output_dim=40, projector_input_dim=24, projector_output_dim=40)
    torch.manual_seed(0)
    hf = Llama4ForConditionalGeneration(Llama4Config(text_config=dict(TINY, model_type="llama4_text"),
                                                     vision_config=vision)).eval()
    hf.save_pretrained(tmp_path)
    raw = json.loads((tmp_path / "config.json").read_text())
    tower = sum(t.numel() for n, t in hf.state_dict().items() if "vision_model." in n or "multi_modal_projector." in n)
    assert vision_params(raw) == tower and f"{tower:,} parameters" in read_model_config(tmp_path).notes
    ours = load(tmp_path)
    ids = ids_of(21)
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
        got, _ = ours(ids)
    assert_close(got, ref, atol=1e-5 * ref.abs().max().item(), what="llama4 wrapper logits")


def _plain_input_scaled(x_ND, experts_NK, weights_NK, gate_up_EFD, down_EDI):
    """sum_k expert_{e_nk}(w_nk x_n), one token and one expert at a time."""
    out = []
    for n in range(x_ND.shape[0]):
        y = x_ND.new_zeros(down_EDI.shape[1])
        for e, w in zip(experts_NK[n].tolist(), weights_NK[n]):
            gate, up = (gate_up_EFD[e] @ (w * x_ND[n])).chunk(2)
            y = y + down_EDI[e] @ (torch.nn.functional.silu(gate) * up)
        out.append(y)
    return torch.stack(out)


def test_moe_scale_input_equals_plain_reference():
    """The moe store with ``scale_input`` (its grouped dispatch) against the plain per-token sum, in value and in
    the gradients of the input, the experts and the router."""
    from storelab.stores.moe import MoEConfig

    torch.manual_seed(3)
    cfg = MoEConfig(d_model=16, n_experts=4, top_k=2, d_expert=8, router="sigmoid", norm_topk_prob=False,
                    n_shared=1, d_shared=8, scale_input=True, aux_loss_coef=0.0)
    moe = cfg.build().double()
    x = torch.randn(2, 5, 16, dtype=torch.float64, requires_grad=True)
    y, _ = moe(x)
    x_ND = x.reshape(-1, 16)
    weights_NK, experts_NK = moe.route(x_ND, None)
    shared = moe.shared_down_proj(torch.nn.functional.silu(moe.shared_gate_proj(x_ND)) * moe.shared_up_proj(x_ND))
    ref = _plain_input_scaled(x_ND, experts_NK, weights_NK, moe.gate_up, moe.down) + shared
    assert_close(y.reshape(-1, 16), ref, atol=1e-12, what="scale_input value")
    g = torch.randn_like(ref)
    params = [x, moe.gate_up, moe.down, moe.router.weight]
    got = torch.autograd.grad((y.reshape(-1, 16) * g).sum(), params)
    want = torch.autograd.grad((ref * g).sum(), params)
    for name, a, b in zip(("x", "gate_up", "down", "router"), got, want):
        assert_close(a, b, atol=1e-12, what=f"scale_input gradient of {name}")


def test_moe_scale_input_refuses_a_non_bool():
    from storelab.stores.moe import MoEConfig

    with pytest.raises(ValueError, match="scale_input"):
        MoEConfig(d_model=16, n_experts=4, top_k=1, d_expert=8, scale_input="yes")


@pytest.mark.parametrize("name, stored, active", [
    ("Llama-4-Scout-17B-16E-Instruct", 109.0, 17.0),       # Meta's card: 17B active, 109B total (vision included)
    ("Llama-4-Maverick-17B-128E-Instruct", 400.0, 17.0),   # 17B active, 400B total
])
def test_published(name, stored, active):
    """The published wrappers (text_config, no no_rope_layers, Scout's llama3 rope scaling) read: every fourth
    layer NoPE, experts on every layer (Scout) or every second (Maverick), the cards' counts within 1.5 %
    with the vision tower, counted apart (0.87B); loading Scout is refused by its rope."""
    from storelab.checkpoint.families.llama4 import FAMILY, vision_params
    from storelab.checkpoint.shards import CheckpointError
    from storelab.models.accounting import count_params

    path = FIXTURES / f"{name}.json"
    raw = json.loads(path.read_text())
    cfg = read_model_config(path)
    kinds = [lay.token.KIND for lay in cfg.layers]
    assert kinds == (["chunked"] * 3 + ["attention"]) * 12
    step = raw["text_config"]["interleave_moe_layer_step"]
    assert [lay.channel.KIND for lay in cfg.layers] == ["moe" if (i + 1) % step == 0 else "ffn" for i in range(48)]
    assert cfg.layers[0].token.qk_l2_norm == raw["text_config"]["use_qk_norm"]
    pa = count_params(cfg)
    assert vision_params(raw) == 871_932_416
    total = (pa.stored + vision_params(raw)) / 1e9
    assert abs(total - stored) <= 0.015 * stored and abs(pa.active / 1e9 - active) <= 0.015 * active
    FAMILY.runs(raw)         # Scout's llama3 scaling runs (its logits: test_llama3_rope_scaling_equals_transformers)
    published = raw["text_config"].get("rope_scaling")
    got = cfg.layers[0].token.rope_scaling
    assert (got is None) if published is None else (got["rope_type"] == "llama3" and got["factor"] == 16.0
                                                     and got["original_max_position_embeddings"] == 8192)
    assert cfg.layers[3].token.rope_scaling is None       # a NoPE layer has nothing to scale
    bad = json.loads(json.dumps(raw))
    bad["text_config"]["rope_scaling"] = {"rope_type": "dynamic", "factor": 2.0}
    with pytest.raises(CheckpointError, match=r"rope_scaling.rope_type: 'dynamic'"):
        FAMILY.runs(bad)


def test_llama3_rope_scaling_equals_transformers(tmp_path):
    """Scout's rope scaling (rope_type llama3, factor 16 from a pretraining length of 8,192), here from a
    pretraining length of 8 so that the scaled frequencies matter at 21 tokens."""
    from tests.test_family_jamba import check_logits

    scaled = dict(TINY, rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=16.0,
                                             low_freq_factor=1.0, high_freq_factor=4.0,
                                             original_max_position_embeddings=8))
    hf = tiny_hf(scaled)
    hf.save_pretrained(tmp_path)
    cfg = read_model_config(tmp_path)
    assert cfg.layers[0].token.rope_scaling["rope_type"] == "llama3"
    check_logits(hf, tmp_path, ((0, 5), (5, 6), (6, 7), (7, 19), (19, 21)), "llama4 (llama3 rope scaling)")


@pytest.mark.parametrize("change, message", [
    (dict(layer_types=["chunked_attention", "sliding_attention", "chunked_attention", "full_attention"]),
     r"layer_types\[1\]: 'sliding_attention' is not a Llama 4 layer type"),
    (dict(no_rope_layers=[1, 0]), r"no_rope_layers: has 2 entries, but num_hidden_layers is 4"),
    (dict(attention_chunk_size=0), r"attention_chunk_size: must be an integer >= 1"),
])
def test_refuses_naming_the_field(tmp_path, change, message):
    from storelab.checkpoint.shards import CheckpointError

    (tmp_path / "config.json").write_text(json.dumps(dict(TINY, model_type="llama4_text", **change)))
    with pytest.raises(CheckpointError, match=message):
        read_model_config(tmp_path)
