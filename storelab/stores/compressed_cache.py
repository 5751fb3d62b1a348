"""The state of DeepSeek-V4's compressed attention (``csa``, ``hca``; ``storelab.stores.compressed``):
the cache an owner layer keeps, a reader layer's empty stand-in, and how entries are stored.

State per token (``CompressedCache``): ``1/stride`` pooled entries (plus as many index
keys for CSA) in the ``cache_format``, one entry per token for the last ``window``
tokens, and the compressor projections of at most ``pool - 1`` tokens (the open stride
block and the ``pool - stride`` tokens before it, which the next entry also pools):
at a 1M context about 250,000 entries for CSA (pool 8, stride 4) and 7,812 for HCA
(pool 128). Entry bytes: ``storelab.ops.quant.entry_bytes`` (584 B in V4-Pro's fp8).
Entries and index keys grow in buffers the state keeps (``append_rows``, one row per
``stride`` tokens, room reserved from the ``upcoming`` hint), so no call copies the cache.

The owner's ``read_window`` (the window rows its last call read: the old window, then the
call's own entries) lets a reader's early queries in a long chunk see entries the owner's
trimmed window no longer keeps; it is the tensor ``window_kv`` is a view of, so ``nbytes``
leaves it out, but it holds the last call's ``window + T`` rows until the next call (a
chunk-sized working buffer, like the call's output).

Cache formats (``cache_format``): None keeps entries in the compute dtype; "fp32"/"bf16"
cast them; "fp8"/"fp4" store integer codes with one power-of-two scale per
``quant_block`` no-rope channels and the rope channels in bf16. Entries are encoded on
write and decoded on read, in the very pass that writes them, so a full pass and a
chunked one read the same numbers. Compressor projections waiting in the tail are held
in fp32 for "fp32", bf16 for the other formats, the compute dtype for None. The store takes
its format once, at construction (``entry_format``): ``PlainEntries`` or ``CodedEntries``.

Shape legend: B batch, N pooled entries, r stored row width, S projection series, C head width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from storelab.ops.norm import RMSNorm
from storelab.ops.quant import decode_entries, encode_entries, fake_quantize_entries
from storelab.state import State, tensor_bytes

__all__ = ["CompressedCache", "SharedCompressedCache", "PlainEntries", "CodedEntries", "Pooler", "entry_format"]


@dataclass
class CompressedCache(State):
    """What a compressed-attention layer keeps. Rows are entries in the cache format."""

    pooled: Tensor | None = None          # [B, N, row]  pooled entries (key = value)
    index_keys: Tensor | None = None      # [B, N, irow] pooled index keys (CSA)
    window_kv: Tensor | None = None       # [B, min(seen, W), row] the last W tokens' own entries
    tail_kv: Tensor | None = None         # [B, n_tail, S, C] projections of tokens in open pools
    tail_z: Tensor | None = None          # [B, n_tail, S, C] their pooling scores
    tail_index_kv: Tensor | None = None   # [B, n_tail, S, IC] (CSA)
    tail_index_z: Tensor | None = None    # [B, n_tail, S, IC] (CSA)
    read_window: Tensor | None = None     # [B, n_win, row] the window rows the last call read (for readers)

    @property
    def entries(self) -> int:
        return 0 if self.pooled is None else self.pooled.shape[1]

    def nbytes(self) -> int:
        # read_window is the tensor window_kv is a view of: no bytes of its own
        return tensor_bytes(self.pooled, self.index_keys, self.window_kv, self.tail_kv, self.tail_z,
                            self.tail_index_kv, self.tail_index_z)

    def check_reader(self, state: State | None, T: int, *, window: int, indexed: bool) -> "CompressedCache":
        """This cache, after the owner's call, must hold a reader's call of ``T`` tokens in the reader's
        layout (its ``window``, index keys if it is ``indexed``); a ValueError naming ``shared`` if not."""
        before = self.seen - T
        if state is not None and state.seen != before:
            raise ValueError(f"shared: the owner has seen {self.seen} tokens, this reader {state.seen} + {T}: "
                             "the owner must run on the same tokens first")
        if self.read_window.shape[1] != min(before, window) + T:
            raise ValueError("shared: the owner's window differs from this reader's (cache_owner needs the same layout)")
        if indexed and self.index_keys is None:
            raise ValueError("shared: the owner keeps no index keys for this reader's indexer")
        return self


@dataclass
class SharedCompressedCache(State):
    """A reader layer's state: only its token count; it reads the owner's ``CompressedCache``."""

    @property
    def entries(self) -> int:
        return 0


# -- how entries are stored -----------------------------------------------------------------------
@dataclass(frozen=True)
class PlainEntries:
    """``cache_format=None``: entries kept as computed, read in place."""

    in_place = True

    def encode(self, x: Tensor, rope_dim: int) -> Tensor:
        return x

    def decode(self, rows: Tensor, width: int, rope_dim: int, dtype: torch.dtype) -> Tensor:
        return rows

    def tail_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return dtype


@dataclass(frozen=True)
class CodedEntries:
    """A cache format of ``storelab.ops.quant``: rows encoded on write and decoded on read; entries that
    need a gradient keep the training form (``fake_quantize_entries``: same values, straight through)."""

    fmt: str
    block: int
    tail: torch.dtype  # what the compressor tail is held in
    in_place = False

    def encode(self, x: Tensor, rope_dim: int) -> Tensor:
        if torch.is_grad_enabled() and x.requires_grad:  # training: float rows, straight-through gradient
            return fake_quantize_entries(x, rope_dim=rope_dim, fmt=self.fmt, block=self.block)
        return encode_entries(x, rope_dim=rope_dim, fmt=self.fmt, block=self.block)

    def decode(self, rows: Tensor, width: int, rope_dim: int, dtype: torch.dtype) -> Tensor:
        return decode_entries(rows, head_dim=width, rope_dim=rope_dim, fmt=self.fmt, block=self.block, dtype=dtype)

    def tail_dtype(self, dtype: torch.dtype) -> torch.dtype:
        return self.tail


def entry_format(fmt: str | None, block: int) -> PlainEntries | CodedEntries:
    """The entry format of a ``cache_format`` (None: plain) with ``quant_block`` channels per scale."""
    if fmt is None:
        return PlainEntries()
    return CodedEntries(fmt=fmt, block=block, tail=torch.float32 if fmt == "fp32" else torch.bfloat16)


class Pooler(nn.Module):
    """One compressor: S projections and scores per token, a bias per pool slot, RMSNorm."""

    def __init__(self, d_model: int, width: int, pool: int, stride: int, eps: float):
        super().__init__()
        self.series, self.width = pool // stride, width
        self.kv = nn.Linear(d_model, self.series * width, bias=False)
        self.score = nn.Linear(d_model, self.series * width, bias=False)
        self.bias = nn.Parameter(torch.zeros(pool, width))   # [P, C]: slot j = 0 is the oldest token
        self.norm = RMSNorm(width, eps)

    def project(self, x_BTD: Tensor) -> tuple[Tensor, Tensor]:
        B, T, _ = x_BTD.shape
        return (self.kv(x_BTD).view(B, T, self.series, self.width),
                self.score(x_BTD).view(B, T, self.series, self.width))
