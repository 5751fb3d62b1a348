"""Diagnostics are returned, not stashed: ``emit`` keeps a value only for the ``observe`` block
that asked, and a store keeps no tensor of its last call on itself."""

from __future__ import annotations

import pytest
import torch

from storelab.stores import emit, observe
from storelab.stores.moe import MoEConfig


def test_emit_outside_a_block_keeps_nothing_and_blocks_do_not_share():
    m, other = torch.nn.Identity(), torch.nn.Identity()
    calls = []
    emit(m, "x", lambda: calls.append(1))        # nobody observes: the value is not even computed
    assert calls == []
    with observe() as a:
        emit(m, "x", 1)
    with observe(m) as b:
        emit(m, "x", 2), emit(other, "x", 3)
        with observe(other) as c:                  # nested blocks each get what they asked for
            emit(other, "x", 4)
    assert a.all(m, "x") == [1] and b.all(m, "x") == [2] and b.all(other, "x") == []
    assert c.all(other, "x") == [4] and c.last(other, "x") == 4
    with pytest.raises(ValueError, match="Identity emitted no 'y'"):
        b.last(m, "y")


def test_a_store_keeps_no_tensor_of_its_last_call():
    cfg = MoEConfig(d_model=16, n_experts=4, top_k=2, d_expert=8)
    m = cfg.build()
    before = {k for k, v in vars(m).items() if isinstance(v, torch.Tensor)}
    with observe(m) as seen:
        m(torch.randn(2, 5, 16))
    assert {k for k, v in vars(m).items() if isinstance(v, torch.Tensor)} == before
    assert int(seen.last(m, "load").sum()) == 2 * 5 * 2


def test_training_signals_are_kept_only_inside_a_block_and_ignored_losses_not_computed():
    from storelab.stores.base import add_loss, add_update, collecting, training_signals

    m = torch.nn.Identity()
    calls = []
    add_loss(m, "indexer", lambda: calls.append(1))   # no training block: not computed
    add_update(m, lambda reduce: calls.append(2))
    assert calls == [] and not collecting()
    with training_signals(ignore=("indexer",)) as sig:
        assert collecting()
        add_loss(m, "indexer", lambda: calls.append(3))
        add_loss(m, "balance", torch.tensor(2.0)), add_loss(m, "balance", lambda: torch.tensor(4.0))
        add_update(m, lambda reduce: calls.append(float(reduce(torch.tensor(5.0)))))
    assert calls == [] and sig.mean("indexer") is None and float(sig.mean("balance")) == 3.0
    sig.apply_updates(reduce=lambda t: 2 * t)           # after the optimiser step, summed over processes
    assert calls == [10.0]
