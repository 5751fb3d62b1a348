"""storelab: every layer a store.

Implements, measures and explains the memory of modern language models,
following the essay "Every Layer a Store" (2026).
"""

__version__ = "0.1.0"

import storelab.zoo  # noqa: E402,F401  (registers the zoo's names for ``extends`` in model files)
from storelab.allocator import keep_freed_memory  # noqa: E402,F401


def __getattr__(name: str):
    """``storelab.load`` and ``storelab.save`` (checkpoints), imported on first use."""
    if name in ("load", "save"):
        import storelab.checkpoint as checkpoint

        return getattr(checkpoint, name)
    raise AttributeError(f"module 'storelab' has no attribute {name!r}")
