"""Models as data: a model is a list of layer configs, each with three slots.

A layer (essay section 1) is "normalize -> mix tokens -> combine, normalize -> mix
channels -> combine". Its config names one store per slot:

* ``token``   - the token mixer (attention, window, kda, mla, dsa, msa, csa, ...);
* ``channel`` - the channel mixer (ffn, moe);
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

import copy
import dataclasses
import json
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from storelab.models.fileformat import compact_indices, dumps_toml, expand_indices

SLOTS = ("token", "channel", "depth")
OPTIONAL_SLOTS = ("lookup",)  # Engram beside the token mixer (V4.1-Flash layers 1 and 14)
INHERITED = ("d_model", "vocab_size")  # store fields that default to the model's value
MIX_LABELS = {"attention": "full"}  # how ``mix()`` names a kind
LAYER_INDEX = "layer_index"  # filled per layer: the layer's position among those using the store
_TOP = {"name", "title", "d_model", "vocab_size", "n_layers", "context", "norm_eps", "tie_embeddings",
        "encoder_layers", "decoder_tail", "published", "notes", "stores", "layers", "extends"}
_ENTRY = {"at", "pattern", "token", "channel", "depth", "lookup", "cache_owner", "selection_owner"}


def _registry():
    from storelab.stores import REGISTRY

    return REGISTRY


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
    channel: Any
    depth: Any
    lookup: Any = None                  # optional Engram, read beside the token mixer
    cache_owner: int | None = None      # read this layer's cache instead of keeping one
    selection_owner: int | None = None  # reuse this layer's selection of entries

    def stores(self) -> dict[str, Any]:
        """The slots that hold a store, in block order."""
        return {s: getattr(self, s) for s in ("lookup", "token", "channel") if getattr(self, s) is not None}

    def __post_init__(self):
        for slot in SLOTS + OPTIONAL_SLOTS:
            cfg = getattr(self, slot)
            if cfg is None and slot in OPTIONAL_SLOTS:
                continue
            if not hasattr(cfg, "KIND") or not dataclasses.is_dataclass(cfg):
                raise ValueError(f"{slot}: expected a store config, got {type(cfg).__name__}")


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
    tie_embeddings: bool = False
    encoder_layers: int = 0           # V4.1-Flash: the first N layers form the causal encoder
    decoder_tail: int = 0             # prompt tokens that also pass through the decoder layers
    published: Published | None = None
    notes: str = ""

    def __post_init__(self):
        if not self.layers:
            raise ValueError("layers: the layer list is empty")
        for n in ("d_model", "vocab_size"):
            if not isinstance(getattr(self, n), int) or getattr(self, n) <= 0:
                raise ValueError(f"{n}: must be a positive integer, got {getattr(self, n)!r}")
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
        """The store mix of the token mixers, e.g. ``"60 window + 10 full"`` (full = ``attention``)."""
        counts: dict[str, int] = {}
        for lay in self.layers:
            label = MIX_LABELS.get(lay.token.KIND, lay.token.KIND)
            counts[label] = counts.get(label, 0) + 1
        return " + ".join(f"{c} {k}" for k, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))

    # -- (de)serialisation --------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """The compact file form: named stores plus layer assignments (``from_dict`` inverts it)."""
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
        names: list[tuple[str, Any]] = []  # (name, config), first-seen order
        known = getattr(self, "_store_names", [])  # the names the file used, when it came from one
        implicit: set[str] = set()  # names whose layer_index is the per-layer ordinal (left out)

        def name_of(cfg) -> str:
            key = cfg
            if hasattr(cfg, LAYER_INDEX):
                base = dataclasses.replace(cfg, **{LAYER_INDEX: 0})
                if getattr(cfg, LAYER_INDEX) == sum(1 for c in counted if c == base):
                    key = base
                counted.append(base)
            nm = _find(key)
            if nm is None:
                nm = next((n for n, c in known if c == key and all(n != m for m, _ in names)), None)
                if nm is None:
                    k, nm = 1, key.KIND
                    while any(nm == n for n, _ in names):
                        k += 1
                        nm = f"{key.KIND}_{k}"
                names.append((nm, key))
                if key is not cfg:
                    implicit.add(nm)
            return nm

        counted: list[Any] = []

        def _find(c) -> str | None:
            return next((n for n, x in names if x == c), None)

        groups: dict[tuple[str, Any], list[int]] = {}
        for i, lay in enumerate(self.layers):
            for slot in SLOTS + OPTIONAL_SLOTS:
                if getattr(lay, slot) is not None:
                    groups.setdefault((slot, name_of(getattr(lay, slot))), []).append(i)
            for what in ("cache_owner", "selection_owner"):
                derived = what == "selection_owner" and getattr(lay.token, "runs_indexer", None) is not None
                if getattr(lay, what) is not None and not derived:
                    groups.setdefault((what, getattr(lay, what)), []).append(i)
        stores = {}
        for nm, cfg in names:
            req = _required(type(cfg))
            defaults = {f.name: f.default for f in dataclasses.fields(cfg)}
            # a None is written only where it is not the default (KDA's gate_lower_bound=None means
            # Kimi Linear's softplus gate, not the default bound); JSON keeps it as null
            stores[nm] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.to_dict().items()
                          if not (v is None and defaults.get(k, None) is None)
                          and not (k in INHERITED and k in req and v == getattr(self, k))
                          and not (k == LAYER_INDEX and nm in implicit)}
        out["stores"] = stores
        out["layers"] = [{"at": compact_indices(idx, self.n_layers), key: val} for (key, val), idx in groups.items()]
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, source: str = "<dict>") -> "ModelConfig":
        return _parse(d, source)

    def save(self, path: str | Path) -> None:
        """Write the model as TOML (``.toml``) or JSON (any other suffix)."""
        path = Path(path)
        d = self.to_dict()
        path.write_text(dumps_toml(d) if path.suffix == ".toml" else json.dumps(d, indent=2) + "\n")


# ---------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------
def read_file(path: str | Path) -> dict[str, Any]:
    """The raw dict of a TOML or JSON model file, its ``extends`` resolved."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ValueError(f"{path}: cannot read the file ({e.strerror})") from None
    try:
        d = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not valid {'TOML' if path.suffix == '.toml' else 'JSON'}: {e}") from None
    return resolve_extends(d, str(path))


def resolve_extends(d: dict[str, Any], source: str) -> dict[str, Any]:
    """Merge ``extends = "zoo-name"``: stores updated per name, layers appended, the rest replaced."""
    if "extends" not in d:
        return d
    from storelab.zoo import zoo_path

    try:
        base_path = zoo_path(d["extends"])
    except ValueError as e:
        raise ValueError(f"{source}: extends: {e}") from None
    base = read_file(base_path)
    out = copy.deepcopy(base)
    for k, v in d.items():
        if k == "extends":
            continue
        if k == "stores":
            for nm, sd in v.items():
                if "kind" in sd and sd["kind"] != out.get("stores", {}).get(nm, {}).get("kind"):
                    out.setdefault("stores", {})[nm] = dict(sd)  # a new kind replaces the whole store
                else:
                    out.setdefault("stores", {}).setdefault(nm, {}).update(sd)
        elif k == "layers":
            out["layers"] = list(out.get("layers", [])) + list(v)
        elif k == "published" and isinstance(v, dict):
            out["published"] = v
        else:
            out[k] = v
    return out


def load_model(path: str | Path) -> ModelConfig:
    """Read and validate a model file (TOML or JSON). Errors name the file, layer and field."""
    return _parse(read_file(path), str(path))


def _selection_owner(token, i: int, earlier: list[LayerConfig]) -> int | None:
    """For a store that says whether it runs its own indexer (dsa IndexShare, hierarchical):
    the most recent earlier layer of the same kind that does, when this one does not."""
    runs = getattr(token, "runs_indexer", None)
    if runs is None or runs:
        return None
    for j in range(i - 1, -1, -1):
        t = earlier[j].token
        if t.KIND == token.KIND and getattr(t, "runs_indexer", False):
            return j
    return None


def _required(cls) -> set[str]:
    """Fields of a config dataclass without a default."""
    return {f.name for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}


def _coerce(cls, sd: dict[str, Any]) -> dict[str, Any]:
    """TOML/JSON give lists where a config wants a tuple: convert those fields."""
    out = dict(sd)
    for f in dataclasses.fields(cls):
        if isinstance(out.get(f.name), list) and "tuple" in str(f.type):
            out[f.name] = tuple(out[f.name])
    return out


def _parse(d: dict[str, Any], source: str) -> ModelConfig:
    def err(msg: str) -> ValueError:
        return ValueError(f"{source}: {msg}")

    unknown = sorted(set(d) - _TOP)
    if unknown:
        raise err(f"{unknown[0]}: unknown top-level key (known: {', '.join(sorted(_TOP))})")
    for k in ("name", "d_model", "vocab_size", "n_layers"):
        if k not in d:
            raise err(f"{k}: missing")
    n = d["n_layers"]
    if not isinstance(n, int) or n <= 0:
        raise err(f"n_layers: must be a positive integer (the layer list is empty), got {n!r}")
    entries = d.get("layers", [])
    if not entries:
        raise err("layers: the layer list is empty (no [[layers]] assignments)")
    raw_stores = d.get("stores", {})
    reg = _registry()

    # 1. assign store names to every layer slot
    slots: list[dict[str, Any]] = [{} for _ in range(n)]
    for k, e in enumerate(entries):
        where = f"layers[{k}]"
        bad = sorted(set(e) - _ENTRY)
        if bad:
            raise err(f"{where}.{bad[0]}: unknown key (known: {', '.join(sorted(_ENTRY))})")
        idx = expand_indices(e.get("at", "all"), n, err(f"{where}.at").args[0])
        pattern = e.get("pattern")
        if pattern is not None and (not isinstance(pattern, str) or not pattern):
            raise err(f"{where}.pattern: must be a non-empty string, got {pattern!r}")
        for pos, i in enumerate(idx):
            letter = pattern[pos % len(pattern)] if pattern else None
            for key in (*SLOTS, *OPTIONAL_SLOTS, "cache_owner", "selection_owner"):
                if key not in e:
                    continue
                val = e[key]
                if isinstance(val, dict):
                    if letter is None:
                        raise err(f"{where}.{key}: a letter table needs a pattern")
                    if letter not in val:
                        continue  # this letter leaves the slot as it was
                    val = val[letter]
                if key in OPTIONAL_SLOTS and val in ("", "none"):
                    slots[i].pop(key, None)
                    continue
                if key in SLOTS + OPTIONAL_SLOTS and val not in raw_stores:
                    raise err(f"layer {i}: {key}: no store named {val!r} in [stores] "
                              f"(have: {', '.join(sorted(raw_stores)) or 'none'})")
                slots[i][key] = val

    # 2. build each named store once; errors name the first layer that uses it
    def first_use(nm: str) -> str:
        for i, s in enumerate(slots):
            for slot in SLOTS + OPTIONAL_SLOTS:
                if s.get(slot) == nm:
                    return f"layer {i}: {slot} store {nm!r}"
        return f"stores.{nm}"

    built: dict[str, Any] = {}
    ordinal: dict[str, int] = {}  # stores with a ``layer_index`` field get it per layer (see below)
    raw_by_name: dict[str, dict[str, Any]] = {}
    for nm, sd in raw_stores.items():
        if not isinstance(sd, dict):
            raise err(f"stores.{nm}: must be a table")
        sd = dict(sd)
        kind = sd.get("kind")
        if kind is None:
            raise err(f"{first_use(nm)}: kind: missing store kind")
        if kind not in reg:
            raise err(f"{first_use(nm)}: kind: unknown store kind {kind!r} (known: {', '.join(sorted(reg))})")
        for inh in INHERITED:
            if inh in _required(reg[kind]) and inh not in sd:
                sd[inh] = d[inh]
        if LAYER_INDEX in {f.name for f in dataclasses.fields(reg[kind])} and LAYER_INDEX not in sd:
            raw_by_name[nm] = sd  # built per layer in step 3
            sd = {**sd, LAYER_INDEX: 0}
        try:
            built[nm] = reg[kind].from_dict(_coerce(reg[kind], sd))
        except (ValueError, TypeError) as e:
            raise err(f"{first_use(nm)} ({kind}): {e}") from None

    def store_for(i: int, slot: str) -> Any:
        nm = slot_names[i][slot]
        if nm not in raw_by_name:
            return built[nm]
        k = ordinal.get(nm, 0)  # this layer's position among the layers that use the store
        ordinal[nm] = k + 1
        sd = raw_by_name[nm]
        try:
            return reg[sd["kind"]].from_dict(_coerce(reg[sd["kind"]], {**sd, LAYER_INDEX: k}))
        except (ValueError, TypeError) as e:
            raise err(f"layer {i}: {slot} store {nm!r} ({sd['kind']}): {e}") from None

    # 3. the layer configs
    slot_names = slots
    layers = []
    for i, s in enumerate(slots):
        for slot in SLOTS:
            if slot not in s:
                raise err(f"layer {i}: {slot}: no store assigned")
        owners = {}
        for what in ("cache_owner", "selection_owner"):
            v = s.get(what)
            if v == "previous":
                v = next((j for j in range(i - 1, -1, -1)
                          if slots[j].get("token") == s["token"] and slots[j].get(what) in (None, j)), None)
                if v is None:
                    raise err(f"layer {i}: {what}: 'previous' but no earlier layer with store {s['token']!r} owns one")
            owners[what] = v
        stores = {slot: store_for(i, slot) for slot in (*SLOTS, *OPTIONAL_SLOTS) if slot in s}
        if owners["selection_owner"] is None:
            owners["selection_owner"] = _selection_owner(stores["token"], i, layers)
        try:
            layers.append(LayerConfig(**stores, **owners))
        except ValueError as e:
            raise err(f"layer {i}: {e}") from None
    pub = d.get("published")
    try:
        published = Published(**pub) if pub is not None else None
    except TypeError as e:
        raise err(f"published: {e}") from None
    except ValueError as e:
        raise err(str(e)) from None
    kw = {k: d[k] for k in ("title", "context", "norm_eps", "tie_embeddings", "encoder_layers", "decoder_tail", "notes")
          if k in d}
    try:
        model = ModelConfig(name=d["name"], d_model=d["d_model"], vocab_size=d["vocab_size"], layers=layers,
                            published=published, **kw)
    except ValueError as e:
        raise err(str(e)) from None
    model._store_names = [(nm, c) for nm, c in built.items()]  # not a field: names for to_dict only
    return model
