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

And three facts ``storelab families`` prints (``storelab.checkpoint.families.catalog``):

* ``stores``: the store kinds its configs can build (a family test holds every tiny model's kinds to it,
  ``tests/family_harness.py``, and so does every published config, ``tests/test_published_configs.py``);
* ``refused``: why no config of the family is loaded, when none is (accounting only); empty: it runs;
* ``oracle``: what its tests hold it to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["Family", "fixed", "ORACLE"]

# what a family's tests hold it to unless it says otherwise (tests/family_harness.py)
ORACLE = "transformers 5.23: logits (fp32, bf16), prefill-then-step, cache bytes and parameters of its tiny model"


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
    stores: tuple[str, ...] = ()
    refused: str = ""
    oracle: str = ORACLE
