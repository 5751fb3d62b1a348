"""Typed states: what a store keeps between calls.

Every store's ``forward(x, state=None) -> (y, state)`` returns one of these.
A model's cache is a list of them, one per layer slot. Each state knows

* ``nbytes()``  - the bytes its tensors occupy now (what the accounting predicts);
* ``entries``   - how many entries it holds (cache rows, matrix count, ...);
* ``seen``      - how many tokens have passed through it (the position offset).

Shape legend used across storelab: B batch, T tokens in this call, L tokens kept,
H heads, K key width, V value width, D model width.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import torch
from torch import Tensor


def tensor_bytes(*tensors: Tensor | None) -> int:
    """Bytes held by the given tensors (None counts zero)."""
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


@dataclass
class State:
    """Base of every state. Subclasses are dataclasses of tensors plus counters."""

    seen: int = 0

    def nbytes(self) -> int:
        return tensor_bytes(*(getattr(self, f.name) for f in fields(self) if isinstance(getattr(self, f.name), Tensor)))

    @property
    def entries(self) -> int:  # pragma: no cover - each subclass says
        raise NotImplementedError


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
        """Write this call's entries; return everything kept (old then new)."""
        if self.k is None:
            self.k, self.v = k_BTHK, v_BTHV
        else:
            self.k = torch.cat([self.k, k_BTHK], dim=1)
            self.v = torch.cat([self.v, v_BTHV], dim=1)
        return self.k, self.v


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
