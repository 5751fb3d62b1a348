"""One module per checkpoint family; each says which ``model_type`` values it reads.

A family module defines

* ``NAME`` and ``MODEL_TYPES`` (the ``model_type`` strings of its config.json);
* ``to_config(hf) -> ModelConfig``: the Hugging Face config translated to ours;
* ``table(hf, cfg) -> dict[our name, Src]``: where each of our tensors comes from;
* ``IGNORED``: regular expressions of checkpoint tensors it leaves out on purpose;
* optionally ``adapters(hf, cfg) -> list[dict]`` (see ``storelab.checkpoint.adapters``).
"""

from __future__ import annotations

import importlib
from pathlib import Path

from storelab.checkpoint.shards import CheckpointError

__all__ = ["FAMILIES", "family_for"]

_MODULES = ("native", "mimo_v2_flash", "minimax_m3_vl", "glm_moe_dsa", "qwen3_next", "kimi_linear",
            "deepseek_v4")

FAMILIES = [importlib.import_module(f"{__name__}.{m}") for m in _MODULES]


def family_for(hf: dict, path: str | Path = "") -> object:
    """The family module that reads this config; an unknown ``model_type`` lists the supported ones."""
    mt = hf.get("model_type")
    for fam in FAMILIES:
        if mt in fam.MODEL_TYPES:
            return fam
    known = ", ".join(sorted(t for f in FAMILIES for t in f.MODEL_TYPES))
    raise CheckpointError(f"{Path(path) / 'config.json'}: model_type {mt!r} is not supported (supported: {known})")
