"""A model built from a ``ModelConfig``: embedding, blocks, final norm, LM head.

Each block is the essay's layer with three slots (section 1)::

    x = depth.read(ds);  y = token(norm(x));    ds = depth.write(ds, y)
    x = depth.read(ds);  y = channel(norm(x));  ds = depth.write(ds, y)

where ``ds`` is the depth state: the residual stream (``residual``), four streams
(``mhc``, arXiv 2512.24880) or the cache of completed group sums (``attnres``,
arXiv 2603.15031). The depth config builds one mixer per sublayer (two per layer)
and a head that turns the final depth state back into one vector.

``LayerConfig.norms`` moves the norms: after each mixer ("post"), on both sides ("sandwich"),
or one norm whose output both mixers read ("parallel": the channel sublayer skips its read,
``x + f(n(x)) + g(n(x))`` for the residual). ``ModelConfig.norm_kind`` makes them RMSNorms or
bias-free LayerNorms.

The model's cache is a list of per-layer states (``LayerState``: the token
mixer's and the channel mixer's, e.g. an Engram's last token ids). Prefilling
a chunk and decoding one token are the same call, ``model(ids, cache)``.

An optional ``lookup`` slot (Engram, arXiv 2601.07372) is read first; its output is
added to the token mixer's input and to what the token sublayer writes, which for the
plain residual is the Engram paper's ``h <- h + engram(h)`` before the attention.

Sharing across layers is a small protocol between the model, the store configs and
their states (storelab.state); the model names no store kind:

* a layer's empty state comes from its config, ``new_state(groups, owner=...)``
  (``StoreConfig.new_state``: None for stores that share nothing, which make their own
  state on the first call). ``groups`` is a
  scratch dict one cache's layers fill in order: a selection group (GLM's IndexShare,
  V4.1-Flash's hierarchical groups) keeps its per-call share there;
* sharing a cache (``LayerConfig.cache_owner``): a reader whose config and owner's
  config say ``CACHE_SHARING == "latent"`` gets a view of the owner's state
  (``owner=``), which writes nothing, returns the owner's entries and holds no bytes
  of its own; a reader that says ``"handed"`` is called with ``shared=`` the owner's
  state, after the owner's call, and keeps no cache of its own; any other store keeps
  its own cache at run time (the accounting still counts the shared cache once, and
  ``Model.unshared`` lists them);
* before each layer runs, its state hears ``before_call(T)`` (a view takes its
  position from the owner); after the first decoder layer, ``narrow(start)`` (a
  selection it published for every token is cut to the decoder's tokens);
* a cache assembled from copies (the probes swap states between caches) is linked
  again by ``Model.relink``: every state takes the links (``LINKS``: a group's share,
  a view's owner) of a fresh state made for that cache.

Encoder-decoder (DeepSeek-V4.1-Flash, ``encoder_layers = E``): every token passes
through the E encoder layers; the decoder layers see only the tokens the caller
marks (``decode_from``): the prompt's last ``decoder_tail`` tokens and every
generated token. ``prefill`` and ``generate`` mark them.

Shape legend: B batch, T tokens in this call, D model width, V vocabulary.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import Tensor, nn

from storelab.models.config import LayerConfig, ModelConfig
from storelab.ops.norm import LayerNorm, RMSNorm
from storelab.state import State, upcoming, upcoming_tokens

NORMS = {"rms": RMSNorm, "layer": LayerNorm,  # ModelConfig.norm_kind -> the block and final norms' module
         "layer_bias": functools.partial(LayerNorm, bias=True)}


@dataclass
class LayerState:
    """One layer's slot of the model cache: the token mixer's and the channel mixer's states."""

    token: State | None = None
    channel: State | None = None
    lookup: State | None = None   # Engram's last token ids
    beside: State | None = None   # the second token mixer's (Falcon-H1's Mamba-2 state)
    seen: int = 0  # tokens that passed through this layer

    def nbytes(self) -> int:
        return sum(s.nbytes() for s in (self.token, self.channel, self.lookup, self.beside) if s is not None)

    def clone(self) -> "LayerState":
        """Each state's ``clone()`` (its links kept: ``Model.relink`` the cloned cache to use it alone)."""
        token, channel, lookup, beside = (None if s is None else s.clone()
                                          for s in (self.token, self.channel, self.lookup, self.beside))
        return LayerState(token=token, channel=channel, lookup=lookup, beside=beside, seen=self.seen)


class Block(nn.Module):
    """normalize -> mix tokens -> combine; normalize -> mix channels -> combine."""

    def __init__(self, cfg: LayerConfig, index: int, n_sublayers: int, d_model: int, eps: float,
                 norm_kind: str = "rms"):
        super().__init__()
        Norm = NORMS[norm_kind]
        self.index = index
        self.token = cfg.token.build()
        self.channel = cfg.channel.build() if cfg.channel is not None else None  # None: no channel sublayer
        # "pre": x + f(norm(x)); "post": x + norm(f(x)); "sandwich": x + norm2(f(norm1(x)));
        # "parallel": x + f(norm(x)) + g(norm(x)), norm_token the one norm; "parallel_two": x + f(n1(x)) + g(n2(x))
        self.norms = cfg.norms
        self.norm_token = Norm(d_model, eps)
        # a channel store that READS_STREAM owns its input norms: the block hands it the stream itself
        self.channel_reads_stream = cfg.channel is not None and cfg.channel.READS_STREAM
        self.norm_channel = Norm(d_model, eps) if cfg.channel is not None and cfg.norms != "parallel" \
            and not self.channel_reads_stream else None
        if cfg.norms == "sandwich":
            self.post_norm_token = Norm(d_model, eps)
            self.post_norm_channel = Norm(d_model, eps) if cfg.channel is not None else None
        self.depth_token = cfg.depth.build(sublayer=2 * index, n_sublayers=n_sublayers)
        self.depth_channel = cfg.depth.build(sublayer=2 * index + 1, n_sublayers=n_sublayers)
        self.lookup = cfg.lookup.build() if cfg.lookup is not None else None
        self.norm_lookup = Norm(d_model, eps) if cfg.lookup is not None else None
        self.beside = cfg.beside.build() if cfg.beside is not None else None

    def forward(self, ds: Any, state: LayerState, token_ids_BT: Tensor, shared: State | None = None,
                keep_from: int = 0):
        """``shared``: the owner's state, handed to a token store that reads it (``CACHE_SHARING ==
        "handed"``). ``keep_from``: drop the tokens before it after the token mixer (the first decoder layer)."""
        state.seen += token_ids_BT.shape[1]  # tokens through the token mixer
        x_BTD = self.depth_token.read(ds)
        e_BTD = None
        if self.lookup is not None:  # Engram: its output joins the stream before the token mixer reads it
            e_BTD, state.lookup = self.lookup(self.norm_lookup(x_BTD), state.lookup, token_ids=token_ids_BT)
            x_BTD = x_BTD + e_BTD
        handed = {} if shared is None else {"shared": shared}
        u_BTD = self._pre(self.norm_token, x_BTD)
        y_BTD, state.token = self.token(u_BTD, state.token, token_ids=token_ids_BT, **handed)
        if self.beside is not None:  # a second token mixer on the same input (Falcon-H1), outputs summed
            b_BTD, state.beside = self.beside(u_BTD, state.beside, token_ids=token_ids_BT)
            y_BTD = y_BTD + b_BTD
        y_BTD = self._post(self.norm_token, "post_norm_token", y_BTD)
        ds = self.depth_token.write(ds, y_BTD if e_BTD is None else y_BTD + e_BTD)
        if keep_from:
            ds, token_ids_BT = _slice_time(ds, keep_from), token_ids_BT[:, keep_from:]
            u_BTD, x_BTD = u_BTD[:, keep_from:], x_BTD[:, keep_from:]
            if token_ids_BT.shape[1] == 0:
                return None, state
        if self.channel is None:
            return ds, state
        if self.channel_reads_stream:
            u_BTD = self.depth_channel.read(ds)
        elif self.norms == "parallel_two":  # the channel mixer's own norm of what the token mixer read
            u_BTD = self.norm_channel(x_BTD)
        elif self.norms != "parallel":  # "parallel": the channel mixer reads what the token mixer read
            u_BTD = self._pre(self.norm_channel, self.depth_channel.read(ds))
        y_BTD, state.channel = self.channel(u_BTD, state.channel, token_ids=token_ids_BT)
        ds = self.depth_channel.write(ds, self._post(self.norm_channel, "post_norm_channel", y_BTD))
        return ds, state

    def _pre(self, norm: nn.Module, x_BTD: Tensor) -> Tensor:
        """The mixer's input: normalised, except where the block normalises after ("post")."""
        return x_BTD if self.norms == "post" else norm(x_BTD)

    def _post(self, norm: nn.Module, sandwich: str, y_BTD: Tensor) -> Tensor:
        """The mixer's output as the stream receives it."""
        if self.norms == "post":
            return norm(y_BTD)
        if self.norms == "sandwich":
            return getattr(self, sandwich)(y_BTD)
        return y_BTD


class Model(nn.Module):
    """Embedding -> blocks -> depth head -> final norm (``norm_kind``) -> LM head."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        n_sub = 2 * cfg.n_layers
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(lay, i, n_sub, cfg.d_model, cfg.norm_eps, cfg.norm_kind)
                                    for i, lay in enumerate(cfg.layers))
        self.depth_head = cfg.layers[0].depth.build_head(n_sublayers=n_sub)
        self.norm = NORMS[cfg.norm_kind](cfg.d_model, cfg.norm_eps)
        self.lm_head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.lm_head.weight = self.embed.weight
        # how each layer reads another layer's cache, from the configs' declared CACHE_SHARING
        sharing = [lay.token.CACHE_SHARING if not cfg.owns_cache(i) else "" for i, lay in enumerate(cfg.layers)]
        self._views = [s == "latent" and cfg.layers[lay.cache_owner].token.CACHE_SHARING == "latent"
                       for s, lay in zip(sharing, cfg.layers)]   # a view of the owner's latent cache
        self._handed = [s == "handed" for s in sharing]          # called with shared= the owner's state
        self.unshared = [i for i in range(cfg.n_layers)
                         if not cfg.owns_cache(i) and not self._views[i] and not self._handed[i]]

    def _new_state(self, i: int, groups: dict, cache: list[LayerState]) -> State | None:
        """Layer i's empty token state, linked through ``groups`` and, for a view, to its owner's
        state in ``cache`` (an earlier layer). Stores that share nothing make theirs on the first call."""
        cfg = self.cfg.layers[i].token
        owner = cache[self.cfg.layers[i].cache_owner].token if self._views[i] else None
        try:
            return cfg.new_state(groups, owner=owner)
        except ValueError as e:
            raise ValueError(f"layer {i}: {e}") from None

    def new_cache(self) -> list[LayerState]:
        """Empty per-layer states; selection groups and readers of another layer's cache linked."""
        groups: dict = {}
        cache: list[LayerState] = []
        for i in range(self.cfg.n_layers):
            cache.append(LayerState(token=self._new_state(i, groups, cache)))
        return cache

    def relink(self, cache: list[LayerState]) -> list[LayerState]:
        """Link the token states of ``cache`` as ``new_cache`` links them: each selection group one
        fresh per-call share, each view its owner's state in this cache. For a cache assembled from
        copies (``LayerState.clone``, states taken from another cache); returns ``cache``."""
        groups: dict = {}
        for i, st in enumerate(cache):
            linked = self._new_state(i, groups, cache)
            if linked is None:
                continue
            if st.token is None:
                st.token = linked
            else:
                st.token.relink(linked)
        return cache

    def _run(self, blocks: range, ds: Any, cache: list[LayerState], ids_BT: Tensor, keep_from: int = 0) -> Any:
        for i in blocks:
            st = cache[i].token
            if st is not None:
                st.before_call(ids_BT.shape[1])
            shared = cache[self.cfg.layers[i].cache_owner].token if self._handed[i] else None
            ds, cache[i] = self.blocks[i](ds, cache[i], ids_BT, shared, keep_from)
            if keep_from and cache[i].token is not None:
                cache[i].token.narrow(keep_from)
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
        e_BTD = self.embed(token_ids_BT)
        if self.cfg.embed_scale != 1.0:  # Gemma: sqrt(d_model), rounded to the activations' dtype as it does
            e_BTD = e_BTD * torch.tensor(self.cfg.embed_scale, dtype=e_BTD.dtype)
        ds = self.blocks[0].depth_token.init(e_BTD)
        if not E:
            ds = self._run(range(len(self.blocks)), ds, cache, token_ids_BT)
        else:
            ds = self._run(range(E), ds, cache, token_ids_BT)
            ds = self._encoder_to_decoder(ds, cache, token_ids_BT, decode_from)
        if ds is None:  # no token of this call reaches the decoder
            B = token_ids_BT.shape[0]
            return self.embed.weight.new_zeros(B, 0, self.cfg.vocab_size), cache
        h_BTD = self.depth_head(ds)
        if keep_logits:
            h_BTD = h_BTD[:, -keep_logits:]
        return self._logits(self.lm_head(self.norm(h_BTD))), cache

    def _logits(self, z_BTV: Tensor) -> Tensor:
        """Cohere's logit scale and Gemma 2's soft cap, where the config has them."""
        if self.cfg.logit_scale != 1.0:
            z_BTV = z_BTV * self.cfg.logit_scale
        if self.cfg.logit_softcap is not None:
            z_BTV = torch.tanh(z_BTV / self.cfg.logit_softcap) * self.cfg.logit_softcap
        return z_BTV

    def _encoder_to_decoder(self, ds, cache, ids_BT, decode_from):
        """The first decoder layer writes its cache for every token from the encoder's
        final states; the other decoder layers run on the marked tokens only."""
        E = self.cfg.encoder_layers
        ds = self._run(range(E, E + 1), ds, cache, ids_BT, keep_from=decode_from)
        if ds is None:
            return None
        return self._run(range(E + 1, len(self.blocks)), ds, cache, ids_BT[:, decode_from:])


def _slice_time(ds: Any, start: int) -> Any:
    """The depth state from token ``start`` on (tensors sliced on their time axis, dim 1)."""
    if isinstance(ds, Tensor):
        return ds[:, start:]
    if isinstance(ds, (list, tuple)):
        return type(ds)(_slice_time(x, start) for x in ds)
    if dataclasses.is_dataclass(ds):
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
             on_token: Callable[[int], None] | None = None, fast: bool = True) -> tuple[Tensor, list[LayerState]]:
    """Greedy (``temperature == 0``) or sampled generation; returns the new token ids [B, K] and the cache.

    ``fast``: one prompt (B = 1) of a model held in CPU memory decodes through ``storelab.models.decode.Decoder``,
    the same step without the general path's overhead (equal to fp32 rounding); False, several prompts, a model
    on a GPU or a streamed one (weights on ``meta``, read per call), steps by ``model(ids, cache)``.
    """
    from storelab.models.decode import Decoder  # (decode imports this module)

    if fast and prompt_BT.shape[0] == 1 and Decoder.runs(model):

        decoder = Decoder(model)
        step_fn = decoder.step
    else:
        step_fn = lambda ids, cache: model(ids, cache)[0][:, -1]  # noqa: E731
    with upcoming(max(0, new_tokens - 1)):  # the generated tokens will follow the prompt into the caches
        logits_BV, cache = prefill(model, prompt_BT, chunk=chunk)
    out = []
    for _ in range(new_tokens):
        if not bool(torch.isfinite(logits_BV).all()):   # NaN argmaxes to token 0: never a "generated" token
            raise ValueError(f"activations: the logits at token {prompt_BT.shape[1] + len(out)} are not finite (NaN "
                             f"or inf): the computation overflowed (fp16 weights? try --dtype fp32)")
        nxt_B1 = pick(logits_BV, temperature=temperature, top_k=top_k, generator=generator)
        out.append(nxt_B1)
        if on_token is not None:
            on_token(1)
        if len(out) == new_tokens:
            break
        with upcoming(new_tokens - len(out) - 1):
            logits_BV = step_fn(nxt_B1, cache)
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
        for slot in ("lookup", "beside", "channel"):
            sub = getattr(st, slot)
            if sub is not None and sub.nbytes():
                kind = getattr(lay, slot).KIND
                out[kind] = out.get(kind, 0) + sub.nbytes()
    return out
