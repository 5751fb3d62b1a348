"""A model built from a ``ModelConfig``: embedding, blocks, final norm, LM head.

Each block is the essay's layer with three slots (section 1)::

    x = depth.read(ds);  y = token(norm(x));    ds = depth.write(ds, y)
    x = depth.read(ds);  y = channel(norm(x));  ds = depth.write(ds, y)

where ``ds`` is the depth state: the residual stream (``residual``), four streams
(``mhc``, arXiv 2512.24880) or the cache of completed group sums (``attnres``,
arXiv 2603.15031). The depth config builds one mixer per sublayer (two per layer)
and a head that turns the final depth state back into one vector.

The model's cache is a list of per-layer states (``LayerState``: the token
mixer's and the channel mixer's, e.g. an Engram's last token ids). Prefilling
a chunk and decoding one token are the same call, ``model(ids, cache)``.

An optional ``lookup`` slot (Engram, arXiv 2601.07372) is read first; its output is
added to the token mixer's input and to what the token sublayer writes, which for the
plain residual is the Engram paper's ``h <- h + engram(h)`` before the attention.

Sharing a selection (GLM's IndexShare, V4.1-Flash's hierarchical groups) is the
dsa/hierarchical stores' own mechanism: ``new_cache`` links their states with
``link_selection_states``. Sharing a cache (``LayerConfig.cache_owner``):

* a latent cache (mla, dsa, hierarchical) is shared here: the reader's state is a
  ``SharedLatentCache`` whose ``append`` writes nothing and returns the owner's
  entries (and index keys), so the reader reads exactly the owner's cache and
  holds no bytes of its own;
* a store whose module says ``SHARES = True`` (csa, hca) is handed the owner's state
  as ``shared=``, after the owner's call, and keeps no cache of its own;
* any other store keeps its own cache at run time; the accounting still counts the
  shared cache once, and ``Model.unshared`` lists them.

Encoder-decoder (DeepSeek-V4.1-Flash, ``encoder_layers = E``): every token passes
through the E encoder layers; the decoder layers see only the tokens the caller
marks (``decode_from``): the prompt's last ``decoder_tail`` tokens and every
generated token. ``prefill`` and ``generate`` mark them.

Shape legend: B batch, T tokens in this call, D model width, V vocabulary.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor, nn

from storelab.models.config import LayerConfig, ModelConfig
from storelab.ops.norm import RMSNorm
from storelab.state import State, tensor_bytes, upcoming, upcoming_tokens
from storelab.stores.dsa import SelectionCache, link_selection_states


@dataclass
class LayerState:
    """One layer's slot of the model cache: the token mixer's and the channel mixer's states."""

    token: State | None = None
    channel: State | None = None
    lookup: State | None = None   # Engram's last token ids
    seen: int = 0  # tokens that passed through this layer

    def nbytes(self) -> int:
        return sum(s.nbytes() for s in (self.token, self.channel, self.lookup) if s is not None)


@dataclass
class SharedLatentCache(SelectionCache):
    """A reader's view of another layer's latent cache: ``append`` returns the owner's
    entries and writes nothing; so does ``append_index`` (the owner's index keys)."""

    owner: SelectionCache | None = None

    def append(self, latent_BTC: Tensor, k_rope_BTR: Tensor) -> tuple[Tensor, Tensor]:
        return self.owner.latent, self.owner.k_rope

    def joined(self) -> Tensor | None:
        return self.owner.joined()

    def append_index(self, k_BTK: Tensor) -> Tensor:
        if self.owner.index_k is None:
            raise ValueError("cache_owner: the owner layer keeps no index keys for this reader's indexer")
        return self.owner.index_k

    @property
    def entries(self) -> int:
        return 0

    def nbytes(self) -> int:
        return tensor_bytes(self.index_k)  # always None: nothing of its own


def _call_store(store: nn.Module, x_BTD: Tensor, state, token_ids, shared):
    """Run a store; pass ``shared`` (another layer's state) only to stores that take it."""
    if shared is not None and getattr(store, "SHARES", False):
        return store(x_BTD, state, token_ids=token_ids, shared=shared)
    return store(x_BTD, state, token_ids=token_ids)


class Block(nn.Module):
    """normalize -> mix tokens -> combine; normalize -> mix channels -> combine."""

    def __init__(self, cfg: LayerConfig, index: int, n_sublayers: int, d_model: int, eps: float):
        super().__init__()
        self.index = index
        self.token = cfg.token.build()
        self.channel = cfg.channel.build()
        self.norm_token = RMSNorm(d_model, eps)
        self.norm_channel = RMSNorm(d_model, eps)
        self.depth_token = cfg.depth.build(sublayer=2 * index, n_sublayers=n_sublayers)
        self.depth_channel = cfg.depth.build(sublayer=2 * index + 1, n_sublayers=n_sublayers)
        self.lookup = cfg.lookup.build() if cfg.lookup is not None else None
        self.norm_lookup = RMSNorm(d_model, eps) if cfg.lookup is not None else None

    def forward(self, ds: Any, state: LayerState, token_ids_BT: Tensor, shared: State | None = None,
                keep_from: int = 0):
        """``keep_from``: drop the tokens before it after the token mixer (the first decoder layer)."""
        state.seen += token_ids_BT.shape[1]  # tokens through the token mixer
        x_BTD = self.depth_token.read(ds)
        e_BTD = None
        if self.lookup is not None:  # Engram: its output joins the stream before the token mixer reads it
            e_BTD, state.lookup = self.lookup(self.norm_lookup(x_BTD), state.lookup, token_ids=token_ids_BT)
            x_BTD = x_BTD + e_BTD
        y_BTD, state.token = _call_store(self.token, self.norm_token(x_BTD), state.token, token_ids_BT, shared)
        ds = self.depth_token.write(ds, y_BTD if e_BTD is None else y_BTD + e_BTD)
        if keep_from:
            ds, token_ids_BT = _slice_time(ds, keep_from), token_ids_BT[:, keep_from:]
            if token_ids_BT.shape[1] == 0:
                return None, state
        x_BTD = self.depth_channel.read(ds)
        y_BTD, state.channel = self.channel(self.norm_channel(x_BTD), state.channel, token_ids=token_ids_BT)
        ds = self.depth_channel.write(ds, y_BTD)
        return ds, state


class Model(nn.Module):
    """Embedding -> blocks -> depth head -> final RMSNorm -> LM head."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        n_sub = 2 * cfg.n_layers
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(lay, i, n_sub, cfg.d_model, cfg.norm_eps) for i, lay in enumerate(cfg.layers))
        self.depth_head = cfg.layers[0].depth.build_head(n_sublayers=n_sub)
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        self.unshared = [i for i, lay in enumerate(cfg.layers) if not cfg.owns_cache(i)
                         and not getattr(self.blocks[i].token, "SHARES", False) and not self._latent(i)]

    def _latent(self, i: int) -> bool:
        """Layer i reads another layer's latent cache through a SharedLatentCache."""
        o = self.cfg.layers[i].cache_owner
        return o not in (None, i) and self.cfg.layers[i].token.KIND in LATENT_KINDS \
            and self.cfg.layers[o].token.KIND in LATENT_KINDS

    def new_cache(self) -> list[LayerState]:
        """Empty per-layer states; selection groups and latent-cache readers linked."""
        tokens = link_selection_states([lay.token for lay in self.cfg.layers])
        cache = [LayerState(token=t) for t in tokens]
        for i in range(len(cache)):
            if self._latent(i):
                o = self.cfg.layers[i].cache_owner
                if cache[o].token is None:
                    cache[o].token = SelectionCache()
                share = cache[i].token.share if cache[i].token is not None else None
                cache[i].token = SharedLatentCache(share=share, owner=cache[o].token)
        return cache

    def _run(self, blocks: range, ds: Any, cache: list[LayerState], ids_BT: Tensor, keep_from: int = 0) -> Any:
        for i in blocks:
            lay = self.cfg.layers[i]
            st = cache[i].token
            if isinstance(st, SharedLatentCache):
                # the owner has already written this call's entries: the reader's tokens are its last T
                st.seen = st.owner.seen - ids_BT.shape[1]
            shared = cache[lay.cache_owner].token if lay.cache_owner not in (None, i) else None
            ds, cache[i] = self.blocks[i](ds, cache[i], ids_BT, shared, keep_from)
            if keep_from:
                _narrow_share(cache[i].token, keep_from)
        return ds

    def forward(self, token_ids_BT: Tensor, cache: list[LayerState] | None = None, *,
                decode_from: int = 0, keep_logits: int = 0) -> tuple[Tensor, list[LayerState]]:
        """Logits for the tokens that reach the LM head, and the updated cache.

        ``decode_from`` (encoder-decoder only): the first token of this call, counted
        within the call, that also passes through the decoder layers; the logits
        cover those tokens only. Decoder-only models ignore it.
        ``keep_logits``: n > 0 computes the logits of the last n of those tokens only
        (a prefill needs the last one; the LM head is then a vector, not a [T, vocab] matrix).
        """
        if token_ids_BT.dim() != 2:
            raise ValueError(f"token_ids: expected shape [B, T], got {list(token_ids_BT.shape)}")
        cache = self.new_cache() if cache is None else cache
        if len(cache) != len(self.blocks):
            raise ValueError(f"cache: expected {len(self.blocks)} layer states, got {len(cache)}")
        E = self.cfg.encoder_layers
        ds = self.blocks[0].depth_token.init(self.embed(token_ids_BT))
        if not E:
            ds = self._run(range(len(self.blocks)), ds, cache, token_ids_BT)
        else:
            ds = self._run(range(E), ds, cache, token_ids_BT)
            ds = self._encoder_to_decoder(ds, cache, token_ids_BT, decode_from)
        if ds is None:  # no token of this call reaches the decoder
            B = token_ids_BT.shape[0]
            return self.lm_head.weight.new_zeros(B, 0, self.cfg.vocab_size), cache
        h_BTD = self.depth_head(ds)
        if keep_logits:
            h_BTD = h_BTD[:, -keep_logits:]
        return self.lm_head(self.norm(h_BTD)), cache

    def _encoder_to_decoder(self, ds, cache, ids_BT, decode_from):
        """The first decoder layer writes its cache for every token from the encoder's
        final states; the other decoder layers run on the marked tokens only."""
        E = self.cfg.encoder_layers
        ds = self._run(range(E, E + 1), ds, cache, ids_BT, keep_from=decode_from)
        if ds is None:
            return None
        return self._run(range(E + 1, len(self.blocks)), ds, cache, ids_BT[:, decode_from:])


LATENT_KINDS = ("mla", "dsa", "hierarchical")


def _narrow_share(state: State | None, start: int) -> None:
    """After the first decoder layer ran on every token of a call, the selection it published
    covers them all; the decoder layers after it see only the tokens from ``start`` on."""
    share = getattr(state, "share", None)
    if share is None or share.pos_BTk is None:
        return
    share.seen, share.T = share.seen + start, share.T - start
    # copies: the narrowed selection must not keep the encoder tokens' rows alive
    share.pos_BTk, share.valid_BTk = share.pos_BTk[:, start:].clone(), share.valid_BTk[:, start:].clone()
    if share.pool_BTP is not None:
        share.pool_BTP, share.pool_valid_BTP = share.pool_BTP[:, start:].clone(), share.pool_valid_BTP[:, start:].clone()


def _slice_time(ds: Any, start: int) -> Any:
    """The depth state from token ``start`` on (tensors sliced on their time axis, dim 1)."""
    if isinstance(ds, Tensor):
        return ds[:, start:]
    if isinstance(ds, (list, tuple)):
        return type(ds)(_slice_time(x, start) for x in ds)
    if hasattr(ds, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.replace(ds, **{f: _slice_time(getattr(ds, f), start) for f in ds.__dataclass_fields__})
    return ds


# ---------------------------------------------------------------------------
# Prefill and generation
# ---------------------------------------------------------------------------
@torch.no_grad()
def prefill(model: Model, prompt_BT: Tensor, *, chunk: int = 0, cache: list[LayerState] | None = None,
            on_chunk: Callable[[int], None] | None = None) -> tuple[Tensor, list[LayerState]]:
    """Run the prompt in chunks of ``chunk`` tokens (0: one call); return the last token's logits and the cache."""
    T = prompt_BT.shape[1]
    if T == 0:
        raise ValueError("prompt: needs at least one token")
    chunk = chunk or T
    # encoder-decoder: only the prompt's last decoder_tail tokens (at least the last) reach the decoder
    tail_start = max(0, T - max(1, model.cfg.decoder_tail)) if model.cfg.encoder_layers else 0
    cache = model.new_cache() if cache is None else cache
    logits = None
    for s in range(0, T, chunk):
        e = min(T, s + chunk)
        dfrom = min(e - s, max(0, tail_start - s))
        with upcoming(T - e + upcoming_tokens()):  # caches reserve room for the rest of the prompt (and more)
            out, cache = model(prompt_BT[:, s:e], cache, decode_from=dfrom, keep_logits=1)
        if out.shape[1]:
            logits = out[:, -1]
        if on_chunk is not None:
            on_chunk(e - s)
    return logits, cache


@torch.no_grad()
def generate(model: Model, prompt_BT: Tensor, new_tokens: int, *, chunk: int = 0, temperature: float = 0.0,
             top_k: int = 0, generator: torch.Generator | None = None,
             on_token: Callable[[int], None] | None = None) -> tuple[Tensor, list[LayerState]]:
    """Greedy (``temperature == 0``) or sampled generation; returns the new token ids [B, K] and the cache."""
    with upcoming(max(0, new_tokens - 1)):  # the generated tokens will follow the prompt into the caches
        logits_BV, cache = prefill(model, prompt_BT, chunk=chunk)
    out = []
    for _ in range(new_tokens):
        nxt_B1 = pick(logits_BV, temperature=temperature, top_k=top_k, generator=generator)
        out.append(nxt_B1)
        if on_token is not None:
            on_token(1)
        if len(out) == new_tokens:
            break
        with upcoming(new_tokens - len(out) - 1):
            step, cache = model(nxt_B1, cache)
        logits_BV = step[:, -1]
    return torch.cat(out, dim=1) if out else prompt_BT[:, :0], cache


def pick(logits_BV: Tensor, *, temperature: float = 0.0, top_k: int = 0,
         generator: torch.Generator | None = None) -> Tensor:
    """The next token [B, 1]: argmax, or a sample from softmax(logits / temperature) over the top k."""
    if temperature < 0:
        raise ValueError(f"temperature: must be >= 0, got {temperature}")
    if temperature == 0:
        return logits_BV.argmax(-1, keepdim=True)
    logits = logits_BV.float() / temperature
    if top_k:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, -math.inf)
    return torch.multinomial(torch.softmax(logits, -1), 1, generator=generator)


def cache_bytes_by_kind(model: Model, cache: list[LayerState]) -> dict[str, int]:
    """Measured state bytes of the cache, summed per token-mixer kind (channel states counted under theirs)."""
    out: dict[str, int] = {}
    for lay, st in zip(model.cfg.layers, cache):
        if st.token is not None:
            out[lay.token.KIND] = out.get(lay.token.KIND, 0) + st.token.nbytes()
        for slot in ("lookup", "channel"):
            sub = getattr(st, slot)
            if sub is not None and sub.nbytes():
                kind = getattr(lay, slot).KIND
                out[kind] = out.get(kind, 0) + sub.nbytes()
    return out
