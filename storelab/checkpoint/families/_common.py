"""Helpers shared by the family modules: reading config fields, and table pieces."""

from __future__ import annotations

from typing import Any

from storelab.checkpoint.shards import CheckpointError
from storelab.checkpoint.table import Src, copy, plus_one, rows

_MISSING = object()


def field(hf: dict, key: str, default: Any = _MISSING) -> Any:
    """``hf[key]``, or ``default``; a missing required key is an error naming it."""
    v = hf.get(key, _MISSING)
    if v is _MISSING or (v is None and default is not _MISSING):
        if default is _MISSING:
            raise CheckpointError(f"config.json: {key}: missing (model_type {hf.get('model_type')!r})")
        return default
    return v


def unsupported(key: str, value: Any, why: str) -> CheckpointError:
    return CheckpointError(f"config.json: {key}: {value!r} is not supported ({why})")


def rope(params: dict | None, *, where: str = "rope_parameters", default_partial: float = 1.0) -> tuple[float, float]:
    """(theta, partial rotary fraction) of a plain RoPE; other rope types are an error."""
    params = params or {}
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise unsupported(f"{where}.rope_type", kind, "only plain RoPE is implemented")
    return float(params.get("rope_theta", 10000.0)), float(params.get("partial_rotary_factor", default_partial))


def check_act(hf: dict, key: str = "hidden_act", want: str = "silu") -> None:
    act = hf.get(key, want)
    if act != want:
        raise unsupported(key, act, f"only {want} is implemented for this family")


def norm(theirs: str, offset: bool) -> Src:
    return plus_one(theirs) if offset else copy(theirs)


def linear(tab: dict, ours: str, theirs: str, *, bias: bool = False) -> None:
    """A linear layer's weight (and bias) under another name."""
    tab[f"{ours}.weight"] = copy(f"{theirs}.weight")
    if bias:
        tab[f"{ours}.bias"] = copy(f"{theirs}.bias")


def base_entries(tab: dict, cfg, *, prefix: str = "model.", head: str = "lm_head.weight", offset: bool = False) -> None:
    """Embedding, per-layer block norms, final norm and LM head (the usual decoder names)."""
    tab["embed.weight"] = copy(f"{prefix}embed_tokens.weight")
    tab["norm.weight"] = norm(f"{prefix}norm.weight", offset)
    if not cfg.tie_embeddings:
        tab["lm_head.weight"] = copy(head)
    for i in range(cfg.n_layers):
        tab[f"blocks.{i}.norm_token.weight"] = norm(f"{prefix}layers.{i}.input_layernorm.weight", offset)
        tab[f"blocks.{i}.norm_channel.weight"] = norm(f"{prefix}layers.{i}.post_attention_layernorm.weight", offset)


def post_norm_entries(tab: dict, cfg, *, prefix: str = "model.") -> None:
    """The block norms of a post-norm decoder (``LayerConfig.norms = "post"``, x + norm(f(x)): OLMo 2,
    EXAONE 4): ``post_attention_layernorm`` after the attention, ``post_feedforward_layernorm`` after
    the MLP; they replace ``base_entries``' per-layer norms."""
    for i in range(cfg.n_layers):
        tab[f"blocks.{i}.norm_token.weight"] = copy(f"{prefix}layers.{i}.post_attention_layernorm.weight")
        tab[f"blocks.{i}.norm_channel.weight"] = copy(f"{prefix}layers.{i}.post_feedforward_layernorm.weight")


def with_mlp_biases(cfg):
    """The model with a bias on each dense MLP projection (``mlp_bias``: Seed-OSS, Helium); storelab's
    ``ffn`` has them as ``bias``."""
    import dataclasses

    def biased(lay):
        if lay.channel is None or lay.channel.KIND != "ffn":
            return lay
        return dataclasses.replace(lay, channel=dataclasses.replace(lay.channel, bias=True))

    return dataclasses.replace(cfg, layers=[biased(lay) for lay in cfg.layers])


def mlp_bias_entries(tab: dict, cfg, *, prefix: str = "model.") -> None:
    """The dense MLPs' biases (``mlp.{gate,up,down}_proj.bias``) where the channel config has them."""
    for i, lay in enumerate(cfg.layers):
        if lay.channel is not None and lay.channel.KIND == "ffn" and lay.channel.bias:
            for p in ("gate_proj", "up_proj", "down_proj"):
                tab[f"blocks.{i}.channel.{p}.bias"] = copy(f"{prefix}layers.{i}.mlp.{p}.bias")


def experts(tab: dict, ours: str, theirs: str, names: set[str], n_experts: int) -> None:
    """Routed experts as our 3-D ``gate_up [E, 2I, D]`` and ``down [E, D, I]``: copied when the
    checkpoint stores them so (transformers' layout), stacked from per-expert matrices otherwise
    (``{e}.gate_proj/up_proj/down_proj`` or DeepSeek/Mixtral's ``{e}.w1/w3/w2``)."""
    import torch

    per_expert = [p for p in (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2"))
                  if f"{theirs}.0.{p[0]}.weight" in names]
    if f"{theirs}.gate_up_proj" in names or not per_expert:
        tab[f"{ours}.gate_up"] = copy(f"{theirs}.gate_up_proj")
        tab[f"{ours}.down"] = copy(f"{theirs}.down_proj")
        return
    g, u, d = per_expert[0]
    pieces = [f"{theirs}.{e}.{p}.weight" for e in range(n_experts) for p in (g, u)]

    def gate_up(*ws):
        return torch.stack([torch.cat(ws[2 * e: 2 * e + 2], 0) for e in range(n_experts)], 0)

    tab[f"{ours}.gate_up"] = Src(tuple(pieces), gate_up, f"per-expert {g} and {u} rows stacked ({n_experts})")
    downs = tuple(f"{theirs}.{e}.{d}.weight" for e in range(n_experts))
    tab[f"{ours}.down"] = Src(downs, lambda *ws: torch.stack(ws, 0), f"per-expert {d} stacked ({n_experts})")


def gated_mlp(tab: dict, ours: tuple[str, str, str], theirs: str, names: set[str], width: int) -> None:
    """A SwiGLU MLP: our (gate, up, down) linears from separate ``gate_proj``/``up_proj``, or from a
    fused ``gate_up_proj`` (gate rows first) split in two."""
    g, u, d = ours
    if f"{theirs}.gate_up_proj.weight" in names:
        tab[f"{g}.weight"] = rows(f"{theirs}.gate_up_proj.weight", 0, width)
        tab[f"{u}.weight"] = rows(f"{theirs}.gate_up_proj.weight", width, 2 * width)
    else:
        tab[f"{g}.weight"] = copy(f"{theirs}.gate_proj.weight")
        tab[f"{u}.weight"] = copy(f"{theirs}.up_proj.weight")
    tab[f"{d}.weight"] = copy(f"{theirs}.down_proj.weight")


def either(names: set[str], *candidates: str) -> str:
    """The first candidate name the checkpoint holds (the first one when none: it is reported missing)."""
    return next((c for c in candidates if c in names), candidates[0])


def beyond_layers(n_layers: int, prefix: str = r"model\.layers\.") -> str:
    """A pattern for the layers numbered n_layers and up (MTP layers stored after the decoder's)."""
    return prefix + r"(?!(?:" + "|".join(str(i) for i in range(n_layers)) + r")\.)\d+\."


def share_schedule(types: list[str]) -> tuple[int, int] | None:
    """(freq, offset) with ``runs(i) = max(i - offset + 1, 0) % freq == 0`` reproducing a list of
    "full"/"shared" indexer types (GLM's IndexShare), or None when no such pair does."""
    n = len(types)
    want = [t == "full" for t in types]
    for freq in range(1, n + 1):
        for offset in range(0, n + 1):
            if [max(i - offset + 1, 0) % freq == 0 for i in range(n)] == want:
                return freq, offset
    return None


def mla_entries(tab: dict, ours: str, theirs: str, lat) -> None:
    """MLA projections (transformers' DeepseekV3Attention names) -> ours (``storelab.stores.mla.HF_NAMES``)."""
    if lat.q_lora_rank:
        linear(tab, f"{ours}.q_down", f"{theirs}.q_a_proj")
        tab[f"{ours}.q_norm.weight"] = copy(f"{theirs}.q_a_layernorm.weight")
        linear(tab, f"{ours}.q_up", f"{theirs}.q_b_proj")
    else:
        linear(tab, f"{ours}.q_proj", f"{theirs}.q_proj")
    linear(tab, f"{ours}.kv_down", f"{theirs}.kv_a_proj_with_mqa")
    tab[f"{ours}.kv_norm.weight"] = copy(f"{theirs}.kv_a_layernorm.weight")
    linear(tab, f"{ours}.kv_up", f"{theirs}.kv_b_proj")
    linear(tab, f"{ours}.out", f"{theirs}.o_proj")


def routed_moe(tab: dict, ours: str, theirs: str, names: set[str], moe) -> None:
    """A DeepSeek-V3 style MoE: ``gate.weight`` (+ ``gate.e_score_correction_bias``), experts, shared experts."""
    tab[f"{ours}.router.weight"] = copy(f"{theirs}.gate.weight")
    if moe.router_bias:
        tab[f"{ours}.choice_bias"] = copy(either(names, f"{theirs}.gate.e_score_correction_bias",
                                                 f"{theirs}.e_score_correction_bias"))
    experts(tab, ours, f"{theirs}.experts", names, moe.n_experts)
    if moe.shared_width:
        gated_mlp(tab, (f"{ours}.shared_gate_proj", f"{ours}.shared_up_proj", f"{ours}.shared_down_proj"),
                  f"{theirs}.shared_experts", names, moe.shared_width)
    if moe.shared_gate:
        tab[f"{ours}.shared_gate.weight"] = copy(f"{theirs}.shared_expert_gate.weight")


def submodule_path(store_cfg, class_name: str) -> str | None:
    """Where in a store's module the submodule of this class sits (``"selector.indexer"``), or None.
    Built on the meta device: it costs nothing and follows the store's own layout."""
    import torch

    with torch.device("meta"):
        mod = store_cfg.build()
    return next((n for n, m in mod.named_modules() if type(m).__name__ == class_name), None)


def model_config(hf: dict, text, *, name: str, title: str, d_model: int, layers: list, norm_eps: float,
                 context: int | None = None):
    """The storelab ModelConfig every family ends with: vocabulary and context from the text config
    ``text`` (the whole config, or a VL checkpoint's text part: a dict or the reader's ``Fields``, whose
    errors then name ``text_config.vocab_size``), tied embeddings from ``hf``."""
    from storelab.checkpoint.families._reader import Fields
    from storelab.models.config import ModelConfig

    t = text if isinstance(text, Fields) else Fields(text)
    return ModelConfig(name=name, title=title, d_model=d_model, vocab_size=t.int("vocab_size", minimum=1),
                       layers=layers, norm_eps=norm_eps,
                       tie_embeddings=Fields(hf, t.where).bool("tie_word_embeddings", default=False),
                       context=t.int("max_position_embeddings", default=0) if context is None else context)


def layer_prefix(names: set[str], extra: tuple[tuple[str, str], ...] = ()) -> tuple[str, str]:
    """(layer prefix, LM head name): the text model, a VL model's language part, or ``extra`` layouts."""
    for pre, head in (("model.", "lm_head.weight"), ("model.language_model.", "lm_head.weight")) + extra:
        if f"{pre}embed_tokens.weight" in names:
            return pre, head
    return "model.", "lm_head.weight"
