"""Real checkpoints: Hugging Face style folders (config.json + safetensors shards) <-> storelab models.

    load(path, *, device="cpu", dtype=None) -> Model
    save(model, path, *, max_shard_bytes=5 GiB) -> list of files written

``load`` reads these families (``model_type`` of config.json), each through one name table
in ``storelab/checkpoint/families/<family>.py``:

| model_type                              | family (essay model)        | stores                               |
|-----------------------------------------|-----------------------------|--------------------------------------|
| qwen3_next, qwen3_5_moe(_text)          | Qwen3-Next / Qwen3.5 (Qwen3.8) | gated_deltanet + gated attention, moe |
| qwen3_5, qwen3_5_text                   | Qwen3.5 / Qwen3.6 dense     | gated_deltanet + gated attention, ffn |
| kimi_linear                             | Kimi Linear (Kimi K3)       | kda + mla (no RoPE), moe             |
| mimo_v2_flash                           | MiMo-V2-Flash (MiMo)        | window (sinks) + attention, ffn/moe  |
| glm_moe_dsa                             | GLM-MoE-DSA (GLM-5.3)       | dsa with IndexShare, ffn/moe         |
| deepseek_v4                             | DeepSeek-V4 (V4-Pro)        | csa + hca, mhc, moe with hash routing|
| minimax_m3_vl(_text)                    | MiniMax-M3, text part       | msa + attention, ffn/moe (clamped SwiGLU)         |
| storelab                                | ours, written by ``save``   | any                                  |

Weights are read lazily, shard by shard, with safetensors (never pickle). Before a byte is
read, every tensor is checked against the shard headers: a missing, unexpected, mis-typed
or mis-shaped tensor is a ``CheckpointError`` naming the tensor and the file; an unknown
``model_type`` lists the supported ones; a setting no store can express (grouped expert
routing, YaRN, DeepSeek-V4's sliding-only layers) names the config key. FP8 block-quantized
weights are dequantized on the way. ``device="meta"`` builds the model for accounting
without reading any weight; ``read_model_config(path)`` needs only the config.json (a folder
or the file), no shards at all. The loaded model's ``.checkpoint`` says where it came from.
"""

from storelab.checkpoint.config_only import read_model_config
from storelab.checkpoint.loader import load, supported
from storelab.checkpoint.saver import save
from storelab.checkpoint.shards import CheckpointError

SUPPORTED = supported()

__all__ = ["load", "save", "read_model_config", "CheckpointError", "SUPPORTED"]
