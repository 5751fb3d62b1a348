"""Typed states: what a store keeps between calls.

Every store's ``forward(x, state=None) -> (y, state)`` returns one of these.
A model's cache is a list of them, one per layer slot. Each state knows

* ``nbytes()``  - the bytes its tensors occupy now (what the accounting predicts);
* ``entries``   - how many entries it holds (cache rows, matrix count, ...);
* ``seen``      - how many tokens have passed through it (the position offset);
* ``clone()``   - an independent copy (callers who need the state before a call keep one,
                  since ``forward`` may update the state it is given in place).

Most states are a layer's own. A few reference what layers share (``LINKS``): a selection
group's per-call share (dsa, hierarchical), or the owner's state that a reader's view reads
(``cache_owner``). ``clone()`` keeps those references, and three methods, no-ops for a state
of its own, let the model keep them right without knowing the store:

* ``before_call(tokens)`` - the model is about to run the layer on ``tokens`` tokens (a view
                            takes its position from the owner, which has already written them);
* ``narrow(start)``       - the layers after this one see only the call's tokens from ``start`` on
                            (the first decoder layer of an encoder-decoder): per-call data it
                            publishes for them (a selection) is narrowed to those;
* ``relink(linked)``      - take the references of ``linked``, the same layer's state freshly
                            made and linked for this cache (``Model.relink``, after surgery on copies).

Shape legend used across storelab: B batch, T tokens in this call, L tokens kept,
H heads, K key width, V value width, D model width.
"""

from __future__ import annotations

import contextvars
import copy
import math
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import ClassVar

import torch
from torch import Tensor


def tensor_bytes(*tensors: Tensor | None) -> int:
    """Bytes held by the given tensors (None counts zero)."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


# -- growing caches without a copy per call -------------------------------------------------------
#
# A cache that keeps an entry per token (or per m tokens) appends rows along dim 1. Growing it with
# torch.cat copies the whole cache on every call and holds two copies for a moment; over a long
# prefill that is quadratic work and twice the memory. Instead the rows live in a preallocated
# buffer and the state's field is a view of its filled rows (so ``nbytes()`` still counts exactly
# what is kept). The capacity comes from a hint: ``upcoming(n)`` says that n more tokens will
# follow this call (``prefill`` and ``generate`` know), and a buffer that must grow reserves room
# for them; without a hint it grows by GROWTH, amortising the copies.

GROWTH = 1.25
_UPCOMING: contextvars.ContextVar[int] = contextvars.ContextVar("storelab_upcoming_tokens", default=0)


@contextmanager
def upcoming(tokens: int):
    """Within the block, caches that grow reserve room for ``tokens`` more tokens after this call."""
    tok = _UPCOMING.set(max(0, int(tokens)))
    try:
        yield
    finally:
        _UPCOMING.reset(tok)


def upcoming_tokens() -> int:
    """The tokens the enclosing ``upcoming`` block says will follow this call (0 outside one)."""
    return _UPCOMING.get()


def append_rows(state: "State", names: tuple[str, ...], new: tuple[Tensor, ...], *,
                tokens_per_row: int = 1) -> tuple[Tensor, ...]:
    """Append ``new[i]`` (rows along dim 1) to the field ``names[i]`` of ``state``; return the filled views.

    The fields of one call share one buffer, side by side on the last axis, so a reader can take
    them together (``joined_rows``) without a copy. ``tokens_per_row``: a compressed cache keeps
    one row per that many tokens, which sizes the reservation.
    """
    views = [getattr(state, n) for n in names]
    if torch.is_grad_enabled() and any(t.requires_grad for t in new):
        # training: a buffer written in place would break autograd's saved tensors; concatenate
        out = tuple(t if v is None else torch.cat([v, t], dim=1) for v, t in zip(views, new))
        for n, t in zip(names, out):
            setattr(state, n, t)
        state.__dict__.get("_rows", {}).pop(names, None)
        return out
    for n, v, t in zip(names, views, new):
        if v is not None and (v.shape[:1] + v.shape[2:] != t.shape[:1] + t.shape[2:] or v.dtype != t.dtype):
            raise ValueError(f"state.{n}: holds rows of shape {list(v.shape[:1] + v.shape[2:])} ({v.dtype}), "
                             f"got {list(t.shape[:1] + t.shape[2:])} ({t.dtype}) to append (batch and widths must match)")
    n_new = new[0].shape[1]
    rec = state.__dict__.get("_rows", {}).get(names)
    n_old = 0 if views[0] is None else views[0].shape[1]
    widths = [t.shape[-1] for t in new]
    fits = (rec is not None and views[0] is not None and rec["filled"] == n_old
            and views[0].data_ptr() == rec["buf"].data_ptr() and rec["buf"].shape[1] >= n_old + n_new
            and rec["buf"].dtype == new[0].dtype and rec["buf"].shape[:1] + rec["buf"].shape[2:-1]
            == new[0].shape[:1] + new[0].shape[2:-1] and rec["widths"] == widths)
    if not fits:
        need = n_old + n_new
        cap = need + math.ceil(_UPCOMING.get() / tokens_per_row)
        if cap == need and rec is not None:
            cap = max(need, math.ceil(rec["buf"].shape[1] * GROWTH))
        shape = list(new[0].shape)
        shape[1], shape[-1] = cap, sum(widths)
        buf = new[0].new_empty(shape)
        if n_old:
            off = 0
            for v, w in zip(views, widths):
                buf[:, :n_old, ..., off:off + w].copy_(v)
                off += w
        rec = {"buf": buf, "filled": n_old, "widths": widths}
        state.__dict__.setdefault("_rows", {})[names] = rec
    buf, end = rec["buf"], n_old + n_new
    out, off = [], 0
    for n, t, w in zip(names, new, widths):
        buf[:, n_old:end, ..., off:off + w].copy_(t)
        view = buf[:, :end, ..., off:off + w]
        setattr(state, n, view)
        out.append(view)
        off += w
    rec["filled"] = end
    return tuple(out)


def joined_rows(state: "State", names: tuple[str, ...]) -> Tensor | None:
    """The fields ``names`` side by side, [B, L, ..., sum of widths], as a view when they share a
    buffer (they do after ``append_rows(state, names, ...)``), else concatenated."""
    views = [getattr(state, n) for n in names]
    if views[0] is None:
        return None
    rec = state.__dict__.get("_rows", {}).get(names)
    L = views[0].shape[1]
    if rec is not None and rec["filled"] == L and views[0].data_ptr() == rec["buf"].data_ptr():
        return rec["buf"][:, :L]
    return torch.cat(views, dim=-1)


def reserved_bytes(state: "State") -> int:
    """Bytes of the buffers behind the state's row fields (capacity, filled or not)."""
    return sum(r["buf"].numel() * r["buf"].element_size() for r in state.__dict__.get("_rows", {}).values())


def _tensors(obj, path: str, seen: set[int]):
    """(path, tensor) for every tensor reachable from ``obj`` through fields, lists, tuples and dicts."""
    if isinstance(obj, Tensor):
        yield path, obj
        return
    if obj is None or isinstance(obj, (int, float, str, bool)) or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, (list, tuple)):
        for i, x in enumerate(obj):
            yield from _tensors(x, f"{path}[{i}]", seen)
    elif isinstance(obj, dict):
        for k, x in obj.items():
            yield from _tensors(x, f"{path}.{k}", seen)
    elif hasattr(obj, "__dict__"):
        for k, x in vars(obj).items():
            yield from _tensors(x, f"{path}.{k}", seen)


def held_bytes(obj) -> int:
    """Bytes of the distinct tensor storages a state (or a list of them, a cache) keeps alive:
    what it really holds, including buffer room not yet filled and any storage a view pins."""
    storages = {}
    for _, t in _tensors(obj, "", set()):
        s = t.untyped_storage()
        storages[s.data_ptr()] = s.nbytes()
    return sum(storages.values())


def loose_views(obj) -> list[str]:
    """Tensors of a state that pin a larger storage no tensor of the state owns whole: a small
    piece (a tail, the last rows) sliced from a call's big activation and kept as a view, which
    keeps the whole activation alive. A row buffer (``append_rows``) owns its storage, so the
    views of its filled rows are fine. Empty when the state holds nothing it does not count."""
    by_storage: dict[int, list[tuple[str, Tensor]]] = {}
    for path, t in _tensors(obj, "state", set()):
        by_storage.setdefault(t.untyped_storage().data_ptr(), []).append((path, t))
    loose = []
    for ts in by_storage.values():
        size = ts[0][1].untyped_storage().nbytes()
        if size and all(t.numel() * t.element_size() < size for _, t in ts):
            loose += [f"{p} {list(t.shape)} pins {size} bytes" for p, t in ts]
    return loose


class StateKindError(ValueError, AttributeError):
    """A store was handed the state of another store's kind (a ValueError for callers, and still
    an AttributeError for ``getattr(state, name, default)``)."""


@dataclass
class State:
    """Base of every state. Subclasses are dataclasses of tensors plus counters.

    A store reads the fields of its own state; one that is handed a state of another kind finds a
    field missing, and the error says so (``StateKindError``) instead of a bare AttributeError."""

    seen: int = 0

    def __getattr__(self, name: str):  # only reached when the field is not there
        if name.startswith("_"):
            raise AttributeError(name)
        raise StateKindError(f"state: a {type(self).__name__} has no field {name!r}: the store was given the state "
                             "of another store's kind (give each store the state its own forward returned)")

    # fields that reference what this state shares with other layers' states (a selection group's
    # share, the owner of a cache read through a view): kept by ``clone``, replaced by ``relink``
    LINKS: ClassVar[tuple[str, ...]] = ()

    def nbytes(self) -> int:
        return tensor_bytes(*(getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), Tensor)))

    @property
    def entries(self) -> int:  # pragma: no cover - each subclass says
        raise NotImplementedError

    def clone(self) -> "State":
        """A copy that shares no tensor with this state: every tensor and counter copied (the views
        of a row buffer stay views of the copied buffer, so the copy grows in place as well); the
        ``LINKS`` are the same objects, not copies (a clone is in its group, and reads its owner,
        until ``relink`` says otherwise)."""
        memo = {id(v): v for v in (getattr(self, n) for n in self.LINKS) if v is not None}
        for _, t in _tensors(self, "", set(memo)):
            if t.grad_fn is not None:  # deepcopy refuses tensors inside a graph; copy those within it
                memo[id(t)] = t.clone()
        return copy.deepcopy(self, memo)

    def before_call(self, tokens: int) -> None:
        """The model is about to run this layer's store on ``tokens`` tokens (a no-op for a state of its own)."""

    def narrow(self, start: int) -> None:
        """The layers after this one see only this call's tokens from ``start`` on (a no-op by default)."""

    def relink(self, linked: "State") -> None:
        """Take the ``LINKS`` of ``linked``: the same layer's state, made and linked afresh for this cache."""
        for n in self.LINKS:
            setattr(self, n, getattr(linked, n))


@dataclass
class EmptyState(State):
    """The explicit state of a stateless slot (a feed-forward layer, the plain residual)."""

    @property
    def entries(self) -> int:
        return 0


@dataclass
class KVCache(State):
    """Full history: every token's key and value, ``k_BLHK`` and ``v_BLHV``."""

    k: Tensor | None = None
    v: Tensor | None = None

    @property
    def entries(self) -> int:
        return 0 if self.k is None else self.k.shape[1]

    def append(self, k_BTHK: Tensor, v_BTHV: Tensor) -> tuple[Tensor, Tensor]:
        """Write this call's entries; return everything kept (old then new), views of the cache.

        Keys and values share one buffer per row, the wider one last: [v | k] when K >= V,
        [k | v] otherwise, so ``same_width`` can hand both out at the wider width without a copy.
        """
        if k_BTHK.shape[-1] >= v_BTHV.shape[-1]:
            append_rows(self, ("v", "k"), (v_BTHV, k_BTHK))
        else:
            append_rows(self, ("k", "v"), (k_BTHK, v_BTHV))
        return self.k, self.v

    def claim_one(self, G: int, K: int, V: int, dtype: torch.dtype) -> tuple[Tensor, int, int, int] | None:
        """For the decode step (one token, one sequence, no autograd): where the row buffer has room for one more
        row of G heads of K key and V value channels in ``dtype``, the views ``k`` and ``v`` are extended over row n
        (the old length) and (buffer, n, key offset, value offset) is returned: the caller writes the token's key and
        value into row n (channels from the offsets) before anything reads it. None where ``append`` must run."""
        names = ("v", "k") if K >= V else ("k", "v")
        rec = self.__dict__.get("_rows", {}).get(names)
        view = getattr(self, names[0])
        if rec is None or view is None or torch.is_grad_enabled():
            return None
        buf, n = rec["buf"], rec["filled"]
        widths = [V, K] if K >= V else [K, V]
        if (buf.dim() != 4 or n != view.shape[1] or n >= buf.shape[1] or buf.shape[0] != 1 or buf.shape[2] != G
                or rec["widths"] != widths or buf.dtype != dtype or view.data_ptr() != buf.data_ptr()):
            return None
        rec["filled"] = n + 1
        size, stride = (1, n + 1, G), buf.stride()
        k_off, v_off = (V, 0) if K >= V else (0, K)
        self.k = buf.as_strided(size + (K,), stride, buf.storage_offset() + k_off)
        self.v = buf.as_strided(size + (V,), stride, buf.storage_offset() + v_off)
        return buf, n, k_off, v_off

    def same_width(self) -> tuple[Tensor, Tensor]:
        """Keys and values as views of one width W = max(K, V) (what a fused kernel wants).

        The narrower one runs on into its neighbour's columns: with K >= V the values view is
        [v | the first K - V key channels] (the output's extra columns are dropped), with V > K
        the keys view is [k | the first V - K value channels] (the query is zero-padded, so they
        score nothing). Without a shared buffer (a cache built by hand) the narrower is padded.
        """
        K, V = self.k.shape[-1], self.v.shape[-1]
        if K == V:  # already one width: as they are (no joined view needed, no padded copies)
            return self.k, self.v
        names = ("v", "k") if K >= V else ("k", "v")
        rec = self.__dict__.get("_rows", {}).get(names)
        j = None if rec is None else joined_rows(self, names)  # (no buffer, as in training: no cat to throw away)
        if j is None or j.data_ptr() != rec["buf"].data_ptr():
            W = max(K, V)
            pad = lambda t: torch.nn.functional.pad(t, (0, W - t.shape[-1]))  # noqa: E731
            return pad(self.k), pad(self.v)
        if K >= V:
            return j[..., V:V + K], j[..., :K]
        return j[..., :V], j[..., K:K + V]


@dataclass
class WindowCache(State):
    """A rolling window: exactly the last ``window`` entries, whatever the context length.

    Stored as a ring buffer of fixed capacity; ``ordered()`` returns them oldest first.
    """

    window: int = 0
    k: Tensor | None = None  # [B, W, H, K] ring buffer
    v: Tensor | None = None  # [B, W, H, V]
    filled: int = 0          # valid slots (<= window)
    head: int = 0            # next slot to write

    @property
    def entries(self) -> int:
        return self.filled

    def nbytes(self) -> int:
        # The ring buffer is allocated at full capacity only once it fills;
        # report the bytes of the valid slots, which is what the store keeps.
        if self.k is None:
            return 0
        per_slot = (self.k[:, :1].numel() * self.k.element_size() + self.v[:, :1].numel() * self.v.element_size())
        return per_slot * self.filled

    def ordered(self) -> tuple[Tensor | None, Tensor | None]:
        if self.k is None or self.filled == 0:
            return None, None
        if self.filled < self.window:
            return self.k[:, : self.filled], self.v[:, : self.filled]
        idx = (torch.arange(self.window, device=self.k.device) + self.head) % self.window
        return self.k[:, idx], self.v[:, idx]

    def write(self, k_BTHK: Tensor, v_BTHV: Tensor) -> None:
        """Write this call's entries, keeping only the last ``window`` of old + new."""
        T = k_BTHK.shape[1]
        W = self.window
        if self.k is None:
            B, _, H, K = k_BTHK.shape
            self.k = k_BTHK.new_zeros(B, W, H, K)
            self.v = v_BTHV.new_zeros(B, W, v_BTHV.shape[2], v_BTHV.shape[3])
        if T >= W:
            self.k.copy_(k_BTHK[:, T - W:])
            self.v.copy_(v_BTHV[:, T - W:])
            self.head, self.filled = 0, W
            return
        if T == 1 and not torch.is_grad_enabled():   # a decode step: the slot at the head, no index tensor
            self.k[:, self.head] = k_BTHK[:, 0]
            self.v[:, self.head] = v_BTHV[:, 0]
            self.head = (self.head + 1) % W
            self.filled = min(W, self.filled + 1)
            return
        pos = (torch.arange(T, device=self.k.device) + self.head) % W
        self.k[:, pos] = k_BTHK
        self.v[:, pos] = v_BTHV
        self.head = (self.head + T) % W
        self.filled = min(W, self.filled + T)


@dataclass
class RecurrentState(State):
    """A fixed-size matrix per head, ``S_BHKV``, plus the short-convolution tail.

    ``conv`` holds the last (kernel - 1) pre-convolution inputs, ``[B, kernel-1, C]``,
    so a chunk boundary does not change the convolution's output.
    """

    S: Tensor | None = None
    conv: Tensor | None = None

    @property
    def entries(self) -> int:
        # one matrix per head
        return 0 if self.S is None else self.S.shape[1]
