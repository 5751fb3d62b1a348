"""Models as data: a model is a list of layer configs, each with three slots.

A layer (essay section 1) is "normalize -> mix tokens -> combine, normalize -> mix
channels -> combine". Its config names one store per slot:

* ``token``   - the token mixer (attention, window, kda, mla, dsa, msa, csa, ...);
* ``channel`` - the channel mixer (ffn, moe); None for a layer that has none (a Mamba layer,
                a Nemotron-H mixer layer): the block then skips the channel sublayer and its norm;
* ``depth``   - how the block's output is combined with what came in (residual,
                mhc, attnres); every layer of a model uses the same depth mixer;
* ``lookup``  - optional: an Engram read beside the token mixer (V4.1-Flash's
                layers 1 and 14 have one as well as their experts).

plus the model-level facts of sharing: ``cache_owner`` (this layer reads layer j's
cache instead of keeping one, as in DeepSeek-V4.1-Flash) and ``selection_owner``
(this layer reuses layer j's selection; for dsa and hierarchical stores it is
derived from the store's own IndexShare / refresh rule). Accounting counts a
shared cache once, at its owner.

Stores with a ``layer_index`` field (dsa's IndexShare, hierarchical roles) get it
per layer, unless the file gives it: the layer's position among the layers that
use that named store (GLM: 0..77; V4.1-Flash's decoder: 0..19 from layer 20).

Model files (TOML or JSON) name their stores once and assign them to layers::

    name = "my-hybrid"
    d_model = 512
    vocab_size = 32000
    n_layers = 12

    [stores.kda]            # required d_model / vocab_size default to the model's
    kind = "kda"
    n_heads = 4
    head_k_dim = 64
    ...

    [[layers]]              # assignments, applied in order; later ones win
    at = "all"              # "all", an index, a slice "start:stop:step", or a list of them
    pattern = "KKKM"        # optional: tile this string over the selected layers
    token = { K = "kda", M = "mla" }
    channel = "moe"
    depth = "attnres"

``extends = "other-model"`` starts from a zoo model's file: its stores are
updated per name, its top-level facts replaced, and these ``[[layers]]``
assignments are applied after its own.

Every error names the file, the layer index and the field, e.g.
``my.toml: layer 5: token store 'mla' (mla): kv_lora_rank: must be > 0``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storelab.models.fileformat import compact_indices, dumps_toml
from storelab.stores.base import StoreConfig

SLOTS = ("token", "channel", "depth")
# "lookup": Engram beside the token mixer (V4.1-Flash layers 1 and 14); "beside": a second token mixer reading the
# token mixer's input, its output added to the token mixer's (Falcon-H1's attention and Mamba-2 side by side)
OPTIONAL_SLOTS = ("lookup", "beside")
MAY_BE_EMPTY = ("lookup", "channel", "beside")  # slots a layer may leave empty (a Mamba layer has no channel mixer)
# where a block normalises around a mixer f (x the stream): "pre" x + f(norm(x)) (Llama and most);
# "post" x + norm(f(x)) (OLMo 2, arXiv 2501.00656; EXAONE 4); "sandwich" x + norm2(f(norm1(x))) (Gemma 2 / 3);
# "parallel" x + f(norm(x)) + g(norm(x)): one norm, read by the token mixer f and the channel mixer g (Cohere's
# Command R / R7B / A, GPT-J); "parallel_two" x + f(n1(x)) + g(n2(x)): each mixer its own norm of the same x
# (GPT-NeoX / Pythia, StableLM's use_parallel_residual)
NORM_PLACES = {"pre": 1, "post": 1, "sandwich": 2, "parallel": 1,  # norms per sublayer ("parallel": per layer)
               "parallel_two": 1}
# what each of the block's norms (and the final one) computes: "rms" x / rms(x) * w (arXiv 1910.07467);
# "layer" (x - mean(x)) / std(x) * w, a LayerNorm without bias (arXiv 1607.06450; Cohere); "layer_bias" the same
# plus a bias b (GPT-NeoX, StarCoder2, StableLM)
NORM_KINDS = ("rms", "layer", "layer_bias")
NORM_WIDTHS = {"rms": 1, "layer": 1, "layer_bias": 2}  # parameters of one norm, in units of its width
INHERITED = ("d_model", "vocab_size")  # store fields that default to the model's value
LAYER_INDEX = "layer_index"  # filled per layer: the layer's position among those using the store


@dataclass(kw_only=True)
class Published:
    """The publisher's parameter figures (what our accounting is compared with)."""

    stored: float | None = None          # parameters stored (None: the essay leaves it open)
    active: float | None = None          # parameters used per generated token
    active_prefill: float | None = None  # per prompt token, where it differs (V4.1-Flash)
    engram: float | None = None          # Engram table parameters, counted apart by the publisher
    source: str = ""
    note: str = ""

    def __post_init__(self):
        for n in ("stored", "active", "active_prefill", "engram"):
            v = getattr(self, n)
            if v is not None and (not isinstance(v, (int, float)) or v <= 0):
                raise ValueError(f"published.{n}: must be a positive number, got {v!r}")


@dataclass(kw_only=True)
class LayerConfig:
    """One layer: a token mixer, a channel mixer, a depth mixer, and what it shares."""

    token: Any
    channel: Any = None                 # None: no channel sublayer (a Mamba layer)
    depth: Any
    norms: str = "pre"                  # where the block's norms sit around each mixer (NORM_PLACES)
    lookup: Any = None                  # optional Engram, read beside the token mixer
    beside: Any = None                  # optional second token mixer on the same input, outputs summed
    cache_owner: int | None = None      # read this layer's cache instead of keeping one
    selection_owner: int | None = None  # reuse this layer's selection of entries

    def stores(self) -> dict[str, Any]:
        """The slots that hold a store, in block order."""
        return {s: getattr(self, s) for s in ("lookup", "token", "beside", "channel") if getattr(self, s) is not None}

    def n_norms(self) -> int:
        """The block's d_model-wide norms around its mixers (an Engram lookup's own norm not counted)."""
        if self.norms == "parallel":
            return 1
        n = NORM_PLACES[self.norms] * (1 if self.channel is None else 2)
        return n - 1 if self.channel is not None and self.channel.READS_STREAM else n  # its input norms its own

    def __post_init__(self):
        if self.norms not in NORM_PLACES:
            raise ValueError(f"norms: must be one of {', '.join(NORM_PLACES)}, got {self.norms!r}")
        if self.norms in ("parallel", "parallel_two") and self.channel is None:
            raise ValueError(f"norms: {self.norms!r} needs a channel mixer beside the token mixer (channel is None)")
        for slot in SLOTS + OPTIONAL_SLOTS:
            cfg = getattr(self, slot)
            if cfg is None and slot in MAY_BE_EMPTY:
                continue
            if not isinstance(cfg, StoreConfig) or not dataclasses.is_dataclass(cfg):
                raise ValueError(f"{slot}: expected a store config, got {type(cfg).__name__}")
            if slot not in cfg.SLOTS and not (slot == "beside" and "token" in cfg.SLOTS):
                raise ValueError(f"{slot}: a {cfg.KIND} store cannot fill the {slot} slot "
                                 f"(it fills: {', '.join(cfg.SLOTS)})")
        if self.norms not in ("pre", "sandwich") and self.channel is not None and self.channel.READS_STREAM:
            raise ValueError(f"norms: a {self.channel.KIND} channel store reads the stream itself; the block's "
                             f"norms must be 'pre' or 'sandwich', got {self.norms!r}")


@dataclass(kw_only=True)
class ModelConfig:
    """A model: embedding, a list of layers, final norm and LM head."""

    name: str
    d_model: int
    vocab_size: int
    layers: list[LayerConfig]
    title: str = ""
    context: int = 0                  # longest context the publisher supports (0: unstated)
    norm_eps: float = 1e-6
    norm_kind: str = "rms"            # the block norms' and the final norm's kind (NORM_KINDS)
    tie_embeddings: bool = False
    embed_scale: float = 1.0          # the embedding times this (Gemma: sqrt(d_model), in the activations' dtype)
    logit_scale: float = 1.0          # the logits times this (Cohere's logit_scale)
    logit_softcap: float | None = None  # cap * tanh(logits / cap) (Gemma 2's final_logit_softcapping)
    encoder_layers: int = 0           # V4.1-Flash: the first N layers form the causal encoder
    decoder_tail: int = 0             # prompt tokens that also pass through the decoder layers
    published: Published | None = None
    notes: str = ""

    def __post_init__(self):
        if not self.layers:
            raise ValueError("layers: the layer list is empty")
        for n in ("d_model", "vocab_size"):
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValueError(f"{n}: must be a positive integer, got {v!r}")
        if isinstance(self.norm_eps, bool) or not isinstance(self.norm_eps, (int, float)) or not self.norm_eps > 0:
            raise ValueError(f"norm_eps: must be a number > 0, got {self.norm_eps!r}")
        if self.norm_kind not in NORM_KINDS:
            raise ValueError(f"norm_kind: must be one of {', '.join(NORM_KINDS)}, got {self.norm_kind!r}")
        for n in ("embed_scale", "logit_scale"):
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise ValueError(f"{n}: must be a number > 0, got {v!r}")
        if self.logit_softcap is not None and (isinstance(self.logit_softcap, bool) or
                                               not isinstance(self.logit_softcap, (int, float)) or
                                               not self.logit_softcap > 0):
            raise ValueError(f"logit_softcap: must be None or a number > 0, got {self.logit_softcap!r}")
        for n in ("context", "encoder_layers", "decoder_tail"):
            v = getattr(self, n)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{n}: must be an integer >= 0, got {v!r}")
        n = len(self.layers)
        if not 0 <= self.encoder_layers < n:
            raise ValueError(f"encoder_layers: must be in [0, {n}), got {self.encoder_layers}")
        if self.decoder_tail < 0 or (self.decoder_tail and not self.encoder_layers):
            raise ValueError(f"decoder_tail: needs encoder_layers > 0 and must be >= 0, got {self.decoder_tail}")
        depth0 = self.layers[0].depth
        for i, lay in enumerate(self.layers):
            for slot in SLOTS + OPTIONAL_SLOTS:
                cfg = getattr(lay, slot)
                for inh in INHERITED:
                    want = getattr(self, inh)
                    if getattr(cfg, inh, None) not in (None, want):
                        raise ValueError(f"layer {i}: {slot}.{inh}: {getattr(cfg, inh)} != the model's {inh} {want}")
            if lay.depth != depth0:
                raise ValueError(f"layer {i}: depth: every layer must use the same depth mixer as layer 0")
            for what in ("cache_owner", "selection_owner"):
                j = getattr(lay, what)
                if j is None:
                    continue
                if not isinstance(j, int) or not 0 <= j <= i:
                    raise ValueError(f"layer {i}: {what}: must be a layer index in [0, {i}], got {j!r}")
                if j != i and getattr(self.layers[j], what) not in (None, j):
                    raise ValueError(f"layer {i}: {what}: layer {j} does not own its own (it reads layer "
                                     f"{getattr(self.layers[j], what)})")
                if self.layers[j].token.KIND != lay.token.KIND and what == "selection_owner":
                    raise ValueError(f"layer {i}: {what}: layer {j} is {self.layers[j].token.KIND}, "
                                     f"this layer is {lay.token.KIND}")
            if self.encoder_layers and lay.cache_owner is not None:
                j = lay.cache_owner
                if (i < self.encoder_layers) != (j < self.encoder_layers) and j != self.encoder_layers:
                    raise ValueError(f"layer {i}: cache_owner: layer {j} is on the other side of the encoder")

    # -- derived facts ------------------------------------------------------
    @property
    def n_layers(self) -> int:
        return len(self.layers)

    def owns_cache(self, i: int) -> bool:
        o = self.layers[i].cache_owner
        return o is None or o == i

    def mix(self) -> str:
        """The store mix of the token mixers, e.g. ``"60 window + 10 full"`` (full = ``attention``); a second mixer
        beside the first joins its label with "+" (``"36 full+mamba2"``: Falcon-H1)."""
        counts: dict[str, int] = {}
        for lay in self.layers:
            label = lay.token.MIX_LABEL or lay.token.KIND
            if lay.beside is not None:
                label += "+" + (lay.beside.MIX_LABEL or lay.beside.KIND)
            counts[label] = counts.get(label, 0) + 1
        return " + ".join(f"{c} {k}" for k, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    # -- (de)serialisation --------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The compact file form: named stores plus layer assignments (``from_dict`` inverts it).

        Three steps: the top-level facts; the assignments, one ``[[layers]]`` entry per (slot,
        store name) or (owner key, owner) with the layers that use it; the store tables, each
        without what it inherits from the model or what equals its default."""
        odd = next((i for i, lay in enumerate(self.layers)
                    if lay.channel is None or lay.norms != "pre" or lay.beside is not None), None)
        if self.norm_kind != "rms":
            raise ValueError(f"norm_kind: {self.norm_kind!r} has no compact file form yet (storelab save writes the "
                             "model whole)")
        if odd is not None:
            raise ValueError(f"layer {odd}: a layer without a channel mixer, with a second token mixer or with norms "
                             f"{self.layers[odd].norms!r} has no compact file form yet (storelab save writes the "
                             "model whole)")
        names = _StoreNames(getattr(self, "_store_names", []))  # the file's own names, when it came from one
        groups = self._assignments(names)
        return {**self._top_level(), "stores": self._store_tables(names),
                "layers": [{"at": compact_indices(idx, self.n_layers), key: val} for (key, val), idx in groups.items()]}

    def _top_level(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        for f in dataclasses.fields(self):
            if f.name in ("name", "layers", "published"):
                continue
            v = getattr(self, f.name)
            if v != f.default:
                out[f.name] = v
        out["n_layers"] = self.n_layers
        if self.published is not None:
            out["published"] = {k: v for k, v in dataclasses.asdict(self.published).items() if v not in (None, "")}
        return out

    def _assignments(self, names: "_StoreNames") -> dict[tuple[str, Any], list[int]]:
        groups: dict[tuple[str, Any], list[int]] = {}
        for i, lay in enumerate(self.layers):
            for slot in SLOTS + OPTIONAL_SLOTS:
                if getattr(lay, slot) is not None:
                    groups.setdefault((slot, names.name_of(getattr(lay, slot))), []).append(i)
            for what in ("cache_owner", "selection_owner"):
                derived = what == "selection_owner" and lay.token.SHARES_SELECTION  # the store's own rule says it
                if getattr(lay, what) is not None and not derived:
                    groups.setdefault((what, getattr(lay, what)), []).append(i)
        return groups

    def _store_tables(self, names: "_StoreNames") -> dict[str, dict[str, Any]]:
        stores = {}
        for nm, cfg in names.names:
            req = required_fields(type(cfg))
            defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
            # a None is written only where it is not the default (KDA's gate_lower_bound=None means
            # Kimi Linear's softplus gate, not the default bound); JSON keeps it as null
            stores[nm] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.to_dict().items()
                          if not (v is None and defaults.get(k, None) is None)
                          and not (k in INHERITED and k in req and v == getattr(self, k))
                          and not (k == LAYER_INDEX and nm in names.implicit)}
        return stores

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str = "<dict>") -> "ModelConfig":
        from storelab.models.parse import parse

        return parse(d, source)

    def save(self, path: str | Path) -> None:
        """Write the model as TOML (``.toml``) or JSON (any other suffix); a file of the caller's, so
        it is not listed in a folder manifest (``storelab.outputs``)."""
        from storelab.outputs import atomic_write

        path = Path(path)
        d = self.to_dict()
        atomic_write(path, dumps_toml(d) if path.suffix == ".toml" else json.dumps(d, indent=2) + "\n", record=False)


class _StoreNames:
    """Names for the distinct store configs of a model, in first-seen order: the file's own names
    where the config came from one, else the kind (``kda``, ``kda_2``, ...). A store with a
    ``layer_index`` equal to its per-layer ordinal is named once, without that field."""

    def __init__(self, known: list[tuple[str, Any]]):
        self.known = known
        self.names: list[tuple[str, Any]] = []  # (name, config)
        self.implicit: set[str] = set()          # names whose layer_index is the per-layer ordinal (left out)
        self._counted: list[Any] = []

    def name_of(self, cfg) -> str:
        key = cfg
        if LAYER_INDEX in {f.name for f in dataclasses.fields(cfg)}:
            base = dataclasses.replace(cfg, **{LAYER_INDEX: 0})
            if getattr(cfg, LAYER_INDEX) == sum(1 for c in self._counted if c == base):
                key = base
            self._counted.append(base)
        nm = next((n for n, x in self.names if x == key), None)
        if nm is None:
            nm = next((n for n, c in self.known if c == key and all(n != m for m, _ in self.names)), None)
            if nm is None:
                k, nm = 1, key.KIND
                while any(nm == n for n, _ in self.names):
                    k += 1
                    nm = f"{key.KIND}_{k}"
            self.names.append((nm, key))
            if key is not cfg:
                self.implicit.add(nm)
        return nm


# ---------------------------------------------------------------------------
# Reading files: storelab.models.parse (named steps); the names stay importable from here
# ---------------------------------------------------------------------------
def read_file(path: str | Path) -> dict[str, Any]:
    """The raw dict of a TOML or JSON model file, its ``extends`` resolved (``storelab.models.parse``)."""
    from storelab.models.parse import read_file as read

    return read(path)


def resolve_extends(d: dict[str, Any], source: str) -> dict[str, Any]:
    """Merge ``extends = "name"`` (``storelab.models.parse.resolve_extends``)."""
    from storelab.models.parse import resolve_extends as resolve

    return resolve(d, source)


def load_model(path: str | Path) -> ModelConfig:
    """Read and validate a model file (TOML or JSON). Errors name the file, layer and field."""
    from storelab.models.parse import load_model as load

    return load(path)


def required_fields(cls) -> set[str]:
    """Fields of a config dataclass without a default."""
    return {f.name for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}


def machine_bytes() -> int:
    """The machine's physical memory in bytes (0 where the platform does not say)."""
    import os

    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):  # pragma: no cover - platforms without sysconf
        return 0


def check_fits(cfg: ModelConfig, *, what: str, instead: str, bytes_per_param: float = 4.0) -> None:
    """Refuse, before anything is allocated, a model whose weights exceed half this machine's memory
    (a full-scale zoo model: hundreds of billions of parameters); ``instead`` says what to run."""
    from storelab.models.accounting import count_params

    n = count_params(cfg).stored
    need, have = n * bytes_per_param, machine_bytes()
    if have and need > have / 2:
        raise ValueError(f"{what}: {cfg.name} is full scale: {n / 1e9:,.1f}B parameters, {need / 2**30:,.0f} GiB of "
                         f"weights, more than half of this machine's {have / 2**30:,.0f} GiB; {instead}")
