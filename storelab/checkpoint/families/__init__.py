"""One module per checkpoint family; each ends with its ``FAMILY``, a ``Family`` that says which
``model_type`` values it reads and answers the loader's questions (``_family.py``):
``to_config(hf)``, ``table(hf, cfg, names)`` and ``ignored(hf)``.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from storelab.checkpoint.families._family import Family
from storelab.checkpoint.shards import CheckpointError

__all__ = ["FAMILIES", "Family", "family_for"]

_MODULES = ("native", "mimo_v2_flash", "minimax_m3_vl", "glm_moe_dsa", "qwen3_next", "qwen3_5", "kimi_linear",
            "deepseek_v4", "llama", "qwen2", "qwen3", "mixtral", "smollm3", "deepseek_v3", "mamba", "lfm2",
            "nemotron_h", "gemma", "gemma4", "recurrent_gemma", "olmo2", "exaone4", "cohere2", "seed_oss", "glm", "helium",
            "dots1", "phi3", "arcee", "llama4", "jamba", "bamba", "falcon_h1", "granitemoehybrid", "gpt_oss", "minimax_m2",
            "glm4_moe", "ernie4_5_moe", "deepseek_v2", "olmo_hybrid", "lfm3", "minimax", "bailing_hybrid",
            "granite", "ministral3", "cohere", "internlm3", "qwen3_vl", "gpt_neox", "starcoder2", "stablelm", "glm4_moe_lite", "solar_open", "exaone_moe", "hunyuan", "afmoe", "laguna", "cwm", "mistral4", "cohere2_moe", "step3p7", "orion", "baichuan", "minicpm", "deepseek", "chatglm", "qwen", "internlm", "mellum", "flint", "hy_v3", "youtu", "aria", "cohere_compass",
            "wrappers", "unread")

FAMILIES: list[Family] = [importlib.import_module(f"{__name__}.{m}").FAMILY for m in _MODULES]


def family_for(hf: dict, path: str | Path = "") -> Family:
    """The family that reads this config; an unknown ``model_type`` lists the supported ones. Its sizes are
    held first (``check_sizes``: a billion layers is refused, naming the field, before anything is built)."""
    from storelab.checkpoint.families._reader import check_sizes

    check_sizes(hf, str(Path(path) / "config.json") if str(path) else "config.json")
    mt = hf.get("model_type")
    for fam in FAMILIES:
        if mt in fam.model_types:
            return fam
    known = ", ".join(sorted(t for f in FAMILIES for t in f.model_types))
    raise CheckpointError(f"{Path(path) / 'config.json'}: model_type {mt!r} is not supported (supported: {known})")
