"""Reading a model file: TOML or JSON text -> a validated ``ModelConfig``, in named steps.

``read_file`` parses the text and merges ``extends``; ``parse`` turns the dict into a
``ModelConfig``:

1. ``_check_top``      the top-level keys, ``n_layers`` and the layer list;
2. ``_assign``         each ``[[layers]]`` entry names a store (or an owner) per slot of
                       the layers it selects (``at``, ``pattern``); later entries win;
3. ``_build_stores``   each named store is built once from its table (stores with a
                       ``layer_index`` field are built per layer, in step 5);
4. ``_check_slots``    every store sits in a slot its config says it may fill
                       (``StoreConfig.SLOTS``): a depth store in a token slot, an FFN as
                       depth mixer, attention as a channel mixer are refused here;
5. ``_layers``         the ``LayerConfig`` of each layer, owners resolved;
6. ``_model``          the ``ModelConfig`` and its cross-layer checks.

Every error names the source, the layer and the field, e.g.
``my.toml: layer 5: token store 'mla' (mla): kv_lora_rank: must be > 0``.

``extends = "name"`` asks the registered resolvers (``register_extends``) for the file of
that name; the zoo registers its own when ``storelab.zoo`` is imported (``storelab``
imports it), so ``models/`` does not depend on the zoo.
"""

from __future__ import annotations

import copy
import dataclasses
import tomllib
from pathlib import Path
from typing import Any, Callable

from storelab.models.config import (INHERITED, LAYER_INDEX, OPTIONAL_SLOTS, SLOTS, LayerConfig, ModelConfig, Published,
                                    required_fields)
from storelab.files import parse_json, read_text
from storelab.models.fileformat import check_types, expand_indices

TOP_KEYS = {"name", "title", "d_model", "vocab_size", "n_layers", "context", "norm_eps", "tie_embeddings",
            "encoder_layers", "decoder_tail", "published", "notes", "stores", "layers", "extends"}
ENTRY_KEYS = {"at", "pattern", "token", "channel", "depth", "lookup", "beside", "cache_owner", "selection_owner"}
OWNERS = ("cache_owner", "selection_owner")
MAX_LAYERS = 10_000  # a guard: a layer list is built per layer, before any size is known
ALL_SLOTS = (*SLOTS, *OPTIONAL_SLOTS)

# -- extends: names -> files, from whoever registered a resolver (the zoo) ---------------------
_RESOLVERS: list[Callable[[str], Path]] = []


def register_extends(resolver: Callable[[str], Path]) -> None:
    """Add a resolver for ``extends = "name"``: it returns the file's path or raises ValueError."""
    if resolver not in _RESOLVERS:
        _RESOLVERS.append(resolver)


def _resolve_name(name: Any, source: str) -> Path:
    if not isinstance(name, str):
        raise ValueError(f"{source}: extends: must be a model name, got {name!r}")
    errors = []
    for resolve in _RESOLVERS:
        try:
            return resolve(name)
        except ValueError as e:
            errors.append(str(e))
    raise ValueError(f"{source}: extends: " + ("; ".join(errors) or f"no resolver knows {name!r} "
                                                "(import storelab.zoo, or register one with register_extends)"))


def read_file(path: str | Path) -> dict[str, Any]:
    """The raw dict of a TOML or JSON model file, its ``extends`` resolved."""
    path = Path(path)
    try:
        text = read_text(path, "a model file, TOML or JSON")  # a FIFO or a folder: refused before opening
    except OSError as e:
        raise ValueError(f"{path}: cannot read the file ({e.strerror})") from None
    try:
        d = tomllib.loads(text) if path.suffix == ".toml" else parse_json(text, path)
    except tomllib.TOMLDecodeError as e:
        raise ValueError(f"{path}: not valid TOML: {e}") from None
    except RecursionError:
        raise ValueError(f"{path}: TOML nested too deep to read") from None
    _need_table(d, str(path))
    return resolve_extends(d, str(path))


def _need_table(d: Any, source: str) -> None:
    if not isinstance(d, dict):
        raise ValueError(f"{source}: the model file must be a table (a JSON object {{...}}) at the top level, "
                         f"got {type(d).__name__}")
    for k, want in (("stores", dict), ("layers", list), ("published", dict)):
        if k in d and not isinstance(d[k], want):
            raise ValueError(f"{source}: {k}: must be {'a table' if want is dict else 'a list of tables'}, "
                             f"got {type(d[k]).__name__}")
    if any(not isinstance(e, dict) for e in d.get("layers", [])):
        bad = next(i for i, e in enumerate(d["layers"]) if not isinstance(e, dict))
        raise ValueError(f"{source}: layers[{bad}]: must be a table ([[layers]] with at = ..., token = ...), "
                         f"got {d['layers'][bad]!r}")


def resolve_extends(d: dict[str, Any], source: str) -> dict[str, Any]:
    """Merge ``extends = "name"``: stores updated per name, layers appended, the rest replaced."""
    _need_table(d, source)
    if "extends" not in d:
        return d
    out = copy.deepcopy(read_file(_resolve_name(d["extends"], source)))
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
    return parse(read_file(path), str(path))


# -- the steps ---------------------------------------------------------------------------------
def _registry():
    from storelab.stores import REGISTRY

    return REGISTRY


def _check_top(d: dict[str, Any], err) -> tuple[int, list[dict[str, Any]], dict[str, Any]]:
    unknown = sorted(set(d) - TOP_KEYS)
    if unknown:
        raise err(f"{unknown[0]}: unknown top-level key (known: {', '.join(sorted(TOP_KEYS))})")
    for k in ("name", "d_model", "vocab_size", "n_layers"):
        if k not in d:
            raise err(f"{k}: missing")
    n = d["n_layers"]
    if isinstance(n, bool) or not isinstance(n, int):
        raise err(f"n_layers: must be a positive integer, got {n!r}")
    if n <= 0:
        raise err(f"n_layers: must be a positive integer (the layer list is empty), got {n!r}")
    if n > MAX_LAYERS:
        raise err(f"n_layers: at most {MAX_LAYERS:,} (the deepest published models have about 100), got {n:,}")
    try:
        check_types(d, ModelConfig, skip=("layers", "published", "stores", "extends"))
    except ValueError as e:
        raise err(str(e)) from None
    try:
        check_types(d.get("published") or {}, Published)
    except ValueError as e:
        raise err(f"published.{e}") from None
    entries = d.get("layers", [])
    if not entries:
        raise err("layers: the layer list is empty (no [[layers]] assignments)")
    return n, entries, d.get("stores", {})


def _assign(entries: list[dict[str, Any]], n: int, raw_stores: dict[str, Any], err) -> list[dict[str, Any]]:
    """Per layer: slot -> store name, owner key -> layer index or "previous"."""
    slots: list[dict[str, Any]] = [{} for _ in range(n)]
    for k, e in enumerate(entries):
        where = f"layers[{k}]"
        bad = sorted(set(e) - ENTRY_KEYS)
        if bad:
            raise err(f"{where}.{bad[0]}: unknown key (known: {', '.join(sorted(ENTRY_KEYS))})")
        idx = expand_indices(e.get("at", "all"), n, err(f"{where}.at").args[0])
        pattern = e.get("pattern")
        if pattern is not None and (not isinstance(pattern, str) or not pattern):
            raise err(f"{where}.pattern: must be a non-empty string, got {pattern!r}")
        _check_letters(e, pattern, where, err)
        for pos, i in enumerate(idx):
            letter = pattern[pos % len(pattern)] if pattern else None
            for key in (*ALL_SLOTS, *OWNERS):
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
                if key in ALL_SLOTS and val not in raw_stores:
                    raise err(f"layer {i}: {key}: no store named {val!r} in [stores] "
                              f"(have: {', '.join(sorted(raw_stores)) or 'none'})")
                slots[i][key] = val
    return slots


def _check_letters(e: dict[str, Any], pattern: str | None, where: str, err) -> None:
    """A pattern needs a letter table to act on, and a letter table names only the pattern's letters."""
    tables = {k: v for k, v in e.items() if k in (*ALL_SLOTS, *OWNERS) and isinstance(v, dict)}
    if pattern is not None and not tables:
        raise err(f"{where}.pattern: {pattern!r} has no letter table to act on: every slot names one store, so the "
                  f"pattern would be ignored (write e.g. token = {{ {pattern[0]} = \"<store>\", ... }}, or drop it)")
    for k, table in tables.items():
        extra = sorted(set(table) - set(pattern or ""))
        if pattern and extra:
            raise err(f"{where}.{k}: letter {extra[0]!r} does not occur in pattern {pattern!r}")
    for key in OWNERS:
        vals = list(e[key].values()) if isinstance(e.get(key), dict) else [e[key]] if key in e else []
        for v in vals:
            if v != "previous" and (isinstance(v, bool) or not isinstance(v, int)):
                raise err(f"{where}.{key}: must be a layer index or \"previous\", got {v!r}")
    for key in ALL_SLOTS:
        vals = list(e[key].values()) if isinstance(e.get(key), dict) else [e[key]] if key in e else []
        for v in vals:
            if not isinstance(v, str):
                raise err(f"{where}.{key}: must name a store of [stores] (a string), got {v!r}")


def _first_use(slots: list[dict[str, Any]], nm: str) -> str:
    for i, s in enumerate(slots):
        for slot in ALL_SLOTS:
            if s.get(slot) == nm:
                return f"layer {i}: {slot} store {nm!r}"
    return f"stores.{nm}"


def _from_table(cls, sd: dict[str, Any]):
    return cls.from_dict(sd)  # lists become tuples where the field is one (StoreConfig.from_dict)


def _build_stores(d: dict[str, Any], raw_stores: dict[str, Any], slots, err):
    """Each named store built once: name -> config, and the tables of per-layer stores (``layer_index``)."""
    reg = _registry()
    built: dict[str, Any] = {}
    per_layer: dict[str, dict[str, Any]] = {}
    for nm, sd in raw_stores.items():
        if not isinstance(sd, dict):
            raise err(f"stores.{nm}: must be a table")
        sd = dict(sd)
        kind = sd.get("kind")
        if kind is None:
            raise err(f"{_first_use(slots, nm)}: kind: missing store kind")
        if not isinstance(kind, str):
            raise err(f"{_first_use(slots, nm)}: kind: must be a store kind name (a string), got {kind!r}")
        if kind not in reg:
            raise err(f"{_first_use(slots, nm)}: kind: unknown store kind {kind!r} (known: {', '.join(sorted(reg))})")
        for inh in INHERITED:
            if inh in required_fields(reg[kind]) and inh not in sd:
                sd[inh] = d[inh]
        if LAYER_INDEX in {f.name for f in dataclasses.fields(reg[kind])} and LAYER_INDEX not in sd:
            per_layer[nm] = sd  # built per layer in _layers
            sd = {**sd, LAYER_INDEX: 0}
        try:
            check_types(sd, reg[kind])
            built[nm] = _from_table(reg[kind], sd)
        except (ValueError, TypeError) as e:
            raise err(f"{_first_use(slots, nm)} ({kind}): {e}") from None
    return built, per_layer


def _check_slots(slots: list[dict[str, Any]], built: dict[str, Any], err) -> None:
    """Every store in a slot its config may fill; every layer has its three slots."""
    for i, s in enumerate(slots):
        for slot in SLOTS:
            if slot not in s:
                raise err(f"layer {i}: {slot}: no store assigned")
        for slot in ALL_SLOTS:
            if slot in s:
                cfg = built[s[slot]]
                if slot not in cfg.SLOTS:
                    raise err(f"layer {i}: {slot}: store {s[slot]!r} ({cfg.KIND}) cannot fill the {slot} slot; "
                              f"a {cfg.KIND} store fills: {', '.join(cfg.SLOTS)}")


def _layers(slots, built, per_layer, err) -> list[LayerConfig]:
    reg = _registry()
    ordinal: dict[str, int] = {}  # a per-layer store's layer_index: the layer's position among its users

    def store_for(i: int, slot: str) -> Any:
        nm = slots[i][slot]
        if nm not in per_layer:
            return built[nm]
        k = ordinal.get(nm, 0)
        ordinal[nm] = k + 1
        sd = per_layer[nm]
        try:
            return _from_table(reg[sd["kind"]], {**sd, LAYER_INDEX: k})
        except (ValueError, TypeError) as e:
            raise err(f"layer {i}: {slot} store {nm!r} ({sd['kind']}): {e}") from None

    layers: list[LayerConfig] = []
    for i, s in enumerate(slots):
        owners = {}
        for what in OWNERS:
            v = s.get(what)
            if v == "previous":
                v = next((j for j in range(i - 1, -1, -1)
                          if slots[j].get("token") == s["token"] and slots[j].get(what) in (None, j)), None)
                if v is None:
                    raise err(f"layer {i}: {what}: 'previous' but no earlier layer with store {s['token']!r} owns one")
            owners[what] = v
        stores = {slot: store_for(i, slot) for slot in ALL_SLOTS if slot in s}
        if owners["selection_owner"] is None:
            owners["selection_owner"] = _selection_owner(stores["token"], i, layers)
        try:
            layers.append(LayerConfig(**stores, **owners))
        except ValueError as e:
            raise err(f"layer {i}: {e}") from None
    return layers


def _selection_owner(token, i: int, earlier: list[LayerConfig]) -> int | None:
    """For a store whose layers share a selection (``SHARES_SELECTION``) and that does not select
    itself: the most recent earlier layer of the same kind that does."""
    if not token.SHARES_SELECTION or token.runs_indexer:
        return None
    for j in range(i - 1, -1, -1):
        t = earlier[j].token
        if t.KIND == token.KIND and t.runs_indexer:
            return j
    return None


def _model(d: dict[str, Any], layers: list[LayerConfig], built: dict[str, Any], err) -> ModelConfig:
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
    model._store_names = list(built.items())  # not a field: the file's names, for to_dict only
    return model


def parse(d: dict[str, Any], source: str = "<dict>") -> ModelConfig:
    """A validated ``ModelConfig`` from a model file's dict (see the module docstring for the steps)."""
    def err(msg: str) -> ValueError:
        return ValueError(f"{source}: {msg}")

    _need_table(d, source)
    n, entries, raw_stores = _check_top(d, err)
    slots = _assign(entries, n, raw_stores, err)
    built, per_layer = _build_stores(d, raw_stores, slots, err)
    _check_slots(slots, built, err)
    return _model(d, _layers(slots, built, per_layer, err), built, err)
