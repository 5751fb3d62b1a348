"""storelab: every layer a store.

Implements, measures and explains the memory of modern language models,
following the essay "Every Layer a Store" (2026).
"""

__version__ = "0.1.0"
