"""Towers counted apart (``storelab.checkpoint.towers``): each counter equals the sum of transformers' own
tower parameters built from the same config (tiny, and Qwen3.5-0.8B's published vision_config on the
meta device); Qwen3.5-0.8B's published 873M is its text model (752M), its vision tower and its MTP
layer; a part without a counter is named as not counted; ``storelab models --checkpoint`` shows them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from storelab.checkpoint import towers
from storelab.checkpoint.config_only import read_model_config
from storelab.cli import app

FIXTURE = Path(__file__).parent / "fixtures" / "configs" / "Qwen3.5-0.8B-Base.json"
# a tiny Qwen vision tower: every size distinct, so a swapped field shows in the count
QWEN_VISION = dict(depth=3, hidden_size=24, intermediate_size=40, num_heads=2, in_channels=3, patch_size=4,
                   temporal_patch_size=2, spatial_merge_size=2, out_hidden_size=36, num_position_embeddings=16)


def n_params(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


@pytest.mark.parametrize("family,wrapper", [("qwen3_5", "qwen3_5"), ("qwen3_5_moe", "qwen3_5_moe")])
def test_qwen3_5_vision_tower_equals_transformers(family, wrapper):
    import importlib

    conf = importlib.import_module(f"transformers.models.{family}.configuration_{family}")
    model = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
    prefix = "Qwen3_5Moe" if family.endswith("moe") else "Qwen3_5"
    for v in (QWEN_VISION, {**QWEN_VISION, "spatial_merge_size": 3, "in_channels": 1}, {"depth": 1}):
        tower = getattr(model, f"{prefix}VisionModel")(getattr(conf, f"{prefix}VisionConfig")(**v))
        assert towers.VISION[wrapper]({"model_type": wrapper, "vision_config": v}) == n_params(tower), v


def test_qwen3_vl_vision_tower_with_deepstack_mergers_equals_transformers():
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLVisionModel

    for stack in ([0, 2], []):
        v = {**QWEN_VISION, "deepstack_visual_indexes": stack}
        tower = Qwen3VLVisionModel(Qwen3VLVisionConfig(**v))
        assert towers.VISION["qwen3_vl"]({"model_type": "qwen3_vl", "vision_config": v}) == n_params(tower)


def test_qwen3_5_deepstack_indexes_are_not_counted_silently():
    hf = {"model_type": "qwen3_5", "vision_config": {**QWEN_VISION, "deepstack_visual_indexes": [1]}}
    (part,) = towers.parts(hf, None)
    assert part.params is None and "deepstack_visual_indexes" in part.why


def test_published_qwen3_5_vision_config_on_meta():
    """Qwen3.5-0.8B's vision_config as published: transformers' tower built on meta, counted whole."""
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5VisionConfig
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5VisionModel

    hf = json.loads(FIXTURE.read_text())
    with torch.device("meta"):
        tower = Qwen3_5VisionModel(Qwen3_5VisionConfig(**hf["vision_config"]))
    assert towers.VISION["qwen3_5"](hf) == n_params(tower)


def test_qwen3_5_08b_total_is_the_published_873m():
    """Qwen3.5-0.8B publishes 873M: the text model (752M, tests/test_published_configs.py) plus the vision
    tower plus the MTP layer (stored in the release, not built by transformers or storelab)."""
    hf = json.loads(FIXTURE.read_text())
    cfg = read_model_config(FIXTURE)
    found = towers.parts(hf, cfg)
    assert [p.kind for p in found] == ["vision", "mtp"] and all(p.params for p in found)
    total, missing = towers.total(cfg, found)
    assert not missing and round(total / 1e6) == 873, total
    assert "vision tower (qwen3_5)" in cfg.notes and f"{found[0].params:,}" in cfg.notes


@pytest.mark.parametrize("head", [False, True])
def test_siglip_tower_equals_transformers(head):
    from transformers import SiglipVisionConfig, SiglipVisionModel

    v = dict(hidden_size=24, intermediate_size=40, num_hidden_layers=2, num_attention_heads=2, image_size=32,
             patch_size=8, num_channels=3, vision_use_head=head)
    assert towers.siglip_vision(v) == n_params(SiglipVisionModel(SiglipVisionConfig(**v)))


def test_gemma3_tower_and_projector_equal_transformers():
    """Gemma 3's wrapper built tiny: its vision tower and projector, counted from the config it saves."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration

    cfg = Gemma3Config(text_config=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                        num_attention_heads=2, num_key_value_heads=1, head_dim=16, vocab_size=64),
                       vision_config=dict(hidden_size=24, intermediate_size=40, num_hidden_layers=2,
                                          num_attention_heads=2, image_size=32, patch_size=8, vision_use_head=False),
                       mm_tokens_per_image=4)
    hf = Gemma3ForConditionalGeneration(cfg)
    want = sum(p.numel() for n, p in hf.named_parameters() if "vision_tower" in n or "multi_modal_projector" in n)
    assert towers.VISION["gemma3"](cfg.to_dict()) == want


def test_parts_without_a_counter_are_named_not_counted():
    hf = {"model_type": "some_omni", "vision_config": {"model_type": "some_vit"}, "audio_config": {"d_model": 8},
          "text_config": {"num_nextn_predict_layers": 2}}
    found = towers.parts(hf, None)
    assert [(p.kind, p.params) for p in found] == [("vision", None), ("audio", None), ("mtp", None)]
    assert all("no counter" in p.why and "some_omni" in p.why for p in found)
    assert found[0].name == "vision tower (some_vit)"
    bad = {"model_type": "qwen3_5", "vision_config": {**QWEN_VISION, "depth": "3"}}
    (part,) = towers.parts(bad, None)
    assert part.params is None and "vision_config.depth" in part.why
    assert "not counted" in towers.note([part])


def test_models_checkpoint_shows_the_parts_and_the_total():
    r = CliRunner().invoke(app, ["models", "--checkpoint", str(FIXTURE), "--json"])
    assert r.exit_code == 0, r.output
    (rec,) = json.loads(r.stdout)
    p = rec["params"]
    assert [x["kind"] for x in rec["parts"]] == ["vision", "mtp"] and p["not_counted"] == []
    assert p["total_stored"] == p["stored"] + sum(x["params"] for x in rec["parts"])
    r = CliRunner().invoke(app, ["models", "--checkpoint", str(FIXTURE)], env={"COLUMNS": "300"})
    assert r.exit_code == 0 and "vision tower (qwen3_5), from vision_config" in r.output
    assert "text model stored 752M" in r.output and "total: 873M" in r.output, r.output


def test_nextn_mtp_equals_the_published_checkpoints():
    """DeepSeek-V3's and GLM's MTP module (``num_nextn_predict_layers``): GLM-4.7-Flash's safetensors hold
    31,221,488,576 parameters (its tensors summed: gogongxt/python scripts/models/glm_4.7_flash.md, see
    tests/fixtures/configs/SOURCES.md), the text model plus one module, to the parameter; DeepSeek-V3's
    685B are 671B and a 14B module (DeepSeek-V3 model card)."""
    configs = Path(__file__).parent / "fixtures" / "configs"
    for name, want, tol in (("GLM-4.7-Flash", 31_221_488_576, 0), ("DeepSeek-V3", 685e9, 0.005)):
        path = configs / f"{name}.json"
        cfg = read_model_config(path)
        found = towers.parts(json.loads(path.read_text()), cfg)
        assert [p.kind for p in found] == ["mtp"] and found[0].params, found
        total, missing = towers.total(cfg, found)
        assert not missing and abs(total - want) <= tol * want, (name, total)
