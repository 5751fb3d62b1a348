"""Checkpoint families answer one protocol; MiniMax's clamped SwiGLU lives in the store configs,
and our checkpoints saved with the older ``adapters`` record still load to the same logits."""

from __future__ import annotations

import json

import pytest
import torch

from storelab.checkpoint import CheckpointError, load, save
from storelab.checkpoint.families import FAMILIES, Family
from tests.helpers import assert_close
from tests.test_checkpoint import prompt, tiny_hf

OLD_MOE_FIELDS = ("activation", "swiglu_alpha", "swiglu_up_shift")  # fields the older configs did not have


def test_every_family_answers_the_same_protocol():
    assert FAMILIES and all(isinstance(f, Family) for f in FAMILIES)
    for f in FAMILIES:
        assert f.name and f.model_types and callable(f.to_config) and callable(f.table)
        hf = {"model_type": f.model_types[0], "num_hidden_layers": 3}
        assert isinstance(f.ignored(hf), tuple)
    assert len({t for f in FAMILIES for t in f.model_types}) == sum(len(f.model_types) for f in FAMILIES)


@pytest.fixture(scope="module")
def minimax(tmp_path_factory):
    """(transformers model, our model loaded from it, the folder of our save)."""
    hf = tiny_hf("minimax_m3_vl_text")
    d = tmp_path_factory.mktemp("minimax_hf")
    hf.save_pretrained(d)
    ours = load(d)
    out = tmp_path_factory.mktemp("minimax_ours")
    save(ours, out)
    return hf, ours, out


def test_minimax_configs_say_the_clamped_unit(minimax):
    hf, ours, out = minimax
    t = hf.config
    for lay in ours.cfg.layers:
        ch = lay.channel
        assert (ch.activation, ch.swiglu_up_shift) == ("clamped_swiglu", 1.0)
        assert ch.swiglu_alpha == pytest.approx(getattr(t, "swiglu_alpha", 1.702))
        assert ch.swiglu_limit == getattr(t, "swiglu_limit", None)
    saved = json.loads((out / "config.json").read_text())
    assert [a["layers"] for a in saved["adapters"]] == [list(range(ours.cfg.n_layers))]
    assert all(lay["channel"]["activation"] == "clamped_swiglu" for lay in saved["model"]["layers"])


def _older_format(cfg_json: dict) -> dict:
    """config.json as storelab wrote it before the unit was a config field: plain swiglu channels
    and the unit only in the ``adapters`` record."""
    old = json.loads(json.dumps(cfg_json))
    for lay in old["model"]["layers"]:
        ch = lay["channel"]
        for k in OLD_MOE_FIELDS:
            ch.pop(k, None)
        if ch["kind"] == "ffn":
            ch.pop("swiglu_limit")
            ch["activation"] = "swiglu"
        else:
            ch["swiglu_limit"] = None
    return old


def test_older_checkpoint_with_adapters_record_loads_to_the_same_logits(minimax, tmp_path):
    hf, ours, out = minimax
    cfg_json = json.loads((out / "config.json").read_text())
    old = _older_format(cfg_json)
    assert old["adapters"] and old["adapters"][0]["kind"] == "clamped_swiglu"
    (tmp_path / "config.json").write_text(json.dumps(old))
    (tmp_path / "model.safetensors").write_bytes((out / "model.safetensors").read_bytes())
    back = load(tmp_path)
    assert [lay.channel for lay in back.cfg.layers] == [lay.channel for lay in ours.cfg.layers]
    ids = prompt()
    with torch.no_grad():
        assert torch.equal(back(ids)[0], ours(ids)[0])
        assert_close(back(ids)[0], hf(ids).logits, atol=1e-4, what="older minimax checkpoint")
    # without the record the older file means plain swiglu: other logits
    (tmp_path / "config.json").write_text(json.dumps({**old, "adapters": []}))
    with torch.no_grad():
        assert (load(tmp_path)(ids)[0] - ours(ids)[0]).abs().max() > 1e-3


@pytest.mark.parametrize("edit,match", [
    (lambda a: a.update(kind="geglu"), r"adapters\[0\]\.kind"),
    (lambda a: a.pop("alpha"), r"adapters\[0\]\.alpha"),
    (lambda a: a.update(alpha=2.5), r"adapters\[0\]: layer 0's channel says swiglu_alpha"),
    (lambda a: a.update(layers=[0, 99]), r"adapters\[0\]\.layers: layer 99"),
])
def test_bad_adapters_record_names_the_entry(minimax, tmp_path, edit, match):
    _, _, out = minimax
    cfg_json = json.loads((out / "config.json").read_text())
    edit(cfg_json["adapters"][0])
    (tmp_path / "config.json").write_text(json.dumps(cfg_json))
    (tmp_path / "model.safetensors").write_bytes((out / "model.safetensors").read_bytes())
    with pytest.raises(CheckpointError, match=match):
        load(tmp_path, device="meta")


def test_adapters_record_on_a_non_gated_channel_is_refused(tmp_path):
    from storelab.models.model import Model
    from storelab.zoo import load_zoo

    cfg = load_zoo("mimo-v2.6-pro", tiny=True)
    torch.manual_seed(0)
    save(Model(cfg), tmp_path)
    c = json.loads((tmp_path / "config.json").read_text())
    assert c["adapters"] == []
    c["model"]["layers"][0]["channel"] = {**c["model"]["layers"][0]["channel"], "activation": "relu"}
    c["adapters"] = [{"kind": "clamped_swiglu", "alpha": 1.702, "limit": None, "up_shift": 1.0, "layers": [0]}]
    (tmp_path / "config.json").write_text(json.dumps(c))
    with pytest.raises(CheckpointError, match=r"adapters\[0\]: layer 0 has a \w+ channel"):
        load(tmp_path, device="meta")
