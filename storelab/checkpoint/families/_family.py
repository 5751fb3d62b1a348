"""What the loader asks of a checkpoint family: one ``Family`` per module of this package.

Every family answers the same four questions; the loader calls them plainly (no optional
parts, nothing looked up by ``hasattr``):

* ``name``, ``model_types``: the family's name and the ``model_type`` strings of its config.json;
* ``to_config(hf) -> ModelConfig``: the checkpoint's config translated into ours, the whole
  model said there (a checkpoint's activation, say, is a field of its channel stores' configs);
* ``table(hf, cfg, names) -> {our name: Src}``: where each of our tensors comes from, given the
  checkpoint's tensor names;
* ``ignored(hf) -> regular expressions`` of checkpoint tensors it leaves out on purpose (MTP
  layers, a vision tower); ``fixed(...)`` makes it for a family whose list is the same for
  every config;
* ``runs(hf)``: raises a CheckpointError naming the field when the config can be accounted but not
  run (a rope scaling the attention does not implement); ``load`` calls it, the accounting does not.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["Family", "fixed"]


def fixed(*patterns: str) -> Callable[[dict], tuple[str, ...]]:
    """``ignored`` of a family whose ignorable tensors do not depend on the config."""

    def ignored(hf: dict) -> tuple[str, ...]:
        return patterns

    return ignored


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    to_config: Callable[[dict], object]
    table: Callable[[dict, object, set[str]], dict]
    ignored: Callable[[dict], tuple[str, ...]] = fixed()
    runs: Callable[[dict], None] = lambda hf: None
