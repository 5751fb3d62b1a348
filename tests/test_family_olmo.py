"""The OLMo 2 / OLMo 3 / OLMoE family (``storelab/checkpoint/families/olmo2.py``) against transformers 5.23's
tiny ``olmo2``, ``olmo3`` and ``olmoe`` models saved with ``save_pretrained``: the config read (post norms,
q/k norms over the whole projections, OLMo 3's windows and per-type rope, OLMoE's experts), logits equal in
fp32 (1e-5 of the logits' scale) and bf16 (5 %), chunked prefill + steps equal to one pass, transformers'
cache bytes after a prefill (windows filled and not), parameters from config.json alone equal to the saved
tensors; a v4 file's YaRN kept off the sliding layers; OLMoE's ``clip_qkv`` read but refused for loading;
AllenAI's OLMo 2 13B and 32B files read.
"""

from __future__ import annotations

import json

import pytest
import torch

from storelab.checkpoint import load
from storelab.checkpoint.config_only import read_model_config
from tests.helpers import assert_close
from tests.test_families import ids_of
from tests.family_harness import check_bf16, check_cache, check_counts, check_logits, saved_fixture

SPLITS_A = ((0, 2), (2, 11), (11, 12), (12, 13), (13, 21))  # single tokens between chunks

COMMON = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
              intermediate_size=96, bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=512)
# olmo3: the sliding and full layers rotate with different thetas, so that a layer given the other's shows;
# olmoe: the chosen experts' weights renormalised (norm_topk_prob), which shows when the mapping is wrong
TINY = {
    "olmo2": dict(COMMON, rope_parameters=dict(rope_type="default", rope_theta=1000.0)),
    "olmo3": dict(COMMON, sliding_window=6, layer_types=["sliding_attention", "full_attention"] * 2,
                  rope_parameters={"sliding_attention": dict(rope_type="default", rope_theta=100.0),
                                   "full_attention": dict(rope_type="default", rope_theta=10000.0)}),
    "olmoe": dict(COMMON, intermediate_size=32, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True),
}


saved = saved_fixture(TINY, lambda name: name, perturb=0.3)

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
    check_counts(*saved(name))


@pytest.mark.parametrize("model_type", list(TINY))
def test_config_read(model_type, saved):
    """Post norms (OLMoE: pre), whole-projection q/k norms, the windows one less than sliding_window, the thetas
    per type, OLMoE's experts."""
    hf, folder = saved(model_type)
    cfg = read_model_config(folder)
    want_norms = "pre" if model_type == "olmoe" else "post"
    assert {lay.norms for lay in cfg.layers} == {want_norms} and not cfg.tie_embeddings
    toks = [lay.token for lay in cfg.layers]
    assert all(a.qk_norm and a.qk_norm_scope == "all" and a.partial_rotary == 1.0 for a in toks)
    if model_type == "olmo2":
        assert [a.KIND for a in toks] == ["attention"] * 4 and {a.rope_theta for a in toks} == {1000.0}
    elif model_type == "olmoe":
        moe = [lay.channel for lay in cfg.layers]
        assert {(m.KIND, m.n_experts, m.top_k, m.d_expert, m.router, m.norm_topk_prob) for m in moe} == {
            ("moe", 4, 2, 32, "softmax", True)}
    else:
        assert [a.KIND for a in toks] == ["window", "attention"] * 2
        assert toks[0].window == hf.config.sliding_window - 1
        assert (toks[0].rope_theta, toks[1].rope_theta) == (100.0, 10000.0)
    assert cfg.norm_eps == hf.config.rms_norm_eps


def test_v4_rope_scaling_belongs_to_the_full_layers(tmp_path):
    """An OLMo 3 file in the v4 form (``rope_theta`` + ``rope_scaling`` YaRN, as OLMo 3 7B publishes it): the
    full layers carry the scaling, the sliding ones rotate plainly (``Olmo3Config`` reads it so), and the
    logits equal transformers' model built from the same file, past the pretraining length (16); a file
    without ``layer_types`` gets three sliding layers to one full."""
    from transformers import AutoConfig, AutoModelForCausalLM

    yarn = dict(rope_type="yarn", factor=8.0, original_max_position_embeddings=16, attention_factor=1.2,
                beta_fast=32, beta_slow=1)
    v4 = dict(COMMON, sliding_window=6, rope_theta=500000.0, rope_scaling=yarn, max_position_embeddings=128)
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model("olmo3", **v4)).eval()
    hf.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(dict(v4, model_type="olmo3")))  # the file as published
    cfg = read_model_config(tmp_path)
    toks = [lay.token for lay in cfg.layers]
    assert [a.KIND for a in toks] == ["window", "window", "window", "attention"]
    assert [a.rope_scaling is None for a in toks] == [True, True, True, False]
    assert toks[3].rope_scaling["rope_type"] == "yarn" and {a.rope_theta for a in toks} == {500000.0}
    ids = ids_of(40)
    with torch.no_grad():
        ref = hf(ids).logits
        got, _ = load(tmp_path)(ids)
    assert_close(got, ref, atol=1e-5 * ref.abs().max().item(), what="olmo3 v4 yarn logits")


@pytest.mark.parametrize("name", ["OLMo-2-1124-13B", "OLMo-2-0325-32B"])
def test_published_olmo2(name):
    """AllenAI's OLMo 2 13B (MHA) and 32B (GQA, 8 KV heads) config.json as published: every layer full attention
    with post norms and whole-projection q/k norms, and the parameter count equal to the sum written out from
    the file's numbers (embedding and head untied, per layer the attention, its (H + G) K norm weights, the
    SwiGLU MLP and two d_model norms, the final norm)."""
    from pathlib import Path

    from storelab.models.accounting import count_params

    path = Path(__file__).parent / "fixtures" / "configs" / f"{name}.json"
    raw = json.loads(path.read_text())
    cfg = read_model_config(path)
    D, V, I, n = raw["hidden_size"], raw["vocab_size"], raw["intermediate_size"], raw["num_hidden_layers"]
    H, G = raw["num_attention_heads"], raw["num_key_value_heads"]
    K = D // H
    assert [lay.token.KIND for lay in cfg.layers] == ["attention"] * n
    assert {(lay.norms, lay.token.qk_norm_scope, lay.token.n_kv_heads) for lay in cfg.layers} == {("post", "all", G)}
    per_layer = D * (H + 2 * G) * K + H * K * D + (H + G) * K + 3 * D * I + 2 * D
    assert count_params(cfg).stored == 2 * V * D + n * per_layer + D


def test_olmoe_clip_qkv_read_but_not_run(tmp_path, saved):
    """OLMoE's ``clip_qkv``: the config is read (accounting), loading the weights refuses it naming the field."""
    import shutil

    from storelab.checkpoint.shards import CheckpointError

    _, folder = saved("olmoe")
    shutil.copytree(folder, tmp_path / "clipped")
    hf = json.loads((folder / "config.json").read_text())
    (tmp_path / "clipped" / "config.json").write_text(json.dumps(dict(hf, clip_qkv=8.0)))
    assert read_model_config(tmp_path / "clipped").n_layers == 4
    with pytest.raises(CheckpointError, match=r"clip_qkv: 8.0: storelab's attention does not clamp"):
        load(tmp_path / "clipped")
