"""Real checkpoints: Hugging Face style folders (config.json + safetensors shards) <-> storelab models.

    load(path, *, device="cpu", dtype=None) -> Model
    save(model, path, *, max_shard_bytes=5 GiB) -> list of files written

``load`` reads the families in ``SUPPORTED`` (Qwen3-Next / Qwen3.5-MoE, Kimi-Linear,
MiMo-V2-Flash, GLM-MoE-DSA, DeepSeek-V4, MiniMax-M3's text part) and our own
checkpoints (``model_type = "storelab"``, what ``save`` writes). Weights are read lazily,
shard by shard, with safetensors (never pickle), through one name table per family
(``storelab/checkpoint/families``); a missing, unexpected, mis-typed or mis-shaped tensor
is a ``CheckpointError`` naming the tensor and the file. ``device="meta"`` builds the
model for accounting without reading any weight.
"""

from storelab.checkpoint.loader import load, supported
from storelab.checkpoint.saver import save
from storelab.checkpoint.shards import CheckpointError

SUPPORTED = supported()

__all__ = ["load", "save", "CheckpointError", "SUPPORTED"]
