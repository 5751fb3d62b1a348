"""The ``adapters`` record of our config.json, read into the store configs and written from them.

Our checkpoints once said MiniMax-M3's unit only there, beside the model config:

    "adapters": [{"kind": "clamped_swiglu", "alpha": 1.702, "limit": 7.0, "up_shift": 1.0,
                  "layers": [0, 1, ...]}]

and the loader swapped the listed layers' channel modules to a class computing it. The unit is
now a field of the ``ffn``/``moe`` configs (``activation="clamped_swiglu"``, ``swiglu_alpha``,
``swiglu_limit``, ``swiglu_up_shift``; ``storelab.stores.ffn``), so the model config says it all:

* ``read_adapters(cfg, adapters)`` writes a record's unit into the listed layers' channel
  configs (a checkpoint saved before the change); a layer whose config already says the same
  unit is left as it is, one that says another is an error naming the record and the layer;
* ``adapters_of(cfg)`` is the record of a model config, which ``save`` still writes so that a
  config.json names the unit where it always did; ``load`` reads the configs and checks the
  record against them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from storelab.checkpoint.shards import CheckpointError

__all__ = ["read_adapters", "adapters_of", "KINDS"]

KINDS = ("clamped_swiglu",)
GATED = ("swiglu", "clamped_swiglu")  # the activations the record may rewrite: the gated units


def _unit(a: dict[str, Any], where: str) -> dict[str, Any]:
    """The channel config fields a record entry stands for."""
    if a.get("kind") not in KINDS:
        raise CheckpointError(f"config.json: {where}.kind: unknown adapter kind {a.get('kind')!r} "
                              f"(known: {', '.join(KINDS)})")
    if "alpha" not in a:
        raise CheckpointError(f"config.json: {where}.alpha: missing (the clamped SwiGLU's sigmoid slope)")
    return {"activation": "clamped_swiglu", "swiglu_alpha": float(a["alpha"]), "swiglu_limit": a.get("limit"),
            "swiglu_up_shift": float(a.get("up_shift", 0.0))}


def read_adapters(cfg, adapters: list[dict[str, Any]]):
    """``cfg`` (a ModelConfig, changed in place and returned) with each record's unit in its layers' channels."""
    for j, a in enumerate(adapters):
        where = f"adapters[{j}]"
        unit = _unit(a, where)
        for i in a.get("layers", []):
            if not 0 <= i < cfg.n_layers:
                raise CheckpointError(f"config.json: {where}.layers: layer {i} is not among the model's "
                                      f"{cfg.n_layers}")
            lay = cfg.layers[i]
            ch = lay.channel
            now = ch.to_dict() if ch is not None else {}
            if now.get("activation") not in GATED:
                what = "no channel store" if ch is None else f"a {ch.KIND} channel (activation " \
                                                             f"{now.get('activation')!r})"
                raise CheckpointError(f"config.json: {where}: layer {i} has {what}; clamped_swiglu replaces the "
                                      f"swiglu unit of an ffn or moe store")
            if now["activation"] == "clamped_swiglu":
                differ = sorted(k for k, v in unit.items() if now.get(k) != v)
                if differ:
                    raise CheckpointError(f"config.json: {where}: layer {i}'s channel says "
                                          f"{differ[0]}={now.get(differ[0])!r}, the record {unit[differ[0]]!r}")
                continue
            try:
                lay.channel = dataclasses.replace(ch, **unit)
            except ValueError as e:
                raise CheckpointError(f"config.json: {where}: layer {i}: {e}") from None
    return cfg


def adapters_of(cfg) -> list[dict[str, Any]]:
    """The record of a model config: one entry per clamped SwiGLU setting, with its layers."""
    groups: dict[tuple, list[int]] = {}
    for i, lay in enumerate(cfg.layers):
        d = lay.channel.to_dict() if lay.channel is not None else {}
        if d.get("activation") == "clamped_swiglu":
            groups.setdefault((d["swiglu_alpha"], d["swiglu_limit"], d["swiglu_up_shift"]), []).append(i)
    return [{"kind": "clamped_swiglu", "alpha": alpha, "limit": limit, "up_shift": shift, "layers": layers}
            for (alpha, limit, shift), layers in groups.items()]
