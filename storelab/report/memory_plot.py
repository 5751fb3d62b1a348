"""The memory figure: cache bytes and read FLOPs per generated token against context, one line per model."""

from __future__ import annotations

from pathlib import Path


def plot_files(path: Path) -> tuple[Path, Path]:
    """The two files ``storelab memory --plot --out path`` writes: the figure and the JSON beside it."""
    png = plot_path(path)
    return png, png.with_suffix(".json")


def plot_path(path: Path) -> Path:
    """The file ``plot_memory`` writes for ``path``: ``path`` itself, with ".png" added when it has no
    suffix; a suffix matplotlib cannot write is a ValueError naming it (before anything is drawn)."""
    path = Path(path)
    if not path.suffix:
        return path.with_name(path.name + ".png")
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    kinds = FigureCanvasAgg(Figure()).get_supported_filetypes()
    if path.suffix[1:].lower() not in kinds:
        raise ValueError(f"out: cannot draw a {path.suffix!r} file (accepted: {', '.join('.' + k for k in kinds)})")
    return path


def plot_memory(cfgs, path: Path, *, dtype: str = "bf16", points: int = 13) -> dict:
    """Cache bytes and read FLOPs per generated token against context (log-log, 1K..1M), one line per
    model, drawn into ``plot_path(path)`` (which exists when this returns)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = plot_path(path)
    from storelab.models.accounting import layer_rows, model_totals

    contexts = [int(round(10 ** (3 + 3 * i / (points - 1)))) for i in range(points)]
    data = {}
    for cfg in cfgs:
        series = []
        for L in contexts:
            t = model_totals(cfg, layer_rows(cfg, L, dtype=dtype), L, dtype=dtype)
            series.append({"context": L, "state_bytes": t["state_bytes"], "read_flops": t["read_flops"]})
        data[cfg.name] = series
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 5))
    for name, s in data.items():
        xs = [p["context"] for p in s]
        a.loglog(xs, [p["state_bytes"] for p in s], marker=".", label=name)
        b.loglog(xs, [max(p["read_flops"], 1) for p in s], marker=".", label=name)
    a.set(title=f"Context state per sequence ({dtype} entries)", xlabel="context length (tokens)", ylabel="bytes")
    b.set(title="Reading the context, per generated token", xlabel="context length (tokens)", ylabel="FLOPs")
    for ax in (a, b):
        ax.grid(True, which="both", alpha=0.3)
    a.legend(fontsize=8)
    fig.tight_layout()
    from storelab.outputs import atomic_path

    try:
        with atomic_path(path) as tmp:  # a kill leaves the old figure or the new one
            fig.savefig(tmp, dpi=120, format=path.suffix[1:].lower())
    finally:
        plt.close(fig)
    if not path.is_file():  # pragma: no cover - savefig raises first
        raise OSError(f"out: {path} was not written")
    return data
