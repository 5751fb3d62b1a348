"""Pure tensor functions: the math of each store, reference and fast forms side by side.

Layout ``[B, T, H, D]`` everywhere. Ops take ``q, k, v`` first, then keyword-only
arguments in one canonical order.
"""

import importlib
import pkgutil

for _m in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
    if not _m.name.startswith("_"):
        _mod = importlib.import_module(f"{__name__}.{_m.name}")
        for _name in getattr(_mod, "__all__", []):
            globals()[_name] = getattr(_mod, _name)
