"""Where a probe's model comes from: a model folder (config.json + safetensors), in memory or streamed.

    open_model(checkpoint, *, stream=False) -> Model
    is_model_folder(path) -> bool

A model folder is a Hugging Face folder of a supported family or one ``storelab save`` wrote
(``storelab.outputs.folder_kind``: "hf" or "save"); a ``storelab train`` run folder is not one
(``storelab.train.loop.load_trained`` reads those). ``stream=False`` loads the weights
(``storelab.load``); ``stream=True`` builds the model on ``meta`` and reads each layer's weights
from the shards for the length of its call (``storelab.checkpoint.stream``): the same logits
and cache, for checkpoints larger than memory. Probes take either unchanged.
"""

from __future__ import annotations

from pathlib import Path

from storelab.outputs import folder_kind

__all__ = ["open_model", "is_model_folder"]


def is_model_folder(path: str | Path) -> bool:
    """A folder with a model's config.json (a supported family's, or ours), not a train run's."""
    return folder_kind(path) in ("hf", "save") and (Path(path) / "config.json").is_file()


def open_model(checkpoint: str | Path, *, stream: bool = False, dtype=None):
    """The model of a model folder, loaded or (``stream``) streamed layer by layer."""
    if stream:
        from storelab.checkpoint.stream import stream as open_streamed

        return open_streamed(checkpoint, dtype=dtype)
    from storelab.checkpoint import load

    return load(checkpoint, dtype=dtype)
