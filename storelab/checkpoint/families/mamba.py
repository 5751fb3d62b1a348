"""The pure state-space models: Mamba (arXiv 2312.00752; ``mamba``, ``falcon_mamba``) and Mamba-2
(arXiv 2405.21060; ``mamba2``). Every layer is one mixer behind an RMSNorm and the residual, with no
channel mixer (our layers leave the channel slot empty). Names are transformers' ``backbone.*``:

| ours                      | transformers                               |
|---------------------------|--------------------------------------------|
| embed.weight              | backbone.embeddings.weight                 |
| blocks.i.norm_token       | backbone.layers.i.norm.weight              |
| blocks.i.token.*          | backbone.layers.i.mixer.* (the stores' docstrings map each tensor) |
| norm.weight, lm_head      | backbone.norm_f.weight, lm_head.weight (tied by default for mamba) |
"""

from __future__ import annotations

import math

from storelab.checkpoint.families._common import linear
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Fields, text_fields, tied
from storelab.checkpoint.table import Src, copy

MAMBA_NAMES = {"in_proj": "in_proj", "x_proj": "x_proj", "dt_proj": "dt_proj", "out_proj": "out_proj"}


def _number(v):
    """A JSON number, or transformers 5's spelling of infinity (``{"__float__": "Infinity"}``)."""
    if isinstance(v, dict) and v.get("__float__") in ("Infinity", "-Infinity"):
        return float(v["__float__"].replace("Infinity", "inf"))
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def time_step_limit(t: Fields) -> tuple[float, float]:
    lim = [_number(v) for v in t.list("time_step_limit", "mamba_dt_limit", default=[0.0, math.inf])]
    if len(lim) != 2 or None in lim:
        raise t._err("time_step_limit", f"must be two numbers [low, high], got {t.raw('time_step_limit')!r}")
    return float(lim[0]), float(lim[1])


def mamba_store(t: Fields, D: int, *, falcon: bool):
    from storelab.stores.mamba import MambaConfig

    rank = t.raw("time_step_rank", default="auto")
    rank = math.ceil(D / 16) if rank == "auto" else t.int("time_step_rank", minimum=1)
    E = t.int("intermediate_size", default=t.int("expand", default=2, minimum=1) * D, minimum=1)
    return MambaConfig(d_model=D, d_inner=E, d_state=t.int("state_size", minimum=1), dt_rank=rank,
                       conv_kernel=t.int("conv_kernel", minimum=1), use_conv_bias=t.bool("use_conv_bias", default=True),
                       use_bias=t.bool("use_bias", default=False),
                       bcdt_norm="weightless" if falcon else "none",
                       bcdt_norm_eps=t.float("mixer_rms_eps", default=1e-6, positive=True))


def mamba2_store(t: Fields, D: int, *, heads: str = "num_heads", head_dim: str = "head_dim",
                 dt_limit: tuple[float, float] | None = None):
    from storelab.stores.mamba2 import Mamba2Config

    return Mamba2Config(d_model=D, n_heads=t.int(heads, minimum=1), head_dim=t.int(head_dim, minimum=1),
                        d_state=t.int("state_size", "ssm_state_size", minimum=1),
                        n_groups=t.int("n_groups", "mamba_n_groups", default=1, minimum=1),
                        conv_kernel=t.int("conv_kernel", "mamba_d_conv", minimum=1),
                        norm_eps=t.float("layer_norm_epsilon", "rms_norm_eps", default=1e-5, positive=True),
                        use_conv_bias=t.bool("use_conv_bias", "mamba_conv_bias", default=True),
                        use_bias=t.bool("use_bias", "mamba_proj_bias", default=False),
                        dt_limit=dt_limit if dt_limit is not None else time_step_limit(t),
                        chunk_size=t.int("chunk_size", default=64, minimum=1))


def to_config(hf: dict):
    from storelab.checkpoint.families._common import model_config
    from storelab.models.config import LayerConfig
    from storelab.stores.depth import ResidualConfig

    t = text_fields(hf)
    D, n = t.int("hidden_size", minimum=1), t.int("num_hidden_layers", minimum=1)
    mt = t.str("model_type")
    if mt == "mamba2":
        token = mamba2_store(t, D)
        if not t.bool("rms_norm", default=True):
            raise t._err("rms_norm", "false is not supported (storelab's mamba2 family reads the gated group norm)")
    else:
        token = mamba_store(t, D, falcon=mt == "falcon_mamba")
    layers = [LayerConfig(token=token, depth=ResidualConfig(d_model=D)) for _ in range(n)]
    import dataclasses

    cfg = model_config(hf, t.d, name=mt.replace("_", "-"), title=f"{mt} (checkpoint)", d_model=D, layers=layers,
                       norm_eps=t.float("layer_norm_epsilon", default=1e-5, positive=True), context=0)
    return dataclasses.replace(cfg, tie_embeddings=tied_default(hf, t, mt != "mamba2"))


def tied_default(hf: dict, t: Fields, default: bool) -> bool:
    return tied(hf, t) if Fields(hf).has("tie_word_embeddings") or t.has("tie_word_embeddings") else default


def mixer_entries(tab: dict, o: str, m: str, tok) -> None:
    """A Mamba or Mamba-2 mixer's tensors under transformers' names (``MambaMixer`` / ``Mamba2Mixer``)."""
    if tok.KIND == "mamba2":
        linear(tab, f"{o}.in_proj", f"{m}.in_proj", bias=tok.use_bias)
        for p in ("dt_bias", "A_log", "D"):
            tab[f"{o}.{p}"] = copy(f"{m}.{p}")
        if tok.norm != "none":
            tab[f"{o}.norm_weight"] = copy(f"{m}.norm.weight")
    else:
        linear(tab, f"{o}.in_proj", f"{m}.in_proj", bias=tok.use_bias)
        linear(tab, f"{o}.x_proj", f"{m}.x_proj")
        linear(tab, f"{o}.dt_proj", f"{m}.dt_proj", bias=True)
        for p in ("A_log", "D"):
            tab[f"{o}.{p}"] = copy(f"{m}.{p}")
    tab[f"{o}.conv_weight"] = Src((f"{m}.conv1d.weight",), lambda w: w.squeeze(1), "[C, 1, W] -> [C, W]")
    if tok.use_conv_bias:
        tab[f"{o}.conv_bias"] = copy(f"{m}.conv1d.bias")
    linear(tab, f"{o}.out_proj", f"{m}.out_proj", bias=tok.use_bias)


def table(hf: dict, cfg, names: set[str]) -> dict:
    tab: dict = {"embed.weight": copy("backbone.embeddings.weight"), "norm.weight": copy("backbone.norm_f.weight")}
    if not cfg.tie_embeddings:
        tab["lm_head.weight"] = copy("lm_head.weight")
    for i, lay in enumerate(cfg.layers):
        tab[f"blocks.{i}.norm_token.weight"] = copy(f"backbone.layers.{i}.norm.weight")
        mixer_entries(tab, f"blocks.{i}.token", f"backbone.layers.{i}.mixer", lay.token)
    return tab


FAMILY = Family(stores=("mamba", "mamba2", "residual"),
                name="mamba", model_types=("mamba", "falcon_mamba", "mamba2"), to_config=to_config, table=table,
                ignored=lambda hf: (r"rotary_emb\.",))
