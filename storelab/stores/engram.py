"""Engram: tables read at addresses fixed in advance, hashes of the last few tokens.

Conditional Memory via Scalable Lookup (Engram), arXiv 2601.07372; used in two layers
of DeepSeek-V4.1-Flash (arXiv 2609.19969). Essay section 2, "Experts and lookup tables".

Read, for the token x_t at the end of the n-gram (x_{t-n+1}, ..., x_t):

    for each order n in ``orders`` and hash head h < ``heads_per_order``:
        row_{n,h} = ((x_t m_{nh0}) XOR (x_{t-1} m_{nh1}) XOR ... XOR (x_{t-n+1} m_{nh,n-1})) mod P_{nh}
    e_t = concat_{n,h} table_{n,h}[row_{n,h}]                    # [S * head_dim], S lookups
    k_t = W_K e_t,  v_t = W_V e_t                                 # [D] each
    a_t = sigmoid(ssqrt(RMSNorm(h_t) . RMSNorm(k_t) / sqrt(D)))   # scalar gate in (0, 1)
    y_t = a_t v_t   (+ SiLU(conv(RMSNorm(a v)))_t when conv_kernel > 0)

Each head has its own odd multipliers m (below 2^63 / vocab_size, so the products do not
overflow) and its own prime table size P_{nh}: ``rows`` rounded up to a prime, the next
head taking the next prime, so no two heads share a size. ssqrt(g) = sign(g) sqrt(|g|)
is the signed square root of the released code (deepseek-ai/Engram ``engram_demo_v1.py``,
also transformers' qwen4_exp); the paper's formula omits it. The optional short
convolution (the paper's kernel 4, dilation max(orders)) is off by default. N-grams that
reach before the first token use ``pad_id`` there. Colliding n-grams share a row.

Not modelled: the tokenizer compression (canonical ids; apply it to token_ids before the
call), per-stream keys under mHC (one hidden stream here), and qwen4_exp's reset at EOS.

Update rule: none while reading; training writes the table rows and projections.
Parameters (S = len(orders) * heads_per_order lookups, E = S * head_dim):
  stored = sum_{n,h} P_{nh} * head_dim + 2 E D + 2 D [+ conv_kernel D + D]
  active = S * head_dim + 2 E D + 2 D [+ conv_kernel D + D]   (S rows read per token)
State: the last max(orders) - 1 token ids (int64), whatever the context length, plus,
with the convolution, its last (conv_kernel - 1) * max(orders) inputs of width D.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from storelab.ops.norm import RMSNorm
from storelab.ops.routing import next_prime, ngram_rows
from storelab.state import State
from storelab.stores.base import (LOOKUP, DTYPE_BYTES, STATE_DTYPES, Card, Footprint, MemoryTerms, ParamCount, StoreConfig,
                                  check_input, emit, register)

__all__ = ["EngramConfig", "Engram", "EngramState"]

ID_BYTES = 8  # token ids are kept as int64


@dataclass
class EngramState(State):
    """``ids`` [B, max(orders) - 1]: the tail of token ids; ``conv`` [B, (kernel-1) dilation, D] or None."""

    ids: Tensor | None = None
    conv: Tensor | None = None

    @property
    def entries(self) -> int:
        return 0 if self.ids is None else self.ids.shape[1]


@register("engram")
@dataclass(kw_only=True)
class EngramConfig(StoreConfig):
    d_model: int
    vocab_size: int
    orders: tuple[int, ...] = (2, 3)
    heads_per_order: int = 8
    rows: int = 1 << 16      # target rows per table; each table is a distinct prime >= rows
    head_dim: int = 32
    pad_id: int = 0
    seed: int = 0            # sets the hash multipliers; give each layer its own
    conv_kernel: int = 0     # 0: no short convolution; the paper uses 4
    norm_eps: float = 1e-6

    SLOTS, FAMILY, CARD_ORDER = (LOOKUP,), "lookup", 30
    CARD = Card(
        name="Engram",
        written_by="training, under keys fixed in advance: hashes of the last two to four tokens",
        holds="a learned value per table row; tokens whose hashes collide share a row",
        reading_costs="a fixed number of lookups per token, whatever the tables' size",
        forgets="only when later training overwrites it",
        source="arXiv 2601.07372 (Engram); 2609.19969 (DeepSeek-V4.1-Flash)",
    )

    def __post_init__(self) -> None:
        self.check_positive("d_model", "vocab_size", "heads_per_order", "rows", "head_dim")
        self.orders = tuple(self.orders)
        self.check(len(self.orders) > 0 and all(isinstance(n, int) and n >= 1 for n in self.orders), "orders",
                   f"must be a non-empty list of n-gram orders >= 1, got {self.orders!r}")
        self.check(len(set(self.orders)) == len(self.orders), "orders", f"repeats an order: {self.orders!r}")
        self.check(0 <= self.pad_id < self.vocab_size, "pad_id", f"must be in [0, vocab_size), got {self.pad_id!r}")
        self.check(self.conv_kernel >= 0, "conv_kernel", f"must be >= 0, got {self.conv_kernel!r}")

    # -- sizes ---------------------------------------------------------------
    @property
    def lookups(self) -> int:
        return len(self.orders) * self.heads_per_order

    @property
    def tail(self) -> int:
        return max(self.orders) - 1

    @property
    def conv_tail(self) -> int:
        return (self.conv_kernel - 1) * max(self.orders) if self.conv_kernel > 0 else 0

    def table_params(self) -> int:
        """The tables' rows x head width (DeepSeek counts them apart from the model's parameters)."""
        return sum(self.table_sizes()) * self.head_dim

    def table_sizes(self) -> list[int]:
        """Prime rows of each lookup's table, order-major: distinct primes >= rows."""
        sizes, p = [], self.rows
        for _ in range(self.lookups):
            p = next_prime(p)
            sizes.append(p)
            p += 1
        return sizes

    def _dense_params(self) -> int:
        D, E = self.d_model, self.lookups * self.head_dim
        n = 2 * E * D + 2 * D                       # key and value projections, two RMSNorm weights
        if self.conv_kernel:
            n += self.conv_kernel * D + D           # depthwise conv, its RMSNorm
        return n

    def num_params(self) -> ParamCount:
        return ParamCount(stored=sum(self.table_sizes()) * self.head_dim + self._dense_params(),
                          active=self.lookups * self.head_dim + self._dense_params())

    def footprint(self, context: int, *, dtype: str = "bf16") -> Footprint:
        D, E = self.d_model, self.lookups * self.head_dim
        conv_bytes = int(self.conv_tail * D * DTYPE_BYTES[dtype])
        flops = 2 * (2 * E * D + D + self.conv_kernel * D)   # projections, gate dot, conv
        return Footprint(context=context, kept=self.tail, read=self.lookups,
                         state_bytes=self.tail * ID_BYTES + conv_bytes, read_flops=flops,
                         note=f"tables are weights; kept = the last {self.tail} token ids")

    def memory_terms(self, *, cache: str = "bf16", state: str = "fp32") -> MemoryTerms:
        """Nothing grows with context: the last ``tail`` token ids, and the convolution's tail in ``state``."""
        self.check(state in STATE_DTYPES, "state dtype", f"unknown {state!r} (accepted: {', '.join(STATE_DTYPES)})")
        return MemoryTerms(per_sequence=self.tail * ID_BYTES + int(self.conv_tail * self.d_model * DTYPE_BYTES[state]))

    def build(self) -> "Engram":
        return Engram(self)


class Engram(nn.Module):
    def __init__(self, cfg: EngramConfig):
        super().__init__()
        self.cfg = cfg
        D, S, J = cfg.d_model, cfg.lookups, max(cfg.orders)
        sizes = cfg.table_sizes()
        offsets = [0]
        for p in sizes[:-1]:
            offsets.append(offsets[-1] + p)
        self.register_buffer("primes", torch.tensor(sizes, dtype=torch.long))
        self.register_buffer("offsets", torch.tensor(offsets, dtype=torch.long))
        self.register_buffer("multipliers", _multipliers(cfg, J))                      # [S, J]
        self.table = nn.Embedding(sum(sizes), cfg.head_dim)                               # all heads' rows
        E = S * cfg.head_dim
        self.key_proj = nn.Linear(E, D, bias=False)
        self.value_proj = nn.Linear(E, D, bias=False)
        self.norm_key = RMSNorm(D, eps=cfg.norm_eps)
        self.norm_query = RMSNorm(D, eps=cfg.norm_eps)
        if cfg.conv_kernel:
            self.norm_conv = RMSNorm(D, eps=cfg.norm_eps)
            self.conv_weight = nn.Parameter(torch.randn(D, cfg.conv_kernel) * cfg.conv_kernel ** -0.5)

    def rows(self, token_ids: Tensor, state: EngramState | None = None) -> Tensor:
        """[B, T, S] table rows the tokens read (offsets included), given the id tail in ``state``."""
        return self._rows(self._history(token_ids, state), token_ids.shape[1])

    def _history(self, token_ids: Tensor, state: EngramState | None) -> Tensor:
        """[B, max(orders) - 1 + T]: the kept tail (``pad_id`` before the first token), then the new ids."""
        if state is None or state.ids is None:
            tail = torch.full((token_ids.shape[0], self.cfg.tail), self.cfg.pad_id, dtype=torch.long,
                              device=token_ids.device)
        else:
            tail = state.ids
        return torch.cat([tail, token_ids.long()], dim=1)

    def _rows(self, history: Tensor, T: int) -> Tensor:
        return ngram_rows(history, self.multipliers, self.primes, self.offsets, T)

    def forward(self, x_BTD: Tensor, state: EngramState | None = None, *, token_ids: Tensor | None = None
                ) -> tuple[Tensor, EngramState]:
        cfg = self.cfg
        check_input(x_BTD, cfg.d_model)
        B, T, D = x_BTD.shape
        if token_ids is None or tuple(token_ids.shape) != (B, T):
            got = None if token_ids is None else list(token_ids.shape)
            raise ValueError(f"token_ids: Engram needs token ids of shape [B, T] = [{B}, {T}], got {got}")
        if T and (token_ids.min() < 0 or token_ids.max() >= cfg.vocab_size):
            raise ValueError(f"token_ids: must lie in [0, vocab_size={cfg.vocab_size})")

        history = self._history(token_ids, state)                                          # [B, J-1+T]
        rows_BTS = self._rows(history, T)
        e_BTE = self.table(rows_BTS).flatten(-2).to(x_BTD.dtype)                            # [B, T, S*head_dim]
        k_BTD = self.norm_key(self.key_proj(e_BTE))
        q_BTD = self.norm_query(x_BTD)
        g_BT = (k_BTD * q_BTD).sum(-1) / math.sqrt(D)
        g_BT = torch.sigmoid(g_BT.sign() * g_BT.abs().clamp_min(1e-6).sqrt())
        v_BTD = g_BT[..., None] * self.value_proj(e_BTE)
        emit(self, "gate", lambda: g_BT.detach())  # [B, T], for probes

        conv = None
        if cfg.conv_kernel:
            v_BTD, conv = self._short_conv(v_BTD, state)
        # copies: the kept tails must not hold this call's [B, T + tail] tensors alive
        new_ids = history[:, history.shape[1] - cfg.tail:].clone() if cfg.tail else history[:, :0].clone()
        seen = 0 if state is None else state.seen
        return v_BTD, EngramState(seen=seen + T, ids=new_ids, conv=conv)

    def _short_conv(self, v_BTD: Tensor, state: EngramState | None) -> tuple[Tensor, Tensor]:
        """v + SiLU(depthwise causal conv of RMSNorm(v)), dilation max(orders); carries its input tail."""
        cfg = self.cfg
        B, T, D = v_BTD.shape
        P, dil = cfg.conv_tail, max(cfg.orders)
        prev = state.conv if state is not None and state.conv is not None else v_BTD.new_zeros(B, P, D)
        u_BLD = torch.cat([prev, self.norm_conv(v_BTD)], dim=1)                         # [B, P+T, D]
        out = F.conv1d(u_BLD.transpose(1, 2), self.conv_weight[:, None, :], groups=D, dilation=dil)
        y_BTD = v_BTD + F.silu(out.transpose(1, 2))                                    # out has T steps
        return y_BTD, u_BLD[:, u_BLD.shape[1] - P:].clone()


def _multipliers(cfg: EngramConfig, J: int) -> Tensor:
    """[S, J] odd multipliers below 2^63 / vocab_size for each lookup; zero past its order."""
    bound = max(1, ((1 << 63) - 1) // cfg.vocab_size // 2)
    rng = random.Random(cfg.seed)
    out = torch.zeros(cfg.lookups, J, dtype=torch.long)
    s = 0
    for n in cfg.orders:
        for _ in range(cfg.heads_per_order):
            for j in range(n):
                out[s, j] = 2 * rng.randrange(bound) + 1
            s += 1
    return out
