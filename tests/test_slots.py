"""Slots are checked when a model file is read: a store outside the slots its config may fill is
refused with an error naming the file, the layer, the slot and the store (exit code 2 from the CLI)."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

from storelab.cli import app
from storelab.models.config import LayerConfig, load_model
from storelab.stores import CHANNEL, DEPTH, LOOKUP, REGISTRY, TOKEN

STORES = """
[stores.attn]
kind = "attention"
n_heads = 2
head_dim = 8

[stores.ffn]
kind = "ffn"
d_ff = 32

[stores.res]
kind = "residual"

[stores.mhc]
kind = "mhc"

[stores.kda]
kind = "kda"
n_heads = 2
head_k_dim = 8

[stores.engram]
kind = "engram"
"""

GOOD = {"token": "attn", "channel": "ffn", "depth": "res"}
# (slot, store placed there): each one wrong
WRONG = [("token", "mhc"), ("token", "ffn"), ("token", "engram"), ("depth", "ffn"), ("depth", "attn"),
         ("channel", "attn"), ("channel", "kda"), ("channel", "res"), ("lookup", "kda"), ("lookup", "ffn")]


def _write(tmp_path, slots: dict[str, str]):
    p = tmp_path / "bad.toml"
    layer = "\n".join(f'{k} = "{v}"' for k, v in slots.items())
    p.write_text(f'name = "m"\nd_model = 16\nvocab_size = 32\nn_layers = 2\n{STORES}\n'
                 f'[[layers]]\nat = "all"\ntoken = "attn"\nchannel = "ffn"\ndepth = "res"\n\n'
                 f'[[layers]]\nat = 1\n{layer}\n')
    return p


def test_the_right_slots_load(tmp_path):
    cfg = load_model(_write(tmp_path, {**GOOD, "lookup": "engram"}))
    assert cfg.layers[1].lookup.KIND == "engram" and cfg.layers[0].lookup is None


@pytest.mark.parametrize("slot, store", WRONG)
def test_a_store_in_a_wrong_slot_is_named(tmp_path, slot, store):
    path = _write(tmp_path, {slot: store})
    kind = {"attn": "attention", "res": "residual"}.get(store, store)
    with pytest.raises(ValueError) as e:
        load_model(path)
    msg = str(e.value)
    for part in (str(path), "layer 1", f"{slot}:", repr(store), f"({kind})", f"cannot fill the {slot} slot"):
        assert part in msg, (part, msg)
    r = CliRunner().invoke(app, ["models", "--config", str(path)])
    assert r.exit_code == 2, r.output
    assert "cannot fill the" in r.output and repr(store) in r.output


def test_layer_config_checks_slots_from_python():
    reg = REGISTRY
    attn = reg["attention"](d_model=16, n_heads=2, head_dim=8)
    ffn = reg["ffn"](d_model=16, d_ff=32)
    res = reg["residual"](d_model=16)
    LayerConfig(token=attn, channel=ffn, depth=res)
    with pytest.raises(ValueError, match="channel: a attention store cannot fill the channel slot"):
        LayerConfig(token=attn, channel=attn, depth=res)
    with pytest.raises(ValueError, match="depth: a ffn store cannot fill the depth slot"):
        LayerConfig(token=attn, channel=ffn, depth=ffn)


def test_every_registered_store_declares_its_slots():
    for kind, cls in REGISTRY.items():
        assert cls.SLOTS and set(cls.SLOTS) <= {TOKEN, CHANNEL, DEPTH, LOOKUP}, kind
        assert dataclasses.is_dataclass(cls), kind
