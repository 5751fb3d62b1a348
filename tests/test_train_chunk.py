"""Recurrent stores train in their default (chunked) mode: a model's ``loss.backward()`` through the
chunked delta ops gives the per-token loop's gradients, and the tiny zoo models with recurrent layers
train as they are loaded (no switch to another mode)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from storelab.models.config import ModelConfig
from storelab.models.model import Model
from storelab.train.models import resolve_model
from storelab.zoo import load_zoo
from tests.helpers import assert_close


def _with_mode(cfg: ModelConfig, mode: str) -> ModelConfig:
    layers = [dataclasses.replace(lay, token=dataclasses.replace(lay.token, mode=mode))
              if lay.token.RECURRENT else lay for lay in cfg.layers]
    return dataclasses.replace(cfg, layers=layers)


def _grads(model: Model, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad()
    logits, _ = model(ids)
    torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1)).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("pattern", ["DGKA", "GGGA"])
def test_chunked_training_gradients_equal_the_per_token_loop(pattern):
    cfg = resolve_model(f"pattern:{pattern}", 64, n_layers=4, d_model=32, n_heads=2, head_dim=16, mode="auto")
    assert all(lay.token.mode == "chunk" for lay in cfg.layers if lay.token.RECURRENT)
    torch.manual_seed(0)
    chunked = Model(cfg).double()
    loop = Model(_with_mode(cfg, "recurrent")).double()
    loop.load_state_dict(chunked.state_dict())
    ids = torch.randint(0, 64, (2, 45), generator=torch.Generator().manual_seed(1))  # one over a chunk, ragged
    want, got = _grads(loop, ids), _grads(chunked, ids)
    assert set(want) == set(got) and len(got) == len(list(chunked.parameters()))
    for n in want:  # the stores compute in fp32 whatever the model dtype (float64 exactness: test_delta_reference)
        assert_close(got[n], want[n], 1e-4 * max(want[n].abs().max().item(), 1e-3), f"{pattern}: gradient of {n}")


@pytest.mark.parametrize("name", ["qwen3.8", "kimi-k3"])
def test_tiny_zoo_models_with_recurrent_layers_train_as_loaded(name):
    cfg = load_zoo(name, tiny=True)
    recurrent = [i for i, lay in enumerate(cfg.layers) if lay.token.RECURRENT]
    assert recurrent and all(cfg.layers[i].token.mode == "chunk" for i in recurrent)
    torch.manual_seed(0)
    model = Model(cfg)
    ids = torch.randint(0, cfg.vocab_size, (2, 70), generator=torch.Generator().manual_seed(2))
    grads = _grads(model, ids)
    for i in recurrent:
        store = model.blocks[i].token
        for n, p in store.named_parameters():
            g = grads.get(f"blocks.{i}.token.{n}")
            assert g is not None and torch.isfinite(g).all() and g.abs().max() > 0, f"{name} layer {i}: {n}"
