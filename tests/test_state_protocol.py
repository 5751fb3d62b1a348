"""The state rule and the sharing protocol on the zoo's tiny models: every state's ``clone()``
is equal and independent; ``Model.relink`` links a cache of copies (selection groups, views of
an owner's cache) so that it runs alone; the selection stores keep no diagnostics on themselves."""

from __future__ import annotations

import copy
from dataclasses import fields

import pytest
import torch
from torch import Tensor

from storelab.models.model import Model, prefill
from storelab.probes.common import copy_cache, mix_states
from storelab.state import KVCache, RecurrentState, State, WindowCache
from storelab.stores import REGISTRY
from storelab.stores.base import observe
from storelab.stores.dsa import SelectionCache, SelectionView
from storelab.stores.mla import LatentCache
from storelab.zoo import load_zoo, zoo_names, zoo_path


def tiny(name: str) -> Model:
    from storelab.models.config import read_file

    missing = sorted({s["kind"] for s in read_file(zoo_path(name, True))["stores"].values()} - set(REGISTRY))
    if missing:
        pytest.skip(f"{name}: store kinds not written yet: {missing}")
    torch.manual_seed(0)
    return Model(load_zoo(name, tiny=True)).eval()


def run(model: Model, T: int, seed: int = 0, cache=None):
    ids = torch.randint(0, model.cfg.vocab_size, (1, T), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return prefill(model, ids, chunk=max(1, T // 2), cache=cache)


def own_tensors(st: State) -> dict[str, Tensor]:
    """The state's tensor fields, by name, outside its LINKS."""
    return {k: v for k, v in vars(st).items() if k not in st.LINKS and isinstance(v, Tensor)}


def storages(st: State) -> set[int]:
    """The storages of its tensor fields and of the row buffers behind them (their unfilled rows too)."""
    bufs = [rec["buf"] for rec in vars(st).get("_rows", {}).values()]
    return {t.untyped_storage().data_ptr() for t in [*own_tensors(st).values(), *bufs]}


def counters(st: State) -> dict:
    return {f.name: getattr(st, f.name) for f in fields(st)
            if f.name not in st.LINKS and not isinstance(getattr(st, f.name), (Tensor, type(None)))}


def states_of(cache):
    for i, ls in enumerate(cache):
        for slot in ("token", "channel", "lookup"):
            st = getattr(ls, slot)
            if st is not None:
                yield f"layer {i} {slot} {type(st).__name__}", st


@pytest.mark.parametrize("name", zoo_names())
def test_every_state_of_the_tiny_zoo_clones_equal_and_independent(name):
    model = tiny(name)
    _, cache = run(model, 11)
    seen_types = set()
    for where, st in states_of(cache):
        seen_types.add(type(st))
        before = {k: t.clone() for k, t in own_tensors(st).items()}
        c = st.clone()
        assert type(c) is type(st), where
        for n in st.LINKS:  # what the state shares with other layers: the same objects
            assert getattr(c, n) is getattr(st, n), f"{where}: {n}"
        assert counters(c) == counters(st), where
        mine, theirs = own_tensors(st), own_tensors(c)
        assert mine.keys() == theirs.keys(), where
        for k in mine:
            assert torch.equal(theirs[k], mine[k]) and theirs[k].dtype == mine[k].dtype, f"{where}: {k}"
        assert storages(c).isdisjoint(storages(st)), f"{where}: the clone shares a storage with the original"
        assert c.nbytes() == st.nbytes() and c.entries == st.entries, where
        # mutate the clone: the original keeps every tensor and counter
        for t in theirs.values():
            t.logical_not_() if t.dtype == torch.bool else t.add_(1)
        c.seen += 7
        for k, t in own_tensors(st).items():
            assert torch.equal(t, before[k]), f"{where}: {k} changed with its clone"
        assert st.seen == c.seen - 7, where
    assert seen_types


def test_the_zoo_covers_the_states_of_the_sharing_protocol():
    """The clone test above meets each kind of state this protocol is about, on some tiny model."""
    seen = set()
    for name in zoo_names():
        try:
            model = tiny(name)
        except pytest.skip.Exception:
            continue
        seen |= {type(st) for _, st in states_of(run(model, 6)[1])}
    assert {KVCache, WindowCache, RecurrentState, LatentCache, SelectionCache, SelectionView} <= seen


def snapshot(cache) -> list:
    return [(where, {k: t.clone() for k, t in own_tensors(st).items()}, counters(st)) for where, st in states_of(cache)]


def assert_unchanged(cache, snap) -> None:
    now = list(states_of(cache))
    assert [w for w, _ in now] == [w for w, _, _ in snap]
    for (where, st), (_, tensors, ctr) in zip(now, snap):
        assert counters(st) == ctr, where
        got = own_tensors(st)
        for k, t in tensors.items():
            assert torch.equal(got[k], t), f"{where}: {k}"


def links_within(model: Model, cache) -> dict[int, set[int]]:
    """Each view reads its owner's state in this very cache; returns the layers of each share."""
    groups: dict[int, set[int]] = {}
    for i, (lay, ls) in enumerate(zip(model.cfg.layers, cache)):
        st = ls.token
        if st is None:
            continue
        if "owner" in st.LINKS:
            assert st.owner is cache[lay.cache_owner].token, f"layer {i}"
        if "share" in st.LINKS:
            groups.setdefault(id(st.share), set()).add(i)
    return groups


@pytest.mark.parametrize("name", ["glm-5.3", "deepseek-v4.1-flash", "kimi-k3", "kimi-k3.1-pro"])
def test_a_relinked_copy_runs_alone_and_leaves_the_original(name):
    model = tiny(name)
    _, cache = run(model, 13)
    snap = snapshot(cache)
    ref = copy.deepcopy(cache)               # one deep copy keeps every link inside it
    mine = copy_cache(model, cache)          # clone() each, then Model.relink
    groups = links_within(model, mine)
    assert [sorted(g) for g in groups.values()] == [sorted(g) for g in links_within(model, ref).values()]
    assert groups.keys().isdisjoint(links_within(model, cache))   # fresh shares, not the original's
    ids = torch.randint(0, model.cfg.vocab_size, (1, 3), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        want, ref = model(ids, ref)
        got, mine = model(ids, mine)
    assert torch.equal(got, want)
    assert_unchanged(cache, snap)
    for (w, a), (_, b) in zip(states_of(mine), states_of(ref)):
        for k, t in own_tensors(b).items():
            assert torch.equal(own_tensors(a)[k], t), f"{w}: {k}"


def test_swapping_an_owner_relinks_its_readers():
    """DeepSeek-V4.1-Flash: decoder layers 9.. read layer 8's cache; swap layer 8 for another prompt's."""
    model = tiny("deepseek-v4.1-flash")
    E = model.cfg.encoder_layers
    _, ca = run(model, 12, seed=1)
    _, cb = run(model, 12, seed=2)
    mixed = mix_states(model, ca, cb, [E])
    links_within(model, mixed)
    assert mixed[E].token is not cb[E].token and torch.equal(mixed[E].token.latent, cb[E].token.latent)
    assert all(mixed[i].token.owner is mixed[E].token for i in range(E + 1, model.cfg.n_layers))
    assert all(ca[i].token.owner is ca[E].token for i in range(E + 1, model.cfg.n_layers))   # untouched


def test_selection_stores_emit_and_keep_nothing_on_themselves():
    model = tiny("glm-5.3")
    stores = [b.token for b in model.blocks]
    ids = torch.randint(0, model.cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad(), observe(*stores) as seen:
        model(ids)
    for m in stores:
        assert seen.last(m, "selection").shape[:2] == (2, 9)
        assert torch.equal(seen.last(m, "reads").read, (torch.arange(9) + 1).clamp(max=m.selector.k).expand(2, 9))
        assert not [k for k, v in vars(m).items() if isinstance(v, Tensor)]
    with torch.no_grad(), observe() as later:
        pass
    with pytest.raises(ValueError, match="selection"):
        later.last(stores[0], "selection")
