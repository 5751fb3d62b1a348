"""The checks every GGUF architecture's tests make against transformers' tiny model of its family, once:

* ``built_fixture(make)``: a module-scoped fixture ``built(name) -> (hf, folder, gguf path)``, each case made by
  ``make(name, folder) -> (hf model, gguf path)`` once (the model saved with ``save_pretrained`` into ``folder``);
* ``check_header(folder, path)``: the GGUF's header alone gives the HF folder's layer kinds, parameters and
  llama.cpp memory (two lengths and batches);
* ``check_logits(hf, path, T, what)``: storelab's load of the GGUF gives transformers' logits (1e-5 of their scale).
"""

from __future__ import annotations

from typing import Callable

import pytest
import torch

from storelab.checkpoint import load, read_model_config
from storelab.models.accounting import count_params
from tests.family_harness import ids_of
from tests.helpers import assert_close


def built_fixture(make: Callable):
    @pytest.fixture(scope="module")
    def built(tmp_path_factory):
        cache: dict = {}

        def get(name: str):
            if name not in cache:
                folder = tmp_path_factory.mktemp(name)
                hf, path = make(name, folder)
                cache[name] = (hf, folder, path)
            return cache[name]

        yield get
        cache.clear()

    return built


def kinds(cfg) -> list[tuple[str, str]]:
    return [(lay.token.KIND, lay.channel.KIND if lay.channel is not None else "") for lay in cfg.layers]


def check_header(folder, path):
    """(ours, theirs): the configs read from the GGUF and from the folder, after their checks."""
    from storelab.models.engines import engine_layers

    ours, theirs = read_model_config(path), read_model_config(folder)
    assert kinds(ours) == kinds(theirs)
    assert count_params(ours).stored == count_params(theirs).stored
    for T, B in ((100, 1), (5000, 2)):
        assert (engine_layers(ours, T, batch=B, engine="llama.cpp")["layers"]
                == engine_layers(theirs, T, batch=B, engine="llama.cpp")["layers"])
    return ours, theirs


def check_logits(hf, path, T: int, what: str):
    """Storelab's model of the GGUF, after its logits are checked."""
    ours = load(path)
    ids = ids_of(T)
    with torch.no_grad():
        ref = hf(ids).logits
        got, _ = ours(ids)
    assert_close(got, ref, atol=1e-5 * ref.abs().max().item(), what=what)
    return ours
