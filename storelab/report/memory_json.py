"""``storelab memory --json``: one document, one meaning per field (schema: docs/memory.schema.json).

The document is ``{"schema": ..., "schema_version": 3, "models": [record, ...]}``; a record is one
model at context ``L`` for ``batch`` sequences, every byte figure in the formats asked for (caches in
``cache_format``, each store's published one when "published"; recurrent states and open pools in
``state_format``)::

    bytes_per_token        per sequence, per token of context: caches, index keys, compressed entries
    cache_bytes_per_token  of bytes_per_token, the main cache entries alone (the "global cache")
    bytes_per_sequence     per sequence, what does not grow, as held at L (rings and pools fill with
                           the first tokens: at L = 3 a window of 128 holds 3 entries)
    bytes_per_sequence_full  the same at its fullest (L past every window): what --budget plans with
    total_bytes            batch * (bytes_per_token * L + bytes_per_sequence): what is held at L

Each layer has the same fields (its part: a layer whose cache another owns holds 0), and the
``total`` is their sum, so that a part never exceeds its total. ``kept``, ``read``, ``scored`` are
entries (batch 1), ``read_flops`` the next token's reading cost. The text table
(``storelab.report.memory_text``) prints these same numbers.

Version 3 (this one) adds the engine (``--engine``, ``storelab.models.engines``): the record's
``engine`` (its name, the cache and state formats it keeps, its settings, ``total_bytes`` for the batch at
L) and per
layer ``engine_bytes`` and ``engine_rule`` (the rule applied, with its numbers). With the default engine,
"ideal", ``engine_bytes`` is the layer's ``total_bytes``.

Version 2 replaced the rows of version 1 (a list of layer rows and a totals row, no
version): ``state_bytes``, ``average_bytes_per_token`` and the ``*_by_format`` maps were in one fixed
format whatever was asked (bf16 unless ``--dtype``), ``global_bytes_per_token`` is
``cache_bytes_per_token``, ``growth_bytes_per_token`` is ``bytes_per_token``, ``dtype`` /
``cache_dtype`` / ``state_dtype`` are ``cache_format`` / ``state_format``, and ``total_bytes`` no
longer counts open pools and rings full at a short L.
"""

from __future__ import annotations

from typing import Any

SCHEMA = "docs/memory.schema.json"
SCHEMA_VERSION = 3
BYTE_FIELDS = ("bytes_per_token", "cache_bytes_per_token", "bytes_per_sequence", "bytes_per_sequence_full",
               "total_bytes")
COUNT_FIELDS = ("kept", "read", "scored", "read_flops")


def memory_record(cfg, context: int, *, cache: str | None, state: str, batch: int,
                  engine: str = "ideal", engine_state: str | None = None,
                  engine_settings: dict[str, Any] | None = None) -> dict[str, Any]:
    """One model at ``context`` for ``batch`` sequences: its layers and their total, and what ``engine``
    allocates for them (module docstring)."""
    from storelab.models.accounting import layer_rows
    from storelab.models.engines import engine_cache_format, engine_layers, engine_state_format
    from storelab.models.memory_terms import layer_terms

    if context <= 0 or batch <= 0:
        raise ValueError(f"context, batch: must be > 0, got {context}, {batch}")
    terms = layer_terms(cfg, cache=cache, state=state, context=context)
    eng_state = engine_state or state
    eng = engine_layers(cfg, context, batch=batch, engine=engine, cache=cache, state=eng_state,
                        **(engine_settings or {}))
    layers = []
    for row, t in zip(layer_rows(cfg, context), terms):
        lay = {"layer": row["layer"], "kind": row["kind"], "channel": row["channel"],
               "cache_owner": row["cache_owner"], "selection_owner": row["selection_owner"],
               "formats": t["formats"], "token_format": t["token_format"],
               **{k: t[k] for k in BYTE_FIELDS if k != "total_bytes"},
               "total_bytes": batch * (t["bytes_per_token"] * context + t["bytes_per_sequence"]),
               "kept": row["kept"] if cfg.owns_cache(row["layer"]) else 0,
               "read": row["read"], "scored": row["scored"], "read_flops": row["read_flops"], "note": row["note"]}
        if "part" in row:
            lay["part"] = row["part"]
        e = eng["layers"][row["layer"]]
        lay["engine_bytes"], lay["engine_rule"] = e["bytes"], e["rule"]
        layers.append(lay)
    total = {k: sum(lay[k] for lay in layers) for k in (*BYTE_FIELDS, *COUNT_FIELDS)}
    total["total_bytes"] = batch * (total["bytes_per_token"] * context + total["bytes_per_sequence"])
    return {"model": cfg.name, "context": context, "batch": batch, "cache_format": cache or "published",
            "state_format": state,
            "engine": {"name": engine,
                       "cache_format": engine_cache_format(engine, cache, (engine_settings or {}).get("model_dtype")),
                       "state_format": engine_state_format(engine, eng_state), "settings": eng["settings"],
                       "total_bytes": eng["total_bytes"]},
            "layers": layers, "total": {**total, "layers": cfg.n_layers, "mix": cfg.mix()}}


def budget_record(total: dict[str, Any], *, budget: int, weights_format: str, stored: int,
                  batches: list[int]) -> dict[str, Any]:
    """What fits in ``budget`` bytes beside the weights: the longest context per batch size, planned with
    the fixed part at its fullest."""
    from storelab.models.memory_terms import longest_contexts, weight_bytes

    w = weight_bytes(stored, weights_format)
    return {"budget_bytes": budget, "weights_format": weights_format, "weights_bytes": w, "stored_params": stored,
            "longest_context": longest_contexts(total["bytes_per_token"], total["bytes_per_sequence_full"],
                                                budget=budget, weights=w, batches=batches)}


def memory_document(records: list[dict[str, Any]]) -> dict[str, Any]:
    return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, "models": records}
