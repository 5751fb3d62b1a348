"""Every parameter a tiny zoo model's forward uses learns: one training step in the default modes.

The step is the training loop's (``storelab.train.loop``): the next-token cross-entropy plus what
the stores hand over under ``training_signals()`` (the indexers' imitation losses, the experts'
balancing losses), then the updates made outside the gradient (DeepSeek's routing bias).
Every parameter gets a finite, non-zero gradient except the ones listed, each with its reason,
and the list is computed from what the configs declare and checked to be exactly the parameters
without a gradient, so it cannot go stale:

* a layer that reads another layer's cache (``cache_owner``) leaves the parameters that only
  write a cache unused: its config's ``READER_UNUSED`` (no gradient at all);
* AttnRes's pseudo-queries start at zero (arXiv 2603.15031: every read starts as a uniform
  average over the sources), so the scores do not depend on the keys and the key norm's weight
  gets an exactly zero gradient until the queries have moved: after one optimiser step it does.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from storelab.models.model import Model
from storelab.ops.routing import bias_step
from storelab.stores.base import training_signals
from storelab.stores.depth import AttnResConfig
from storelab.train.loop import TrainConfig, auxiliary_losses, make_optimizer
from storelab.zoo import load_zoo, zoo_names

B, T = 2, 16
READS_ANOTHER_CACHE = "reads layer {owner}'s cache (cache_owner): only the owner writes it"
ZERO_QUERY = "AttnRes's pseudo-query starts at zero (uniform read), so the key norm's weight waits one step"


def expected_without_gradient(cfg, model: Model) -> dict[str, str]:
    """Parameters the forward leaves unused, from the configs' declarations, with the reason."""
    out = {}
    for i, lay in enumerate(cfg.layers):
        if lay.cache_owner in (None, i):  # the owner names itself
            continue
        for name, _ in model.blocks[i].token.named_parameters(prefix=f"blocks.{i}.token"):
            rel = name[len(f"blocks.{i}.token."):]
            if any(rel.startswith(p + ".") for p in lay.token.READER_UNUSED):
                out[name] = READS_ANOTHER_CACHE.format(owner=lay.cache_owner)
    return out


def expected_zero_at_init(cfg, model: Model) -> dict[str, str]:
    if not isinstance(cfg.layers[0].depth, AttnResConfig):
        return {}
    return {n: ZERO_QUERY for n, _ in model.named_parameters() if n.endswith("reader.norm_weight")}


def train_step(model: Model, ids_BT: torch.Tensor, opt=None) -> dict[str, torch.Tensor]:
    """One step of the loop's objective on next-token prediction; returns the auxiliary losses."""
    model.zero_grad(set_to_none=True)
    with training_signals() as sig:
        logits, _ = model(ids_BT)
    loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids_BT[:, 1:].reshape(-1))
    aux = auxiliary_losses(sig, TrainConfig())
    (loss + sum(aux.values())).backward()
    if opt is not None:
        opt.step()
        sig.apply_updates()
    return aux


@pytest.mark.parametrize("name", zoo_names())
def test_every_parameter_the_forward_uses_gets_a_gradient(name):
    cfg = load_zoo(name, tiny=True)
    torch.manual_seed(0)
    model = Model(cfg).train()
    ids = torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(1))
    aux = train_step(model, ids)
    assert all(torch.isfinite(v) and v > 0 for v in aux.values()), aux

    unused, zero = expected_without_gradient(cfg, model), expected_zero_at_init(cfg, model)
    params = dict(model.named_parameters())
    no_grad = {n for n, p in params.items() if p.grad is None}
    assert no_grad == set(unused), (f"without a gradient but not declared: {sorted(no_grad - set(unused))}; "
                                    f"declared unused but with one: {sorted(set(unused) - no_grad)}")
    bad = [n for n, p in params.items() if p.grad is not None and not torch.isfinite(p.grad).all()]
    assert not bad, f"non-finite gradients: {bad}"
    zeros = {n for n, p in params.items() if p.grad is not None and not p.grad.any()}
    assert zeros == set(zero), (f"zero gradients not explained: {sorted(zeros - set(zero))}; "
                                f"expected zero but not: {sorted(set(zero) - zeros)}")
    if zero:  # after one optimiser step the queries have moved and the key norms learn
        opt = make_optimizer(model, TrainConfig(lr=1e-2))
        train_step(model, ids, opt)
        train_step(model, ids)
        still = [n for n in zero if not params[n].grad.any()]
        assert not still, f"still a zero gradient after one step: {still}"


@pytest.mark.parametrize("name", zoo_names())
def test_the_families_balance_their_experts(name):
    """A router with the choice bias balances by DeepSeek's update (a buffer, moved after the step,
    against the load) plus its small sequence-wise loss; one without by the auxiliary loss."""
    cfg = load_zoo(name, tiny=True)
    torch.manual_seed(0)
    model = Model(cfg).train()
    moes = [b.channel for b in model.blocks if b.channel.cfg.KIND == "moe" and b.channel.cfg.routing == "learned"]
    if not moes:
        pytest.skip(f"{name} has no learned router")
    biased = [m for m in moes if m.cfg.router_bias]
    assert all("choice_bias" not in dict(m.named_parameters()) for m in biased)  # not a gradient parameter
    before = [m.choice_bias.clone() for m in biased]
    ids = torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(1))
    aux = train_step(model, ids, make_optimizer(model, TrainConfig()))
    assert aux["balance"] > 0
    for m, b0 in zip(biased, before):
        step, r = m.choice_bias - b0, m.cfg.bias_update_rate
        assert step.any(), "the bias did not move"
        assert bool((torch.isclose(step.abs(), torch.tensor(r)) | (step == 0)).all()), step
    assert torch.equal(bias_step(torch.tensor([3, 1, 2]), 0.5), torch.tensor([-0.5, 0.5, 0.0]))  # against the load
