"""Accounting from the config alone (no weights allocated): parameters, and what each
layer keeps and reads at a context length L.

Everything here calls each store config's ``num_params()`` and ``footprint(L, dtype=)``
and adds up. Two model-level facts change the sums:

* a layer whose ``cache_owner`` is another layer keeps no cache of its own: the
  shared cache is counted once, at its owner (DeepSeek-V4.1-Flash's four caches);
* the encoder-decoder split changes the active parameters: a prompt token passes
  through the encoder (and the first decoder layer's token mixer, which writes the
  decoder's cache); a generated token passes through every layer and the LM head.

Per layer at context L (``layer_rows``): entries kept, entries read by the next
token, entries its indexer scores, state bytes (entries in ``dtype``) and their
average per token of context, the growth of the main cache per added token (the
"global cache per token", without windows, index keys and fixed states), and the
next token's read FLOPs. ``FORMATS`` gives the bytes per token for bf16, fp8, fp4.
Beside them, the two terms of ``storelab.models.memory_terms`` (caches in
``cache_dtype``, each store's published format when None, recurrent states in
``state_dtype``): ``bytes_per_token`` and ``bytes_per_sequence``; the totals row adds
``total_bytes`` for ``batch`` sequences at L.

Active parameters count the embedding and LM head matrices in full, as the
publishers' figures do (MiMo's 42B reproduces only that way).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from storelab.models.config import NORM_WIDTHS, ModelConfig

FORMATS = ("bf16", "fp8", "fp4")


# ---------------------------------------------------------------------------
# Parameters
# ---------------------------------------------------------------------------
@dataclass
class ParamAccount:
    """Parameters stored and active per token, split by where they sit."""

    stored: int
    active: int                  # per generated token
    active_prefill: int          # per prompt token (differs for an encoder-decoder)
    engram: int                  # Engram table rows (stored, counted apart by DeepSeek)
    by_part: dict[str, int] = field(default_factory=dict)  # stored, per part

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _depth_params(cfg: ModelConfig) -> tuple[int, int]:
    pc = cfg.layers[0].depth.num_params(n_sublayers=2 * cfg.n_layers)  # every mixer plus the head
    return pc.stored, pc.active


def count_params(cfg: ModelConfig) -> ParamAccount:
    """Parameters from the config alone (see the module docstring for the conventions)."""
    D, V = cfg.d_model, cfg.vocab_size
    emb = V * D
    head = 0 if cfg.tie_embeddings else V * D
    N = NORM_WIDTHS[cfg.norm_kind] * D  # one norm's parameters (a LayerNorm with a bias: 2D)
    parts = {"embedding": emb, "lm_head": head, "final_norm": N}
    stored = emb + head + N
    active = emb + head + N
    prefill = emb
    engram_rows = 0
    E = cfg.encoder_layers
    for i, lay in enumerate(cfg.layers):
        layer_stored = layer_active = lay.n_norms() * N
        for slot, st in lay.stores().items():
            pc = st.num_params()
            layer_stored += pc.stored
            layer_active += pc.active
            parts[slot + ":" + st.KIND] = parts.get(slot + ":" + st.KIND, 0) + pc.stored
            if slot == "lookup":
                engram_rows += st.table_params()
                layer_stored += N  # its own norm in the block
                layer_active += N
        stored += layer_stored
        active += layer_active
        if E and i < E:
            prefill += layer_active
        elif E and i == E:
            prefill += lay.token.num_params().active + N
    parts["norms"] = (sum(lay.n_norms() for lay in cfg.layers) + 1) * N
    ds, da = _depth_params(cfg)
    stored += ds
    active += da
    parts["depth:" + cfg.layers[0].depth.KIND] = ds
    if E:  # the mixers around the encoder's sublayers and the first decoder layer's token sublayer
        one = cfg.layers[0].depth.num_params().active
        prefill += one * (2 * E + 1)
    else:
        prefill = active
    return ParamAccount(stored=stored, active=active, active_prefill=prefill, engram=engram_rows, by_part=parts)


def compare_published(cfg: ModelConfig, pa: ParamAccount | None = None) -> dict[str, Any]:
    """Our counts beside the publisher's, with ratios (None where the publisher gives none)."""
    pa = pa or count_params(cfg)
    pub = cfg.published
    out: dict[str, Any] = {"stored": pa.stored, "active": pa.active,
                           "active_without_embedding": pa.active - pa.by_part["embedding"] - pa.by_part["lm_head"]}
    if pa.engram:
        out["stored_without_engram"] = pa.stored - pa.engram
        out["engram"] = pa.engram
    if cfg.encoder_layers:
        out["active_prefill"] = pa.active_prefill
    if pub is None:
        return out
    base = pa.stored - pa.engram if pub.engram else pa.stored
    out["published_stored"] = pub.stored
    out["published_active"] = pub.active
    out["stored_ratio"] = base / pub.stored if pub.stored else None
    out["active_ratio"] = pa.active / pub.active if pub.active else None
    if pub.engram:
        out["published_engram"] = pub.engram
        out["engram_ratio"] = pa.engram / pub.engram
    if pub.active_prefill:
        out["published_active_prefill"] = pub.active_prefill
        out["active_prefill_ratio"] = pa.active_prefill / pub.active_prefill
    out["published_note"] = pub.note
    return out


# ---------------------------------------------------------------------------
# What each layer keeps and reads
# ---------------------------------------------------------------------------
def cache_entry_bytes(st, fmt: str) -> float:
    """Bytes of one main cache entry (key and value, no indexer key) in entry format ``fmt``:
    what the store's config says (``StoreConfig.cache_entry_bytes``); 0 for a store that keeps
    no entry per token."""
    return st.cache_entry_bytes(fmt)


def _kept_growth(st, L: int) -> float:
    return (st.footprint(2 * L).kept - st.footprint(L).kept) / L


def _growth(st, L: int, dtype: str) -> float:
    """Bytes the layer's state grows per added token, measured between L and 2L."""
    a = st.footprint(L, dtype=dtype).state_bytes
    b = st.footprint(2 * L, dtype=dtype).state_bytes
    return (b - a) / L


def layer_rows(cfg: ModelConfig, context: int, *, dtype: str = "bf16", cache_dtype: str | None = None,
               state_dtype: str = "fp32") -> list[dict[str, Any]]:
    """One row per layer: kept, read, scored, bytes, bytes per token and per sequence, read FLOPs."""
    from storelab.models.memory_terms import layer_terms

    if context <= 0:
        raise ValueError(f"context: must be > 0, got {context}")
    rows = []
    terms = layer_terms(cfg, cache=cache_dtype, state=state_dtype)
    for i, lay in enumerate(cfg.layers):
        st = lay.token
        fp = st.footprint(context, dtype=dtype)
        owns = cfg.owns_cache(i)
        extra = sum(s.footprint(context, dtype=dtype).state_bytes for k, s in lay.stores().items() if k != "token")
        state = fp.state_bytes if owns else 0
        row = {
            "model": cfg.name, "layer": i, "kind": st.KIND,
            "kept": fp.kept, "read": fp.read, "scored": fp.scored,
            "state_bytes": state,
            "average_bytes_per_token": state / context,
            "bytes_per_token": terms[i]["bytes_per_token"],
            "bytes_per_sequence": terms[i]["bytes_per_sequence"],
            "cache_bytes_per_token": terms[i]["cache_bytes_per_token"],
            "formats": terms[i]["formats"], "token_format": terms[i]["token_format"],
            "growth_bytes_per_token": _growth(st, context, dtype) if owns else 0.0,
            "bytes_per_token_by_format": {f: (st.footprint(context, dtype=f).state_bytes / context if owns else 0.0)
                                          for f in FORMATS},
            "cache_entry_bytes": cache_entry_bytes(st, dtype),
            "global_bytes_per_token": _kept_growth(st, context) * cache_entry_bytes(st, dtype) if owns else 0.0,
            "global_bytes_per_token_by_format": {
                f: _kept_growth(st, context) * cache_entry_bytes(st, f) if owns else 0.0 for f in FORMATS},
            "read_flops": fp.read_flops,
            "other_state_bytes": extra,  # lookup / channel mixers (Engram's last ids)
            "cache_owner": lay.cache_owner if lay.cache_owner is not None else i,
            "selection_owner": lay.selection_owner if lay.selection_owner is not None else i,
            "channel": lay.channel.KIND if lay.channel is not None else "",
            "note": fp.note if owns else f"reads layer {lay.cache_owner}'s cache (counted there)",
        }
        if cfg.encoder_layers:
            row["part"] = "encoder" if i < cfg.encoder_layers else "decoder"
        rows.append(row)
    return rows


def model_totals(cfg: ModelConfig, rows: list[dict[str, Any]], context: int, *, dtype: str = "bf16",
                 cache_dtype: str | None = None, state_dtype: str = "fp32", batch: int = 1) -> dict[str, Any]:
    """Per-model sums of the layer rows (shared caches counted once: readers hold 0)."""
    from storelab.models.memory_terms import model_terms

    tot = {
        "model": cfg.name, "layer": "total", "kind": "total", "context": context, "dtype": dtype,
        "cache_dtype": cache_dtype or "published", "state_dtype": state_dtype,
        "kept": sum(r["kept"] for r in rows if cfg.owns_cache(r["layer"])),
        "read": sum(r["read"] for r in rows),
        "scored": sum(r["scored"] for r in rows),
        "state_bytes": sum(r["state_bytes"] + r["other_state_bytes"] for r in rows),
        "average_bytes_per_token": sum(r["state_bytes"] + r["other_state_bytes"] for r in rows) / context,
        **model_terms(cfg, rows, context, batch=batch),
        "growth_bytes_per_token": sum(r["growth_bytes_per_token"] for r in rows),
        "bytes_per_token_by_format": {f: sum(r["bytes_per_token_by_format"][f] for r in rows) for f in FORMATS},
        "global_bytes_per_token": sum(r["global_bytes_per_token"] for r in rows),
        "global_bytes_per_token_by_format": {f: sum(r["global_bytes_per_token_by_format"][f] for r in rows)
                                             for f in FORMATS},
        "read_flops": sum(r["read_flops"] for r in rows),
        "layers": cfg.n_layers, "mix": cfg.mix(),
    }
    return tot


def memory_report(cfg: ModelConfig, context: int, *, dtype: str = "bf16", cache_dtype: str | None = None,
                  state_dtype: str = "fp32", batch: int = 1) -> list[dict[str, Any]]:
    """The layer rows followed by the model's totals row (the ``storelab memory --json`` records)."""
    kw = dict(dtype=dtype, cache_dtype=cache_dtype, state_dtype=state_dtype)
    rows = layer_rows(cfg, context, **kw)
    return rows + [model_totals(cfg, rows, context, batch=batch, **kw)]


def kind_summary(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Layer rows grouped by (kind, kept, read, scored, owner or not): what a table for people shows."""
    groups: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        if r["layer"] == "total":
            continue
        shared = r["cache_owner"] != r["layer"]
        key = (r["kind"], r["kept"], r["read"], r["scored"], shared, r.get("part", ""))
        g = groups.setdefault(key, {"kind": r["kind"], "layers": [], "kept": r["kept"], "read": r["read"],
                                    "scored": r["scored"], "shared": shared, "part": r.get("part", ""),
                                    "bytes_per_token": 0.0, "bytes_per_sequence": 0.0, "average_bytes_per_token": 0.0,
                                    "cache_bytes_per_token": 0.0, "growth_bytes_per_token": 0.0, "read_flops": 0})
        g["layers"].append(r["layer"])
        for k in ("bytes_per_token", "bytes_per_sequence", "average_bytes_per_token", "cache_bytes_per_token"):
            g[k] += r[k]
        g["growth_bytes_per_token"] += r["growth_bytes_per_token"]
        g["read_flops"] += r["read_flops"]
    return list(groups.values())


def analytic_state_bytes(cfg: ModelConfig, seen: list[int], *, dtype: str = "fp32",
                         own_copies: tuple[int, ...] | list[int] = ()) -> dict[str, int]:
    """Analytic state bytes per store kind, each layer at its own token count ``seen[i]``
    (decoder layers of an encoder-decoder see fewer tokens than the encoder).

    A store with a ``cache_format`` of its own is accounted in that format; ``own_copies``
    lists the readers of a shared cache that hold a copy at run time (``Model.unshared``).
    """
    out: dict[str, int] = {}
    for i, lay in enumerate(cfg.layers):
        n = seen[i]
        if n <= 0:
            continue
        for slot, st in lay.stores().items():
            if slot == "token" and not cfg.owns_cache(i) and i not in own_copies:
                continue
            b = st.footprint(n, dtype=st.cache_format or dtype).state_bytes
            if b or slot == "token":
                out[st.KIND] = out.get(st.KIND, 0) + b
    return out
