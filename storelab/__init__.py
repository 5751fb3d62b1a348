"""storelab: every layer a store.

Implements, measures and explains the memory of modern language models,
following the essay "Every Layer a Store" (2026).
"""

__version__ = "0.1.0"

import storelab.zoo  # noqa: E402,F401  (registers the zoo's names for ``extends`` in model files)
from storelab.allocator import keep_freed_memory  # noqa: E402,F401


def __getattr__(name: str):
    """``storelab.load`` and ``storelab.save`` (checkpoints), imported on first use.

    ``storelab.load(x, *, device="cpu", dtype=None, tiny=False, offline=None)`` takes any model argument a
    command takes (``storelab.checkpoint.source.load``): a checkpoint folder, a .gguf file, a config.json
    with its safetensors beside it, or a Hugging Face repo id ``org/name[@revision]`` whose weights are in
    the local cache, loaded with its weights; a zoo name (``tiny-NAME``...) or a storelab model file, built
    with random weights (torch's global generator). ``storelab.save(model, folder)`` writes a model."""
    if name == "load":
        from storelab.checkpoint.source import load

        return load
    if name == "save":
        import storelab.checkpoint as checkpoint

        return checkpoint.save
    raise AttributeError(f"module 'storelab' has no attribute {name!r}")
