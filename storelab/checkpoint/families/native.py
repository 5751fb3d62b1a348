"""storelab's own checkpoints, written by ``storelab.checkpoint.save``.

config.json holds ``{"model_type": "storelab", "config": <ModelConfig.to_dict()>,
"adapters": [...]}``; the safetensors hold our state dict under our own names (a tied
LM head once, as ``embed.weight``), so the table is the identity.
"""

from __future__ import annotations

from storelab.checkpoint.shards import CheckpointError
from storelab.checkpoint.table import copy

NAME = "storelab"
MODEL_TYPES = ("storelab",)
IGNORED = ()


def to_config(hf: dict):
    from storelab.models.config import ModelConfig

    if not isinstance(hf.get("config"), dict):
        raise CheckpointError("config.json: config: missing (a storelab checkpoint keeps its model config there)")
    return ModelConfig.from_dict(hf["config"], source="config.json: config")


def adapters(hf: dict, cfg) -> list[dict]:
    return list(hf.get("adapters", []))


def table(hf: dict, cfg, names: set[str]) -> dict:
    from storelab.checkpoint.table import ours_to_load
    from storelab.models.model import Model
    import torch

    with torch.device("meta"):
        model = Model(cfg)
    return {k: copy(k, integer=not v.dtype.is_floating_point) for k, v in ours_to_load(model).items()}
