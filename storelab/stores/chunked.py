"""Chunked attention (``chunked``): softmax attention within fixed chunks of the sequence, as in Llama 4.

Llama 4 (Meta, 2025; transformers' ``Llama4TextAttention`` with ``attention_chunk_size``) cuts the
sequence into chunks of ``chunk`` tokens (8,192 there) on its RoPE layers: the query at position p
reads the keys at positions j <= p with j // chunk == p // chunk, its own chunk up to itself, and
nothing before the chunk began. Every fourth layer is global attention without positions (NoPE,
the ``attention`` kind with ``partial_rotary = 0`` and ``attn_temperature_tuning``); the two
together are Llama 4's "iRoPE".

Update rule:  cache <- cache ++ [(k_t, v_t)];  y_t = softmax(q_t K^T * scale) V over the cache;
              when t + 1 is a multiple of ``chunk``, cache <- empty.

Unlike a sliding window, the view does not slide: it grows from 1 entry at a chunk's first token to
``chunk`` at its last, then starts again. Between calls the store keeps exactly the entries of the
chunk in progress: after L tokens, L mod chunk entries (none when a chunk has just closed), at most
chunk - 1. So memory and reading cost are bounded by the chunk at any context, and chunked prefill
then token-by-token decode equals one pass. The next token reads the L mod chunk kept entries and
itself (``footprint``'s ``read`` counts the kept ones, as ``window``'s does).

A call is cut at the chunk boundaries it crosses; each piece is one causal read of the chunk's
kept entries followed by the piece's own, through the config's ``kernel`` (``storelab.ops.attention``).
Everything else is ``AttentionConfig``'s: grouped-query heads, RoPE (Llama 4: ``rope_interleaved``,
with ``qk_l2_norm`` after it), output gate, sinks, LogN, temperature tuning; positions are absolute.

Parameters: those of ``attention`` with the same fields. State: at most (chunk - 1) G (K + V) numbers.

Module parameters and transformers' names (``Llama4TextAttention`` at ``model.layers.i.self_attn``):

  q_proj.weight [H K, D]   self_attn.q_proj.weight     (and .bias with ``qkv_bias``: attention_bias)
  k_proj.weight [G K, D]   self_attn.k_proj.weight
  v_proj.weight [G V, D]   self_attn.v_proj.weight
  o_proj.weight [D, H V]   self_attn.o_proj.weight     (and .bias with ``out_bias``: attention_bias)

Llama 4's fields: attention_chunk_size -> chunk; use_qk_norm on a RoPE layer -> qk_l2_norm (eps
rms_norm_eps -> norm_eps); its RoPE is rope_interleaved = True with rope_theta; a NoPE layer
(no_rope_layers[i] == 0) is ``attention`` with partial_rotary = 0 and attn_temperature_tuning,
floor_scale, attn_scale -> attn_temperature_scale.

Shape legend: B batch, T new tokens, L entries read, H query heads, G key/value heads,
K key width, V value width, D model width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from storelab.state import State
from storelab.stores.attention import Attention, AttentionConfig
from storelab.stores.base import DTYPE_BYTES, Card, MemoryTerms, check_input, register

__all__ = ["ChunkedConfig", "ChunkedAttention", "ChunkCache"]


@dataclass
class ChunkCache(State):
    """The entries of the chunk in progress, oldest first: ``k`` [B, n, G, K], ``v`` [B, n, G, V],
    n = seen mod chunk (None when a chunk has just closed)."""

    k: Tensor | None = None
    v: Tensor | None = None

    @property
    def entries(self) -> int:
        return 0 if self.k is None else self.k.shape[1]


@register("chunked")
@dataclass(kw_only=True)
class ChunkedConfig(AttentionConfig):
    chunk: int                           # tokens per chunk (Llama 4's attention_chunk_size: 8192)

    FAMILY, CARD_ORDER, MIX_LABEL = "window", 65, ""
    CARD = Card(
        name="Chunked attention",
        written_by="each token of its chunk",
        holds="the entries of the chunk in progress (at most chunk - 1 between calls; 8,192 tokens in Llama 4)",
        reading_costs="the chunk's entries so far: 1 to chunk",
        forgets="the whole chunk, at once, when it ends",
        source="Llama 4 (Meta, 2025; transformers' Llama4TextAttention), arXiv 1706.03762 (attention), "
               "2501.19399 (temperature tuning)",
    )

    def __post_init__(self):
        super().__post_init__()
        self.check(isinstance(self.chunk, int) and self.chunk > 0, "chunk", f"must be an int > 0, got {self.chunk!r}")

    def build(self) -> nn.Module:
        return ChunkedAttention(self)

    def cache_chunk(self) -> int:
        return self.chunk

    def _kept_read(self, context: int) -> tuple[int, int]:
        n = context % self.chunk  # the chunk in progress; a closed chunk is dropped
        return n, n

    def memory_terms(self, *, cache: str = "bf16", state: str = "fp32") -> MemoryTerms:
        """Nothing grows with context: at most chunk - 1 entries between calls, in ``cache``."""
        return MemoryTerms(per_sequence=(self.chunk - 1) * self.cache_entry_bytes(cache))


class ChunkedAttention(Attention):
    """Causal GQA softmax attention within chunks of ``cfg.chunk`` tokens (see the module docstring)."""

    def forward(self, x_BTD: Tensor, state: ChunkCache | None = None, *, token_ids: Tensor | None = None):
        check_input(x_BTD, self.cfg.d_model)
        C, T = self.cfg.chunk, x_BTD.shape[1]
        state = ChunkCache() if state is None else state
        q_BTHK, k_BTGK, v_BTGV, gate = self.project(x_BTD, self.positions(state.seen, T, x_BTD.device))
        first = min(T, C - state.seen % C)  # tokens until the chunk in progress closes, then whole chunks
        sizes = [first] + [C] * ((T - first) // C) + ([(T - first) % C] if (T - first) % C else [])
        parts, t = [], 0
        for n in sizes if T else []:
            q, k, v = q_BTHK[:, t:t + n], k_BTGK[:, t:t + n], v_BTGV[:, t:t + n]
            if state.k is not None:  # the chunk's kept entries, then this piece's
                k, v = torch.cat([state.k, k], dim=1), torch.cat([state.v, v], dim=1)
            parts.append(self.kernel.causal(q, k, v, scale=self.cfg.scale, sinks_H=self.sinks))
            t, state.seen = t + n, state.seen + n
            if state.seen % C == 0:
                state.k = state.v = None
            else:  # a copy (a cat is one already): the state must not pin the call's keys and values
                state.k, state.v = (k, v) if state.k is not None else (k.clone(), v.clone())
        o_BTHV = torch.cat(parts, dim=1) if parts else q_BTHK.new_zeros(*q_BTHK.shape[:3], self.cfg.v_head_dim)
        return self.finish(o_BTHV, gate), state
