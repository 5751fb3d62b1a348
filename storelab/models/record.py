"""One model as data: layers, store mix, depth mixer, sharing, parameters beside the publisher's
(what ``storelab models --json`` prints and the report's section 2 tabulates)."""

from __future__ import annotations


def model_record(cfg) -> dict:
    """One model as data: layers, store mix, depth mixer, sharing, parameters beside the publisher's."""
    from storelab.models.accounting import compare_published, count_params

    pa = count_params(cfg)
    rec = {
        "name": cfg.name, "title": cfg.title or cfg.name, "layers": cfg.n_layers, "mix": cfg.mix(),
        "depth": cfg.layers[0].depth.KIND, "d_model": cfg.d_model, "vocab_size": cfg.vocab_size,
        "channel_mix": _slot_mix(cfg, "channel"),
        "experts": _experts(cfg),
        "shared_caches": sorted({lay.cache_owner for lay in cfg.layers if lay.cache_owner is not None}),
        "encoder_layers": cfg.encoder_layers,
        "context": cfg.context,
        "params": compare_published(cfg, pa),
    }
    return rec


def _experts(cfg) -> str:
    """Experts chosen / available per token, as the essay's table says it ("6 / 384, plus 1 shared")."""
    moes = {m.experts_per_token() for m in (lay.channel for lay in cfg.layers if lay.channel is not None)
            if m.experts_per_token() is not None}
    out = []
    for k, e, s in sorted(moes):
        out.append(f"{k} / {e}" + (f", plus {s} shared" if s else ""))
    return "; ".join(out)


EMPTY_SLOT = "none"  # a layer with no store in the slot (Mamba's and Nemotron-H's layers hold no channel mixer)


def _slot_mix(cfg, slot: str) -> str:
    """The stores of one slot over the layers, e.g. ``"56 ffn + 62 none"`` (``EMPTY_SLOT``: the slot left empty)."""
    counts: dict[str, int] = {}
    for lay in cfg.layers:
        store = getattr(lay, slot)
        k = EMPTY_SLOT if store is None else store.KIND
        counts[k] = counts.get(k, 0) + 1
    return " + ".join(f"{c} {k}" for k, c in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
