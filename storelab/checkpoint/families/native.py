"""storelab's own checkpoints, written by ``storelab.checkpoint.save``.

config.json holds ``{"model_type": "storelab", "model": {...}, "adapters": [...]}`` where
``model`` is the ModelConfig written out exactly: its top-level fields and, per layer, the
full dict of each slot's store config (None values kept: ``ModelConfig.to_dict``'s compact
file form drops them, and a None that differs from a field's default, such as KDA's
``gate_lower_bound``, would come back as the default). A ``config`` key in the compact file
form (``ModelConfig.to_dict``) is read too. ``adapters`` is the older record of MiniMax's
clamped SwiGLU layers, read into their channel configs (``storelab.checkpoint.adapters``).
The safetensors hold our state dict under our own
names (a tied LM head once, as ``embed.weight``), so the table is the identity.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from storelab.checkpoint.adapters import read_adapters
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.shards import CheckpointError
from storelab.checkpoint.table import copy

NAME = "storelab"
MODEL_TYPES = ("storelab",)
IGNORED = ()
SLOTS = ("token", "channel", "depth", "lookup", "beside")


def config_to_json(cfg) -> dict[str, Any]:
    """The ModelConfig as plain JSON data, every store field included."""
    top = {f.name: getattr(cfg, f.name) for f in dataclasses.fields(cfg) if f.name not in ("layers", "published")}
    top["published"] = dataclasses.asdict(cfg.published) if cfg.published is not None else None
    top["layers"] = [{**{s: (getattr(lay, s).to_dict() if getattr(lay, s) is not None else None) for s in SLOTS},
                      "cache_owner": lay.cache_owner, "selection_owner": lay.selection_owner, "norms": lay.norms}
                     for lay in cfg.layers]
    return top


def _store(d: dict, where: str):
    from storelab.stores import REGISTRY

    kind = d.get("kind")
    if kind not in REGISTRY:
        raise CheckpointError(f"config.json: {where}.kind: unknown store kind {kind!r}")
    cls = REGISTRY[kind]
    names = {f.name for f in dataclasses.fields(cls)}
    try:
        return cls.from_dict({k: v for k, v in d.items() if k in names})
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"config.json: {where} ({kind}): {e}") from None


def config_from_json(m: dict[str, Any]):
    from storelab.models.config import LayerConfig, ModelConfig, Published

    layers = []
    for i, lay in enumerate(m["layers"]):
        slots = {s: _store(lay[s], f"model.layers[{i}].{s}") for s in SLOTS if lay.get(s) is not None}
        try:
            layers.append(LayerConfig(**slots, cache_owner=lay.get("cache_owner"),
                                      selection_owner=lay.get("selection_owner"), norms=lay.get("norms", "pre")))
        except ValueError as e:
            raise CheckpointError(f"config.json: model.layers[{i}]: {e}") from None
    top = {k: v for k, v in m.items() if k not in ("layers", "published")}
    pub = Published(**m["published"]) if m.get("published") else None
    return ModelConfig(**top, layers=layers, published=pub)


def to_config(hf: dict):
    from storelab.models.config import ModelConfig

    if isinstance(hf.get("model"), dict):
        try:
            cfg = config_from_json(hf["model"])
        except (KeyError, TypeError) as e:
            raise CheckpointError(f"config.json: model: malformed ({e})") from None
    elif isinstance(hf.get("config"), dict):
        cfg = ModelConfig.from_dict(hf["config"], source="config.json: config")
    else:
        raise CheckpointError("config.json: model: missing (a storelab checkpoint keeps its model config there)")
    return read_adapters(cfg, list(hf.get("adapters", [])))


def table(hf: dict, cfg, names: set[str]) -> dict:
    import torch

    from storelab.checkpoint.table import ours_to_load
    from storelab.models.model import Model

    with torch.device("meta"):
        model = Model(cfg)
    return {k: copy(k, integer=not v.dtype.is_floating_point) for k, v in ours_to_load(model).items()}


FAMILY = Family(stores=("any",), oracle="storelab's own save and load: tensors and logits equal",
                name=NAME, model_types=MODEL_TYPES, to_config=to_config, table=table)
