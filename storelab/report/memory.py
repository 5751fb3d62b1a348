"""Sections 2 and 3 of the report: the seven models, and where a million-token prompt goes."""

from __future__ import annotations

from pathlib import Path

from storelab.outputs import atomic_path
from storelab.report.core import Claim, Context, SectionResult, Table

# Colours by store family (each store config declares its FAMILY); a family not listed here is drawn grey.
FAMILY_COLOUR = {"window": "#4c9be8", "full": "#d62728", "selected": "#ff7f0e", "compressed sparse": "#9467bd",
                 "heavily compressed": "#c5b0d5", "recurrent": "#2ca02c"}
DEPTH_PALETTE = ("#dddddd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")  # depth stores in their card order


def _depth_colours() -> dict[str, str]:
    """A colour per registered depth store (those whose config may fill the depth slot)."""
    from storelab.stores import DEPTH, REGISTRY

    kinds = sorted((k for k, c in REGISTRY.items() if DEPTH in c.SLOTS), key=lambda k: (REGISTRY[k].CARD_ORDER, k))
    return {k: DEPTH_PALETTE[i % len(DEPTH_PALETTE)] for i, k in enumerate(kinds)}

# The essay's section-5 table: layers and token mixing, as the essay states them.
ESSAY_LAYERS = {"mimo-v2.6-pro": 70, "kimi-k3": 93, "qwen3.8": 92, "glm-5.3": 78, "deepseek-v4-pro": 61,
                "deepseek-v4.1-flash": 40, "minimax-m3": 60, "minimax-m3.1-flash": 60}
ESSAY_MIX = {"mimo-v2.6-pro": {"window": 60, "attention": 10}, "kimi-k3": {"kda": 69, "mla": 24},
             "qwen3.8": {"gated_deltanet": 69, "attention": 23}, "minimax-m3": {"attention": 3, "msa": 57},
             "minimax-m3.1-flash": {"msa": 60}}
# Publishers' parameter counts as the essay quotes them (stored, active).
ESSAY_PARAMS = {"mimo-v2.6-pro": (1.02e12, 42e9), "kimi-k3": (2.8e12, 104e9), "qwen3.8": (2.4e12, 95e9),
                "deepseek-v4-pro": (1.6e12, 49e9), "deepseek-v4.1-flash": (552e9, 16e9), "minimax-m3": (428e9, 23e9)}


def _configs():
    from storelab.zoo import load_zoo, zoo_names

    return [load_zoo(n) for n in zoo_names()]


def _stack_figure(cfgs, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    fig, ax = plt.subplots(figsize=(12, 0.55 * len(cfgs) + 1.5))
    fams: dict[str, str] = {}  # the families drawn, for the legend
    depth_colour = _depth_colours()
    for row, cfg in enumerate(cfgs):
        y = len(cfgs) - 1 - row
        for i, lay in enumerate(cfg.layers):
            fam = lay.token.FAMILY or lay.token.KIND
            col = FAMILY_COLOUR.get(fam, "#7f7f7f")
            fams.setdefault(fam, col)
            shared = lay.cache_owner is not None and lay.cache_owner != i
            ax.add_patch(plt.Rectangle((i, y + 0.1), 0.9, 0.6, color=col, alpha=0.45 if shared else 1.0, lw=0))
            ax.add_patch(plt.Rectangle((i, y), 0.9, 0.08, color=depth_colour.get(lay.depth.KIND, "#999"), lw=0))
        ax.text(-1, y + 0.4, cfg.name, ha="right", va="center", fontsize=9)
    n = max(c.n_layers for c in cfgs)
    ax.set(xlim=(-16, n + 1), ylim=(-0.3, len(cfgs)), xlabel="layer", yticks=[])
    for s in ("top", "right", "left"):
        ax.spines[s].set_visible(False)
    handles = [Patch(color=c, label=f) for f, c in fams.items()]
    handles += [Patch(color=c, label=f"depth: {k}") for k, c in depth_colour.items()]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=6, fontsize=8, frameon=False)
    ax.set_title("Layer stacks by store kind (faded: reads a cache another layer keeps; thin bar: depth mixer)")
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)
    return path


def models_section(ctx: Context) -> SectionResult:
    from storelab.models.record import model_record

    cfgs = _configs()
    recs = [model_record(c) for c in cfgs]
    rows, claims = [], []
    for cfg, r in zip(cfgs, recs):
        p = r["params"]
        # both sides of the ratio alike: where the publisher counts Engram's tables apart, so does this column
        apart = "published_engram" in p
        rows.append([cfg.name + (" (without Engram)" if apart else ""), r["layers"], r["mix"], r["channel_mix"],
                     r["depth"], p.get("stored_without_engram") if apart else p.get("stored"), p.get("published_stored"),
                     p.get("stored_ratio"), p.get("active"), p.get("published_active"), p.get("active_ratio")])
        if cfg.name in ESSAY_LAYERS:
            claims.append(Claim("models", f"{cfg.name}: number of layers", ESSAY_LAYERS[cfg.name], cfg.n_layers, 0.0))
        for kind, n in ESSAY_MIX.get(cfg.name, {}).items():
            have = sum(1 for lay in cfg.layers if lay.token.KIND == kind)
            claims.append(Claim("models", f"{cfg.name}: {kind} layers", n, have, 0.0))
        if cfg.name in ESSAY_PARAMS:
            st, ac = ESSAY_PARAMS[cfg.name]
            base = p.get("stored_without_engram", p.get("stored"))
            note = p.get("published_note", "") or ""
            claims.append(Claim("models", f"{cfg.name}: stored parameters", st, float(base), 0.03,
                                "counted from the config's store shapes" + (f"; {note}" if note else "")))
            claims.append(Claim("models", f"{cfg.name}: active parameters per token" + (" (decode)" if cfg.encoder_layers else ""),
                                ac, float(p.get("active")), 0.03, "counted from the config (embedding and head included)" + (f"; {note}" if note else "")))
        if cfg.name == "deepseek-v4.1-flash":
            if "engram" in p:
                claims.append(Claim("models", "deepseek-v4.1-flash: Engram parameters", 196e9, float(p["engram"]), 0.03))
            if "active_prefill" in p:
                claims.append(Claim("models", "deepseek-v4.1-flash: active while reading the prompt", 8e9, float(p["active_prefill"]), 0.03,
                                    p.get("published_note", "") or ""))
    fig = _stack_figure(cfgs, ctx.out / "layer_stacks.png")
    return SectionResult(
        text=("The seven models and two variants, declared as data (storelab/zoo/*.toml) and counted from the configs alone, "
              "beside the publishers' figures. Where a publisher counts Engram's lookup tables apart (V4.1-Flash), the stored "
              "column leaves them out too, so that both sides of the ratio count the same parameters; the tables have a "
              "claim of their own. The picture shows each model's stack coloured by the kind of store each layer keeps."),
        tables=[Table("The models (parameters from the configs)",
                      ["model", "layers", "token mixing", "channel mixing", "depth", "stored", "published", "ratio",
                       "active", "published", "ratio"], rows)],
        figures=[fig], claims=claims, data=recs)


def memory_section(ctx: Context) -> SectionResult:
    from storelab.report.memory_plot import plot_memory
    from storelab.models.accounting import kind_summary, memory_report

    L = 1_000_000
    cfgs = _configs()
    rows, data = [], {}
    for cfg in cfgs:
        rep = memory_report(cfg, L)
        data[cfg.name] = rep
        for g in kind_summary(rep):
            rows.append([cfg.name, g["kind"] + (" (shared)" if g["shared"] else ""), len(g["layers"]), g["kept"], g["read"],
                         g["scored"], g["average_bytes_per_token"]])
        t = rep[-1]
        rows.append([cfg.name, "total", cfg.n_layers, t["kept"], t["read"], t["scored"], t["average_bytes_per_token"]])
    fig = ctx.out / "memory_vs_context.png"
    plot_memory(cfgs, fig, points=7 if ctx.quick else 13)
    return SectionResult(
        text=("For a prompt of 1,000,000 tokens: what one layer of each kind keeps, what the next token reads, what an "
              "indexer scores to choose, and the state bytes per token of context (bf16 entries). Caches shared across "
              "layers are held once and counted once."),
        tables=[Table("Where a million-token prompt goes (per layer of each kind)",
                      ["model", "kind", "layers", "kept", "read", "scored", "bytes/token (all such layers)"], rows)],
        figures=[fig], data=data)  # worked example 2's claims are in section 5


def worked_example_2_claims(data=None) -> list[Claim]:
    """Worked example 2 and the 890 bytes/token figure, from the accounting."""
    from storelab.models.accounting import layer_rows, model_totals
    from storelab.zoo import load_zoo

    L = 1_000_000
    S = "memory"

    def first(name, kind):
        cfg = load_zoo(name)
        rows = data[name][:-1] if data and name in data else layer_rows(cfg, L)
        return next(r for r in rows if r["kind"] == kind)

    full = first("mimo-v2.6-pro", "attention")
    win = first("mimo-v2.6-pro", "window")
    msa = first("minimax-m3", "msa")
    csa = first("deepseek-v4-pro", "csa")
    hca = first("deepseek-v4-pro", "hca")
    rec = first("kimi-k3", "kda")
    rec_2m = layer_rows(load_zoo("kimi-k3"), 2 * L)
    rec_2m = next(r for r in rec_2m if r["kind"] == "kda")
    flash = load_zoo("deepseek-v4.1-flash")
    ft = model_totals(flash, layer_rows(flash, L, dtype="fp4"), L, dtype="fp4")
    return [
        Claim(S, "Ex. 2: a full-attention layer keeps", 1_000_000, full["kept"], 0.0),
        Claim(S, "Ex. 2: a full-attention layer reads", 1_000_000, full["read"], 0.0),
        Claim(S, "Ex. 2: a MiMo window layer keeps", 128, win["kept"], 0.0),
        Claim(S, "Ex. 2: a MiMo window layer reads", 128, win["read"], 0.0),
        Claim(S, "Ex. 2: a MiniMax-M3 MSA layer keeps", 1_000_000, msa["kept"], 0.0),
        Claim(S, "Ex. 2: an MSA layer reads per group of heads (16 blocks of 128)", 2048, msa["read"], 0.0),
        Claim(S, "Ex. 2: a V4-Pro CSA layer keeps about", 250_000, csa["kept"], 0.01),
        Claim(S, "Ex. 2: a CSA layer reads (1,024 selected + 128 recent)", 1024 + 128, csa["read"], 0.0),
        Claim(S, "Ex. 2: a V4-Pro HCA layer keeps about", 7_800, hca["kept"], 0.01),
        Claim(S, "Ex. 2: an HCA layer reads all it keeps plus the window", hca["kept"] + 128, hca["read"], 0.0,
              "the essay says 'reads them all'; the 128-token window is read in the same softmax"),
        Claim(S, "Ex. 2: a K3 recurrent layer's state does not grow with the prompt (bytes at 2M / at 1M)", 1.0,
              rec_2m["state_bytes"] / max(rec["state_bytes"], 1), 0.0, f"{rec['kept']} matrices, {rec['state_bytes']:,} bytes"),
        Claim(S, "V4.1-Flash: global cache bytes per token (4-bit entries)", 890, ft["global_bytes_per_token"], 0.01,
              "1 decoder entry + 3 encoder caches at ratio 2, each entry from storelab.ops.quant.entry_bytes"),
    ]
