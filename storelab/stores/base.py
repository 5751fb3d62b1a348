"""The store protocol: configs, cards and analytic footprints.

A store is a ``torch.nn.Module`` with ``forward(x, state=None, *, token_ids=None)
-> (y, state)``. Prefilling a chunk and stepping one token are the same call.

Each store has a config: a keyword-only dataclass, validated on construction
(a ValueError that names the field), with

* ``build()``              -> the module;
* ``footprint(L, ...)``    -> what one layer keeps and reads at context L,
                              computed without allocating anything;
* ``CARD``                 -> the essay's five questions plus the arXiv source.

Configs register themselves under a ``kind`` name, so model files can say
``kind = "kda"`` and ``storelab stores`` can print every card.

The config is the only authority on its kind. Whatever a layer above ``stores/``
needs to know about a store is a declared class attribute or a method here, never a
list of kind names elsewhere:

* ``SLOTS``           - the slots of a layer it may fill (``TOKEN``, ``CHANNEL``, ``DEPTH``,
                        ``LOOKUP``); a model file that puts it elsewhere is refused when read;
* ``FAMILY``          - its family in the report's picture of the stacks ("full", "window", ...);
* ``CARD_ORDER``      - its row in the essay's section-5 table (``storelab stores``);
* ``RECURRENT``       - it keeps a fixed-size state (a matrix per head), not entries per token;
* ``CACHE_SHARING``   - how a layer reads another layer's cache (``cache_owner``): ``""`` it
                        cannot and keeps its own, ``"latent"`` it reads the owner's latent
                        cache through a view, ``"handed"`` its module is handed the owner's state;
* ``READER_UNUSED``   - the module's parameters (name prefixes) that only write its own cache, so a
                        layer reading another's (``cache_owner``) leaves them unused (with sharing);
* ``SHARES_SELECTION``- layers of its kind can reuse one layer's selection of entries
                        (``runs_indexer`` says which layer selects);
* ``SELECTS``         - each query reads a selection of the entries; the module has ``selection_scores``
                        (``storelab.stores.selection_scores``: what it weighs and selects, for the probe);
* ``MIX_LABEL``       - its name in a model's mix ("60 window + 10 full"); "" = the kind;
* ``cache_entry_bytes(fmt)`` - bytes of one main cache entry in entry format ``fmt``
                        (0 for a store that keeps no entry per token);
* ``conv_input_bytes(fmt)`` - bytes of one input of its short causal convolution (0: none); it keeps
                        W - 1 of them, an engine that keeps the kernel's whole window one more;
* ``conv_width()``    - W, the taps of that convolution (0: none), so that an engine can keep its W - 1
                        inputs in a format of their own (vLLM: the model's dtype beside an fp32 state);
* ``cache_window()``  - the tokens a sliding-window cache keeps (W; 0: it keeps every token, or no
                        entries): engines size such a cache by it (``storelab.models.engines``);
* ``cache_chunk()``   - the tokens per chunk of a chunked-attention cache (0: not chunked);
* ``table_params()``  - parameters in lookup tables that publishers count apart (Engram);
* ``parity_stores(d_model, n_heads, head_dim)`` - (class method) its store tables in the section-6
                        parity experiment (``storelab.capacity.recurrence``) at that width; () = not in it;
* ``transition()``    - what a token does to a recurrent state, S_t = A_t S_{t-1} + b_t: A_t in words,
                        whether it is diagonal, whether it can have a negative eigenvalue, down to -1 (``Transition``;
                        None for stores without a recurrent state);
* ``cache_format``    - the entry format the store itself fixes (None: the caller's dtype);
* ``published_cache_format()`` - the format its publisher's engine keeps the cache in
                        (``storelab memory``'s default; None: bf16);
* ``memory_terms(cache=, state=)`` - the two terms of its memory: bytes per token of context
                        (caches, index keys, compressed entries at their ratio) and bytes per
                        sequence that do not grow (recurrent states, conv tails, window rings,
                        open pools), caches in ``cache`` and recurrent state in ``state``;
* ``ENTRY_FORMATS``   - the formats ``footprint(dtype=)`` accepts. Every ``footprint`` checks its
                        arguments first (a negative context or an unknown format is a ValueError
                        naming it), whichever kind defines it.

The state rule, stated once: ``forward(x, state)`` may update the state it is given in
place and returns it (callers who need the state before the call keep ``state.clone()``);
a store writes no diagnostics on itself during forward: what a probe needs (a selection,
the experts' load) the store hands to ``emit(self, name, value)``, which keeps it only
inside an ``observe()`` block, for that block's caller::

    with observe() as seen:            # or observe(model.blocks[3].token) for one store
        model(ids)
    seen.last(store, "selection")      # [B, T, k] of the store's last call in the block
    seen.all(store, "load")            # one tensor per call

Outside such a block ``emit`` costs one context-variable read and keeps nothing, and two
blocks never see each other's values.

Training signals, stated once. What a store contributes to training beyond its output (an
objective for a part the language-model loss cannot reach, such as an indexer behind a hard
top-k; a load-balancing loss; an update made outside the gradient, such as DeepSeek's routing
bias) it hands over the same way, inside a ``training_signals()`` block of the training loop::

    with training_signals() as sig:
        logits, _ = model(ids)
    (lm_loss + w * sig.mean("indexer") + sig.mean("balance")).backward()
    opt.step(); sig.apply_updates()

``add_loss(self, name, value)`` (a tensor or a function making one, called only inside a block)
and ``add_update(self, fn)`` (``fn(reduce)`` after the optimiser step, ``reduce`` summing over processes;
``counts=t``: ``fn(t summed over processes and micro-batches)``) cost one context-variable read outside a block.
"""


from __future__ import annotations

import contextvars
import dataclasses
import functools
import numbers
import types
import typing
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Iterator

import torch

TOKEN, CHANNEL, DEPTH, LOOKUP = "token", "channel", "depth", "lookup"  # the slots of a layer (essay section 1)

# bytes per stored number; llama.cpp's q8_0 / q4_0 keep blocks of 32 codes with one fp16 scale
# (34 and 18 bytes per block); fp8 and fp4 are 1 and 0.5 bytes (plain rows: per-tensor scales, as
# vLLM keeps fp8 caches; the DeepSeek stores add their per-block scales in ``cache_entry_bytes``)
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1, "fp4": 0.5, "q8_0": 34 / 32, "q4_0": 18 / 32}
STATE_DTYPES = ("fp32", "bf16", "fp16")  # what a recurrent state or an open pool may be kept in
TORCH_DTYPE_BYTES = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2, torch.float64: 8}


@dataclass(frozen=True)
class Card:
    """The essay's questions of a store (section 2, table of section 5)."""

    name: str
    written_by: str
    holds: str
    reading_costs: str
    forgets: str
    source: str  # arXiv number(s) or reference of the idea

    def as_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Transition:
    """A recurrent store's transition, S_t = A_t S_{t-1} + b_t: what decides whether one layer can track
    parity (essay section 6). Diagonal A_t with entries in (0, 1] are in TC0 (Merrill, Petty and Sabharwal,
    arXiv 2404.08819); no transition whose eigenvalues are all >= 0 tracks parity at every length, one whose
    eigenvalues reach -1 (a reflection) can (Grazzi et al., arXiv 2411.12537)."""

    form: str           # A_t in words, with its gates' ranges ("alpha (I - beta k k^T), beta in (0, 2)")
    diagonal: bool      # A_t is diagonal (a decay per head or channel), with no mixing of coordinates
    negative: bool      # A_t can have a negative eigenvalue
    reflection: bool = False  # ... down to -1 (at the gates' limits): a sign flip that keeps the magnitude


@dataclass(frozen=True)
class ParamCount:
    """Parameters a store holds (``stored``) and uses for one token (``active``)."""

    stored: int
    active: int

    def __add__(self, other: "ParamCount") -> "ParamCount":
        return ParamCount(self.stored + other.stored, self.active + other.active)


@dataclass(frozen=True)
class Footprint:
    """What one layer keeps and reads for a context of ``context`` tokens.

    kept:            entries kept (cache rows, pooled entries, or matrices for a recurrent state)
    read:            entries read by the next token (per group of heads where that applies)
    scored:          entries an indexer scores to choose what to read (0 when there is none)
    state_bytes:     bytes of state the layer holds at this context, for batch 1
    read_flops:      multiply-adds x2 the next token spends reading the store
    """

    context: int
    kept: int
    read: int
    state_bytes: int
    scored: int = 0
    read_flops: int = 0
    note: str = ""

    @property
    def bytes_per_token(self) -> float:
        return self.state_bytes / max(self.context, 1)


@dataclass(frozen=True)
class MemoryTerms:
    """A layer's memory in two terms: at context L it holds ``per_token * L + per_sequence`` bytes
    per sequence (exact once L is past its windows and a multiple of its pooling strides).

    per_token:        bytes per token of context: caches, index keys, compressed entries at their ratio
    per_sequence:     bytes per sequence that do not grow: recurrent states, conv tails, window rings,
                      compressors' open pools (at their fullest)
    cache_per_token:  of ``per_token``, the main cache entries alone (no index keys): the global cache
    """

    per_token: float = 0.0
    per_sequence: float = 0.0
    cache_per_token: float = 0.0

    def at(self, context: int) -> float:
        return self.per_token * context + self.per_sequence


TERMS_AT = 1 << 20  # the default memory_terms read the footprint at 2^20 and 2^21 tokens


def _checked(footprint):
    """A kind's ``footprint`` with its arguments checked first (see the module docstring)."""

    @functools.wraps(footprint)
    def checked(self, context: int, *, dtype: str = "bf16") -> "Footprint":
        if isinstance(context, bool) or not isinstance(context, numbers.Integral) or context < 0:
            raise ValueError(f"context: must be a whole number of tokens >= 0, got {context!r}")
        if dtype not in self.ENTRY_FORMATS:
            raise ValueError(f"dtype: unknown entry format {dtype!r} (store {self.KIND or type(self).__name__}; "
                             f"accepted: {', '.join(self.ENTRY_FORMATS)})")
        return footprint(self, int(context), dtype=dtype)

    return checked


REGISTRY: dict[str, type["StoreConfig"]] = {}


def register(kind: str):
    """Class decorator: make a store config findable by its ``kind`` name."""

    def deco(cls):
        if kind in REGISTRY and REGISTRY[kind] is not cls:
            raise ValueError(f"store kind {kind!r} registered twice")
        bad = [s for s in cls.SLOTS if s not in (TOKEN, CHANNEL, DEPTH, LOOKUP)]
        if not cls.SLOTS or bad:
            raise ValueError(f"store kind {kind!r}: SLOTS must name slots among token, channel, depth, lookup, "
                             f"got {cls.SLOTS!r}")
        if cls.CACHE_SHARING not in ("", "latent", "handed"):
            raise ValueError(f"store kind {kind!r}: CACHE_SHARING must be '', 'latent' or 'handed', "
                             f"got {cls.CACHE_SHARING!r}")
        cls.KIND = kind
        REGISTRY[kind] = cls
        return cls

    return deco


class StoreConfig:
    """Mixin for store config dataclasses (declare them ``@dataclass(kw_only=True)``)."""

    KIND: ClassVar[str] = ""
    CARD: ClassVar[Card]
    # -- what the layers above stores/ ask of a kind (see the module docstring) ----------------
    SLOTS: ClassVar[tuple[str, ...]] = ()
    FAMILY: ClassVar[str] = ""
    CARD_ORDER: ClassVar[int] = 1000
    RECURRENT: ClassVar[bool] = False
    CACHE_SHARING: ClassVar[str] = ""
    READER_UNUSED: ClassVar[tuple[str, ...]] = ()
    SHARES_SELECTION: ClassVar[bool] = False
    SELECTS: ClassVar[bool] = False
    MIX_LABEL: ClassVar[str] = ""
    READS_STREAM: ClassVar[bool] = False  # a channel store handed the stream itself, owning its norms (Gemma 4)
    cache_format: ClassVar[str | None] = None  # a field of its own in stores that fix their entry format
    ENTRY_FORMATS: ClassVar[tuple[str, ...]] = tuple(DTYPE_BYTES)

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "footprint" in cls.__dict__:  # the kind's own: checked, whichever kind defines it
            cls.footprint = _checked(cls.__dict__["footprint"])

    @property
    def runs_indexer(self) -> bool:
        """Whether this layer selects for its group (stores with ``SHARES_SELECTION``)."""
        return self.SHARES_SELECTION

    def new_state(self, groups: dict, *, owner=None):
        """The layer's empty state before the first call, or None to let the store make its own then.

        ``groups`` is one scratch dict per model cache, through which the layers that share
        something within a call (a selection group) link their states; ``owner`` is the state
        of the layer whose cache this one reads (``cache_owner``, for ``CACHE_SHARING ==
        "latent"``). Stores that share nothing return None."""
        return None

    def cache_entry_bytes(self, fmt: str) -> float:
        """Bytes of one main cache entry (key and value, no indexer key) in entry format ``fmt``."""
        return 0.0

    def conv_input_bytes(self, fmt: str) -> float:
        """Bytes of one input of the store's short causal convolution in ``fmt`` (0: it has none)."""
        return 0.0

    def conv_width(self) -> int:
        """W, the taps of the store's short causal convolution (0: it has none); it keeps W - 1 inputs."""
        return 0

    def cache_window(self) -> int:
        """The tokens a sliding-window cache keeps, W (0: it keeps every token, or keeps no entries)."""
        return 0

    def cache_chunk(self) -> int:
        """The tokens per chunk of a chunked-attention cache (0: the store is not chunked)."""
        return 0

    def published_cache_format(self) -> str | None:
        """The entry format the model's publisher keeps this store's cache in (None: not stated)."""
        return self.cache_format

    def memory_terms(self, *, cache: str = "bf16", state: str = "fp32") -> MemoryTerms:
        """Bytes per token and per sequence, caches in ``cache``, recurrent state in ``state``.

        This default reads the footprint at 2^20 and 2^21 tokens (past any window, a multiple of
        any stride): its growth is the per-token term, the rest the per-sequence term. Stores whose
        fixed state is not in the cache's format (recurrent states, open pools) or whose entries mix
        formats (DeepSeek's) say their own."""
        if state not in STATE_DTYPES:
            raise ValueError(f"state dtype: unknown {state!r} (accepted: {', '.join(STATE_DTYPES)})")
        a, b = self.footprint(TERMS_AT, dtype=cache), self.footprint(2 * TERMS_AT, dtype=cache)
        per_token = (b.state_bytes - a.state_bytes) / TERMS_AT
        entries_per_token = (b.kept - a.kept) / TERMS_AT
        return MemoryTerms(per_token=per_token, per_sequence=max(a.state_bytes - per_token * TERMS_AT, 0.0),
                           cache_per_token=entries_per_token * self.cache_entry_bytes(cache))

    def experts_per_token(self) -> tuple[int, int, int] | None:
        """(chosen, available, shared) experts per token for an expert store; None for any other."""
        return None

    def table_params(self) -> int:
        """Parameters in lookup tables that publishers count apart (Engram's rows x width)."""
        return 0

    @classmethod
    def parity_stores(cls, d_model: int, n_heads: int, head_dim: int) -> tuple[dict, ...]:
        """Store tables of this kind for the section-6 parity experiment (``storelab.capacity.recurrence``)
        in a model ``d_model`` wide, ``n_heads`` heads with states ``head_dim`` wide; () = not in it."""
        return ()

    def transition(self) -> Transition | None:
        """What a token does to the recurrent state (``Transition``); None: the store keeps none."""
        return None

    # -- validation helpers -------------------------------------------------
    @staticmethod
    def check(ok: bool, field: str, msg: str) -> None:
        if not ok:
            raise ValueError(f"{field}: {msg}")

    def check_positive(self, *names: str) -> None:
        for n in names:
            v = getattr(self, n)
            if v is None or v <= 0:
                raise ValueError(f"{n}: must be > 0, got {v!r}")

    # -- (de)serialisation --------------------------------------------------
    @classmethod
    def from_dict(cls, d: dict[str, Any]):
        """The config from a table (TOML, JSON): lists become tuples where the field is a tuple."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names - {"kind"})
        if unknown:
            raise ValueError(f"{unknown[0]}: unknown option for store {cls.KIND!r} (known: {', '.join(sorted(names))})")
        tuples = cls.tuple_fields()
        return cls(**{k: (tuple(v) if k in tuples and isinstance(v, list) else v) for k, v in d.items() if k != "kind"})

    @classmethod
    def tuple_fields(cls) -> frozenset[str]:
        """Fields whose declared type is a tuple (or a tuple or None); read once per class."""
        return _tuple_fields(cls)

    def to_dict(self) -> dict[str, Any]:
        out = {"kind": self.KIND}
        for f in dataclasses.fields(self):
            out[f.name] = getattr(self, f.name)
        return out

    # -- the protocol ---------------------------------------------------------
    def build(self) -> torch.nn.Module:  # pragma: no cover
        raise NotImplementedError

    def footprint(self, context: int, *, dtype: str = "bf16") -> Footprint:  # pragma: no cover
        """What one layer keeps and reads at this context, entries stored in ``dtype``."""
        raise NotImplementedError

    def num_params(self) -> ParamCount:  # pragma: no cover
        """Parameters stored and active per token, from the config alone (no allocation)."""
        raise NotImplementedError


@functools.cache
def _tuple_fields(cls) -> frozenset[str]:
    hints = typing.get_type_hints(cls)
    out = set()
    for f in dataclasses.fields(cls):
        t = hints.get(f.name)
        options = typing.get_args(t) if typing.get_origin(t) in (typing.Union, types.UnionType) else (t,)
        if any(o is tuple or typing.get_origin(o) is tuple for o in options):
            out.add(f.name)
    return frozenset(out)


def store_cards() -> list[dict[str, str]]:
    """Every registered store's card (one per card name), in the order of the essay's section-5 table:
    by each config's ``CARD_ORDER``, then by kind."""
    seen, out = set(), []
    for kind, cls in sorted(REGISTRY.items(), key=lambda kv: (kv[1].CARD_ORDER, kv[0])):
        if cls.CARD.name in seen:
            continue
        seen.add(cls.CARD.name)
        out.append({"kind": kind, **cls.CARD.as_dict()})
    return out


def build_store(d: dict[str, Any]):
    """Config from a dict with a ``kind`` key."""
    if "kind" not in d:
        raise ValueError("kind: missing store kind")
    kind = d["kind"]
    if kind not in REGISTRY:
        raise ValueError(f"kind: unknown store kind {kind!r} (known: {', '.join(sorted(REGISTRY))})")
    return REGISTRY[kind].from_dict(d)


def check_input(x: torch.Tensor, width: int, name: str = "x") -> None:
    """Raise a clear error unless x is [B, T, width]."""
    if x.dim() != 3 or x.shape[-1] != width:
        raise ValueError(f"{name}: expected shape [B, T, {width}], got {list(x.shape)}")


# -- diagnostics: returned to the caller who asked, never stashed on the store ------------------
class Observation:
    """What the stores emitted inside one ``observe()`` block: per store and name, every call's value."""

    def __init__(self, modules: tuple = ()):
        self._only = {id(m) for m in modules}
        self._seen: dict[tuple[int, str], list[Any]] = {}

    def wants(self, module) -> bool:
        return not self._only or id(module) in self._only

    def add(self, module, name: str, value: Any) -> None:
        self._seen.setdefault((id(module), name), []).append(value)

    def all(self, module, name: str) -> list[Any]:
        """Every value ``module`` emitted under ``name`` in the block, in call order ([] if none)."""
        return list(self._seen.get((id(module), name), []))

    def last(self, module, name: str) -> Any:
        """The value of the module's last call; a ValueError naming the store if it emitted none."""
        vals = self._seen.get((id(module), name))
        if not vals:
            raise ValueError(f"observe: {type(module).__name__} emitted no {name!r} in this block "
                             f"(was it called inside it, and does it emit {name!r}?)")
        return vals[-1]


_OBSERVING: contextvars.ContextVar[tuple[Observation, ...]] = contextvars.ContextVar("storelab_observing", default=())


@contextmanager
def observe(*modules) -> Iterator[Observation]:
    """Within the block, keep what the given stores (every store if none given) ``emit``."""
    obs = Observation(modules)
    tok = _OBSERVING.set(_OBSERVING.get() + (obs,))
    try:
        yield obs
    finally:
        _OBSERVING.reset(tok)


def emit(module, name: str, value: Any) -> None:
    """A store's diagnostic of the call in progress, delivered to the enclosing ``observe`` blocks."""
    for obs in _OBSERVING.get():
        if obs.wants(module):
            obs.add(module, name, value() if callable(value) else value)


def observing() -> bool:
    """Whether any ``observe`` block is open (a store may skip computing a costly diagnostic)."""
    return bool(_OBSERVING.get())


# -- training signals: auxiliary losses and out-of-gradient updates, for the training loop ------
class TrainingSignals:
    """What the stores handed to training during one ``training_signals()`` block."""

    def __init__(self, ignore: tuple[str, ...] = ()):
        self.ignore = frozenset(ignore)  # loss names not wanted: not even computed
        self.losses: dict[str, list[tuple[Any, torch.Tensor]]] = {}
        self.updates: list[tuple[Any, Callable, torch.Tensor | None]] = []

    def all(self, name: str) -> list[torch.Tensor]:
        """Every loss added under ``name``, in call order ([] if none)."""
        return [v for _, v in self.losses.get(name, [])]

    def mean(self, name: str) -> torch.Tensor | None:
        """The mean of the losses added under ``name`` (one per layer and call); None if none."""
        vals = self.all(name)
        return None if not vals else sum(vals) / len(vals)

    def apply_updates(self, reduce: Callable[[torch.Tensor], torch.Tensor] = lambda t: t) -> None:
        """Run the updates (after the optimiser step), in call order; ``reduce`` sums over processes."""
        with torch.no_grad():
            for _, fn, counts in self.updates:
                fn(reduce) if counts is None else fn(reduce(counts))

    @classmethod
    def merged(cls, parts: list["TrainingSignals"]) -> "TrainingSignals":
        """One step's updates from its micro-batches, as the whole batch's: the j-th update with ``counts`` of a
        module in each part is one update, of the summed counts; others run once per part (losses: not merged)."""
        out, slot = cls(), {}
        for part in parts:
            seen: dict[int, int] = {}
            for module, fn, counts in part.updates:
                j = seen[id(module)] = seen.get(id(module), -1) + 1
                if counts is not None and (id(module), j) in slot:
                    i = slot[id(module), j]
                    out.updates[i] = (*out.updates[i][:2], out.updates[i][2] + counts)
                    continue
                if counts is not None:
                    slot[id(module), j] = len(out.updates)
                out.updates.append((module, fn, counts))
        return out


_TRAINING: contextvars.ContextVar[TrainingSignals | None] = contextvars.ContextVar("storelab_training", default=None)


@contextmanager
def training_signals(*, ignore: tuple[str, ...] = ()) -> Iterator[TrainingSignals]:
    """Within the block, keep the losses and updates the stores add (``add_loss``, ``add_update``),
    except the losses named in ``ignore`` (which are not computed)."""
    sig = TrainingSignals(ignore)
    tok = _TRAINING.set(sig)
    try:
        yield sig
    finally:
        _TRAINING.reset(tok)


def collecting() -> bool:
    """Whether a ``training_signals`` block is open (a store may skip what only training needs)."""
    return _TRAINING.get() is not None


def add_loss(module, name: str, value: Any) -> None:
    """An auxiliary loss of the call in progress (a tensor, or a function making one), for the training loop."""
    sig = _TRAINING.get()
    if sig is not None and name not in sig.ignore:
        v = value() if callable(value) else value
        if v is not None:
            sig.losses.setdefault(name, []).append((module, v))


def add_update(module, fn: Callable, *, counts: torch.Tensor | None = None) -> None:
    """An update outside the gradient, run after the optimiser step: ``fn(reduce)`` (``reduce`` sums over the
    processes), or with ``counts`` (what it depends on through a sum: the experts' load) ``fn(counts summed over
    the processes and a step's micro-batches)``, so that accumulating equals one step."""
    sig = _TRAINING.get()
    if sig is not None:
        sig.updates.append((module, fn, counts))
