"""Stores: modules with state and a card. Importing this package registers every store.

Each store lives in its own module here; they are discovered and imported
automatically, so adding a store does not touch this file.
"""

import importlib
import pkgutil

from storelab.stores.base import (CHANNEL, DEPTH, LOOKUP, REGISTRY, TOKEN, Card, Footprint, Observation, ParamCount, StoreConfig,
                                  build_store, emit, observe, register, store_cards)

for _m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if _m.name != "base" and not _m.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_m.name}")

__all__ = ["CHANNEL", "DEPTH", "LOOKUP", "REGISTRY", "TOKEN", "Card", "Footprint", "Observation", "ParamCount",
           "StoreConfig", "build_store", "emit", "observe", "register", "store_cards"]
