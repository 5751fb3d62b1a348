"""The seven models of the essay (and two variants) as model files, full scale and tiny.

``storelab/zoo/<name>.toml`` holds a model's published config (every value in one
place, with the source letter of shared/reference/models.md: E essay, R released
config, A ancestor, U unknown and chosen). ``<name>.tiny.toml`` is its tiny version:
the same store kinds in the same layer pattern (full-attention positions, sharing,
depth mixer), small widths and a few layers, so that it runs on a CPU in seconds.
Variants say ``extends = "<base>"`` and change only what differs; importing this package
registers the zoo as the resolver of ``extends`` names (``storelab.models.parse.register_extends``).
"""

from __future__ import annotations

from pathlib import Path

from storelab.models.config import ModelConfig, load_model
from storelab.models.parse import register_extends

ZOO_DIR = Path(__file__).parent

SEVEN = ("mimo-v2.6-pro", "kimi-k3", "qwen3.8", "glm-5.3", "deepseek-v4-pro", "deepseek-v4.1-flash", "minimax-m3")
VARIANTS = ("minimax-m3.1-flash", "kimi-k3.1-pro")


def zoo_names() -> list[str]:
    """The seven, then the variants (all that have a file)."""
    return [n for n in (*SEVEN, *VARIANTS) if (ZOO_DIR / f"{n}.toml").exists()]


def zoo_path(name: str, tiny: bool = False) -> Path:
    """The file of a zoo model; ``name`` may also say its tiny version itself, as the file name stem
    ``kimi-k3.tiny`` or as ``tiny-kimi-k3`` (every command takes all three spellings)."""
    if name.startswith("tiny-"):
        name, tiny = name[len("tiny-"):], True
    stem = f"{name}.tiny" if tiny and not name.endswith(".tiny") else name
    p = ZOO_DIR / f"{stem}.toml"
    if not p.exists():
        raise ValueError(f"unknown zoo model {stem!r} (known: {', '.join(zoo_names())})")
    return p


def load_zoo(name: str, tiny: bool = False) -> ModelConfig:
    """A zoo model's config, full scale or its tiny version."""
    return load_model(zoo_path(name, tiny))


register_extends(zoo_path)  # model files may say ``extends = "<zoo name>"``
