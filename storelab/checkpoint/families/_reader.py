"""The one reader of the fields that transformers configs share; a family is a small declaration.

Most open causal LMs are written in one vocabulary: ``hidden_size``, ``num_hidden_layers``,
``num_attention_heads``, ``num_key_value_heads``, ``head_dim``, ``intermediate_size``, the rope
fields (``rope_theta`` + ``rope_scaling`` in published v4 files, ``rope_parameters`` in v5,
sometimes one per layer type), the per-layer lists (``layer_types``, ``mlp_layer_types``) or the
older facts they replace (``sliding_window`` with ``use_sliding_window`` / ``max_window_layers``,
``sliding_window_pattern``, ``first_k_dense_replace``, ``moe_layer_freq``, ``decoder_sparse_step``,
``mlp_only_layers``), the expert counts under their several names, and ``text_config`` for a
multimodal wrapper. This module reads all of them once:

* ``Fields``: a config dict read through typed getters; every error names the file and the field
  (``config.json: text_config.hidden_size: must be an integer, got '64'``), so a malformed file is
  refused, never a traceback. A getter takes several names, tried in order (the aliases).
* ``text_fields(hf)``: the text model's fields (a wrapper's ``text_config``, else the config itself).
* ``layer_types`` / ``mlp_types``: one entry per layer, from whichever form the file uses.
* ``Decl``: what a family says about itself: its ``model_type`` values, the defaults and field
  names where it differs, and which attention devices it uses. ``family(decl)`` makes the loader's
  ``Family`` of it (``_family.py``): ``to_config`` builds one ``LayerConfig`` per layer from the shared
  fields, ``table`` gives transformers' usual tensor names (``self_attn``, ``mlp``, experts per expert
  or 3-D, shared experts).

A family module is then its declaration and, where its tensors are named differently, a few table
entries. A layer type no store can fill is refused naming the layer and the type.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field as dc_field
from typing import Any, Callable

from storelab.checkpoint.families._common import (base_entries, beyond_layers, experts, gated_mlp, layer_prefix, linear,
                                                  norm)
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.shards import CheckpointError
from storelab.checkpoint.table import copy

__all__ = ["Fields", "Decl", "family", "text_fields", "layer_types", "mlp_types", "rope_of", "Rope"]

_MISSING = object()


class Fields:
    """Typed reads of one config dict. ``where`` names it in errors (``config.json``, ``config.json:
    text_config``); ``int("num_experts", "n_routed_experts", default=0)`` tries the names in order."""

    def __init__(self, d: dict, where: str = "config.json", prefix: str = ""):
        if not isinstance(d, dict):
            raise CheckpointError(f"{where}: {prefix.rstrip('.') or 'config'}: must be a JSON object, got {d!r}")
        self.d, self.where, self.prefix = d, where, prefix

    def _err(self, key: str, msg: str) -> CheckpointError:
        return CheckpointError(f"{self.where}: {self.prefix}{key}: {msg}")

    def key(self, *keys: str) -> str | None:
        """The first of ``keys`` the config gives a value (not null) for."""
        return next((k for k in keys if self.d.get(k) is not None), None)

    def has(self, *keys: str) -> bool:
        return self.key(*keys) is not None

    def raw(self, *keys: str, default: Any = _MISSING) -> Any:
        k = self.key(*keys)
        if k is None:
            if default is _MISSING:
                raise self._err(keys[0], f"missing (model_type {self.d.get('model_type')!r})")
            return default
        return self.d[k]

    def int(self, *keys: str, default: Any = _MISSING, minimum: int = 0) -> int:
        k = self.key(*keys)
        if k is None:
            return self.raw(*keys, default=default)
        v = self.d[k]
        if isinstance(v, bool) or not isinstance(v, int):
            raise self._err(k, f"must be an integer, got {v!r}")
        if v < minimum:
            raise self._err(k, f"must be an integer >= {minimum}, got {v!r}")
        return v

    def float(self, *keys: str, default: Any = _MISSING, positive: bool = False, minimum: float | None = None,
              maximum: float | None = None) -> float:
        """A finite number; ``positive``: > 0 (an epsilon, a scale, a rope base); ``minimum`` / ``maximum``:
        the closed range it must lie in (a rotated fraction in [0, 1])."""
        k = self.key(*keys)
        if k is None:
            return self.raw(*keys, default=default)
        v = self.d[k]
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise self._err(k, f"must be a finite number, got {v!r}")
        if positive and v <= 0:
            raise self._err(k, f"must be a number > 0, got {v!r}")
        if (minimum is not None and v < minimum) or (maximum is not None and v > maximum):
            raise self._err(k, f"must be a number in [{minimum if minimum is not None else '-inf'}, "
                               f"{maximum if maximum is not None else 'inf'}], got {v!r}")
        return float(v)

    def layers(self, *keys: str, n: int, base: int = 0, default: Any = _MISSING) -> list[int]:
        """A list of layer numbers (``mlp_only_layers``, ``moe_layers``; Kimi's 1-based ``kda_layers``:
        ``base=1``), each an integer naming one of the ``n`` layers."""
        k = self.key(*keys)
        if k is None:
            return self.raw(*keys, default=default)
        v = self.list(k)
        for j, x in enumerate(v):
            if isinstance(x, bool) or not isinstance(x, int) or not base <= x < n + base:
                raise self._err(f"{k}[{j}]", f"must be a layer number in [{base}, {n + base - 1}] "
                                             f"(num_hidden_layers is {n}), got {x!r}")
        return v

    def bool(self, *keys: str, default: Any = _MISSING) -> bool:
        k = self.key(*keys)
        if k is None:
            return self.raw(*keys, default=default)
        v = self.d[k]
        if not isinstance(v, bool):
            raise self._err(k, f"must be true or false, got {v!r}")
        return v

    def str(self, *keys: str, default: Any = _MISSING) -> str:
        k = self.key(*keys)
        if k is None:
            return self.raw(*keys, default=default)
        v = self.d[k]
        if not isinstance(v, str):
            raise self._err(k, f"must be a string, got {v!r}")
        return v

    def list(self, *keys: str, n: int | None = None, default: Any = _MISSING) -> list:
        """A list; with ``n``, one entry per layer (a longer list is cut to the layers, as transformers
        does; a shorter one is an error naming both counts)."""
        k = self.key(*keys)
        if k is None:
            return self.raw(*keys, default=default)
        v = self.d[k]
        if not isinstance(v, list):
            raise self._err(k, f"must be a list, got {v!r}")
        if n is not None and len(v) < n:
            raise self._err(k, f"has {len(v)} entries, but num_hidden_layers is {n} (one entry per layer)")
        return v[:n] if n is not None else v

    def sub(self, *keys: str, default: Any = _MISSING) -> "Fields":
        """A nested object's fields (``linear_attn_config``, ``rope_scaling``)."""
        k = self.key(*keys)
        if k is None:
            return Fields(self.raw(*keys, default=default) or {}, self.where, self.prefix + keys[0] + ".")
        return Fields(self.d[k], self.where, self.prefix + k + ".")

    def name(self, key: str) -> str:
        """The config's own name of ``key`` for a message: ``text_config.hidden_size``."""
        return self.prefix + key


def text_fields(hf: dict, where: str = "config.json") -> Fields:
    """The text model's fields: a multimodal wrapper's ``text_config`` (``language_config``,
    ``llm_config``), else the config itself."""
    top = Fields(hf, where)
    k = top.key("text_config", "language_config", "llm_config")
    if k is None:
        return top
    return top.sub(k)


def tied(hf: dict, t: Fields, default: bool = False) -> bool:
    """``tie_word_embeddings`` from the wrapper, else the text config, else ``default`` (the family's)."""
    top = Fields(hf, t.where)
    if top.has("tie_word_embeddings"):
        return top.bool("tie_word_embeddings")
    return t.bool("tie_word_embeddings", default=default)


# -- sizes held before anything is built --------------------------------------------------------------
# a field of any of these names, at any depth of the config, is at most this (a billion layers would take
# gigabytes just to describe, one LayerConfig each; an expert count times the layers is a table entry each)
SIZE_LIMITS: dict[str, tuple[int, str]] = {
    **dict.fromkeys(("num_hidden_layers", "n_layers", "num_layers", "n_layer", "num_decoder_layers"),
                    (100_000, "layers")),
    **dict.fromkeys(("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", "n_experts"),
                    (65_536, "experts")),
    **dict.fromkeys(("vocab_size", "padded_vocab_size"), (2**31 - 1, "tokens (an int32 token id)")),
    **dict.fromkeys(("hidden_size", "d_model", "intermediate_size", "moe_intermediate_size", "ffn_hidden_size",
                     "head_dim", "num_attention_heads", "num_key_value_heads", "max_position_embeddings",
                     "kv_lora_rank", "q_lora_rank"), (2**31 - 1, "(a tensor dimension)")),
}
MAX_LAYER_EXPERTS = 10_000_000  # layers x experts: the experts' tensor names are listed per layer
BIGGEST = 2**63 - 1             # any integer of the config: beyond it, no tensor size or count can hold it


def check_sizes(hf: dict, where: str = "config.json") -> None:
    """Refuse, before anything is built, a config whose layer count, vocabulary, expert count or sizes cannot
    be represented or would need more memory than a machine has just to describe (``SIZE_LIMITS``), naming
    the field; any integer beyond 2^63 - 1 too."""
    def walk(d: Any, path: str, depth: int) -> None:
        if depth > 8:
            return
        items = d.items() if isinstance(d, dict) else enumerate(d) if isinstance(d, list) else ()
        for k, v in items:
            name = f"{path}{k}" if isinstance(d, dict) else f"{path.rstrip('.')}[{k}]"
            if isinstance(v, (dict, list)):
                walk(v, name + ".", depth + 1)
            elif isinstance(v, int) and not isinstance(v, bool):
                limit, what = SIZE_LIMITS.get(k, (BIGGEST, "")) if isinstance(d, dict) else (BIGGEST, "")
                if abs(v) > limit:
                    raise CheckpointError(f"{where}: {name}: {v:,} is more than storelab reads (at most {limit:,}"
                                          f"{' ' + what if what else ''}): refused before anything is built")
    walk(hf, "", 0)
    for t in (hf, *(hf[k] for k in ("text_config", "language_config", "llm_config") if isinstance(hf.get(k), dict))):
        layers = max((t[k] for k in SIZE_LIMITS if SIZE_LIMITS[k][1] == "layers" and _count(t.get(k))), default=0)
        experts = max((t[k] for k in SIZE_LIMITS if SIZE_LIMITS[k][1] == "experts" and _count(t.get(k))), default=0)
        if layers * experts > MAX_LAYER_EXPERTS:
            raise CheckpointError(f"{where}: {layers:,} layers x {experts:,} experts is more than storelab reads "
                                  f"(at most {MAX_LAYER_EXPERTS:,} expert tables): refused before anything is built")


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


# -- per-layer types ----------------------------------------------------------------------------------
FULL, SLIDING, CHUNKED = "full_attention", "sliding_attention", "chunked_attention"


def layer_types(t: Fields, n: int, *, every: int = 0) -> list[str]:
    """One token-mixer type per layer: ``layer_types`` if given; else from ``sliding_window`` and the
    older fields that place it (``use_sliding_window`` + ``max_window_layers``: Qwen2's first layers
    full; ``sliding_window_pattern``: every n-th layer full; ``every`` the family's default pattern);
    else all full attention."""
    if t.has("layer_types"):
        types = t.list("layer_types", n=n)
        for i, x in enumerate(types):
            if not isinstance(x, str):
                raise t._err(f"layer_types[{i}]", f"must be a string, got {x!r}")
        return types
    window = t.int("sliding_window", default=0)
    if not window or not t.bool("use_sliding_window", default=True):
        return [FULL] * n
    pattern = t.int("sliding_window_pattern", "sliding_window_period", default=every)
    if pattern:
        return [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(n)]
    if t.has("max_window_layers"):  # Qwen2: layers from max_window_layers on use the window
        first = t.int("max_window_layers")
        return [SLIDING if i >= first else FULL for i in range(n)]
    return [SLIDING] * n


def mlp_types(t: Fields, n: int, *, moe: bool) -> list[str]:
    """"dense" or "sparse" per layer: ``mlp_layer_types``; else DeepSeek's ``first_k_dense_replace`` and
    ``moe_layer_freq``, Qwen's ``decoder_sparse_step`` and ``mlp_only_layers``, Llama 4's
    ``interleave_moe_layer_step`` / ``moe_layers``; ``moe`` says whether the family has experts at all."""
    if t.has("mlp_layer_types"):
        types = t.list("mlp_layer_types", n=n)
        return ["sparse" if x in ("sparse", "moe") else "dense" for x in types]
    if not moe or not t.int("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", default=0):
        return ["dense"] * n
    if t.has("moe_layers"):
        where = set(t.layers("moe_layers", n=n))
        return ["sparse" if i in where else "dense" for i in range(n)]
    first = t.int("first_k_dense_replace", "moe_layer_start_index", "num_dense_layers", default=0)
    only = set(t.layers("mlp_only_layers", n=n, default=[]))
    if t.has("moe_layer_freq", "moe_layer_interval"):  # DeepSeek: layer i >= first with i % freq == 0
        freq = t.int("moe_layer_freq", "moe_layer_interval", minimum=1)
        sparse = [i >= first and i % freq == 0 for i in range(n)]
    else:  # Qwen's decoder_sparse_step, Llama 4's interleave_moe_layer_step: layer i with (i + 1) % step == 0
        step = t.int("decoder_sparse_step", "interleave_moe_layer_step", default=1, minimum=1)
        sparse = [i >= first and (i + 1) % step == 0 for i in range(n)]
    return ["sparse" if s and i not in only else "dense" for i, s in enumerate(sparse)]


# -- rope --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Rope:
    theta: float
    partial: float
    kind: str = "default"   # rope_type: default, llama3, yarn, linear, dynamic, ...
    scaling: dict | None = None  # the published scaling's keys, original_max_position_embeddings filled in


def rope_of(t: Fields, layer_type: str = FULL, *, partial: float = 1.0, theta: float = 10000.0) -> Rope:
    """theta, rotated fraction and scaling kind of a layer type: ``rope_parameters`` (v5; one per layer
    type where the family keeps two), else ``rope_theta`` / ``rope_scaling`` / ``partial_rotary_factor``."""
    if t.has("rope_parameters"):
        rp = t.sub("rope_parameters")
        if rp.has(layer_type) and isinstance(rp.d.get(layer_type), dict):
            rp = rp.sub(layer_type)
    else:
        rp = t
    sc = t.sub("rope_scaling", default={}) if t.has("rope_scaling") else rp
    kind = sc.str("rope_type", "type", default="default")
    th = rp.float("rope_theta", default=t.float("rope_theta", default=theta, positive=True), positive=True)
    pr = rp.float("partial_rotary_factor", minimum=0.0, maximum=1.0,
                  default=t.float("partial_rotary_factor", default=partial, minimum=0.0, maximum=1.0))
    scaling = None
    if kind != "default":  # as transformers: the pretraining length defaults to max_position_embeddings
        scaling_numbers(sc)
        scaling = {k: v for k, v in sc.d.items() if k not in ("rope_theta", "partial_rotary_factor")}
        scaling["rope_type"] = kind
        if scaling.get("original_max_position_embeddings") is None:
            scaling["original_max_position_embeddings"] = t.int("original_max_position_embeddings",
                                                                "max_position_embeddings", default=None)
    return Rope(theta=th, partial=pr, kind=kind, scaling=scaling)


SCALING_POSITIVE = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "low_freq_factor",
                    "high_freq_factor", "attention_factor", "short_factor", "long_factor")
SCALING_NUMBERS = ("mscale", "mscale_all_dim", "extrapolation_factor")


def scaling_numbers(sc: Fields) -> None:
    """The numbers of a rope scaling (yarn's ``factor``, ``mscale_all_dim``; llama3's frequency factors),
    checked where given, naming the field: the scaling code computes with them unread."""
    for k in SCALING_POSITIVE:
        if sc.has(k) and not isinstance(sc.d[k], list):  # longrope's factors are lists, not read here
            sc.float(k, positive=True)
    for k in SCALING_NUMBERS:
        if sc.has(k):
            sc.float(k)


# -- the declaration --------------------------------------------------------------------------------------
ACTS = {"silu": "swiglu", "swish": "swiglu", "gelu": "geglu", "gelu_pytorch_tanh": "geglu_tanh"}


@dataclass(frozen=True)
class Decl:
    """A family of the shared vocabulary: what it says about itself.

    ``qk_norm``: an RMSNorm per query/key head (Qwen3, Gemma 3); ``sink``: a learned sink logit per head
    on the listed layer types; ``router``: the expert score when the config names none (``scoring_func``
    overrides); ``router_bias``: DeepSeek-V3's choice bias (also implied by ``topk_method`` "noaux_tc");
    ``nope``: how a layer is told to use no positions (``no_rope_layers`` entries 0, Llama 4 and SmolLM3);
    ``every``: the default full-attention period when a window is given without a pattern;
    ``extra``: more table entries (``extra(tab, hf, cfg, names)``)."""

    name: str
    model_types: tuple[str, ...]
    title: str
    qkv_bias: bool | None = None        # None: ``attention_bias``; Qwen2's are always there
    o_bias: bool | None = None          # None: ``attention_bias``
    qk_norm: bool = False
    sink_on: tuple[str, ...] = ()
    router: str = "softmax"
    router_bias: bool = False
    norm_topk_default: bool = True
    shared_gate: bool = False
    nope: bool = False
    every: int = 0
    partial: float = 1.0
    eps: float = 1e-6
    ignored: tuple[str, ...] = (r"rotary_emb\.", r"^model\.visual\.", r"^visual\.", r"^model\.vision_tower\.",
                                r"^vision_tower\.", r"^model\.multi_modal_projector\.", r"^multi_modal_projector\.")
    extra: Callable | None = None
    types: Callable[[Fields, int], list[str]] | None = None
    token: Callable | None = None       # token(t, i, kind, decl, D, eps) for a family's own attention (MLA)
    token_table: Callable | None = None  # token_table(tab, o, a, store, names) for its tensors
    mtp: bool = False                   # MTP layers stored after the decoder's (``model.layers.<n>``): ignored
    theta: float = 10000.0              # rope_theta when the config names none (transformers' default_theta)
    tied: bool = False                  # tie_word_embeddings when the config says nothing
    ffn_width: Callable[[Fields], int] | None = None  # a dense MLP's width when not intermediate_size (LFM2)
    stores: tuple[str, ...] = ("attention", "window", "ffn", "moe", "residual")  # the kinds it can build


def _bias(t: Fields, declared: bool | None) -> bool:
    return t.bool("attention_bias", default=False) if declared is None else declared


def _attention(t: Fields, i: int, kind: str, decl: Decl, D: int, eps: float):
    from storelab.stores.attention import AttentionConfig, WindowConfig

    H = t.int("num_attention_heads", "n_head", minimum=1)
    G = t.int("num_key_value_heads", "n_kv_heads", default=H, minimum=1)
    K = t.int("head_dim", default=D // H, minimum=1)
    rp = rope_of(t, kind, partial=decl.partial, theta=decl.theta)
    partial = rp.partial
    if decl.nope and t.has("no_rope_layers", "no_rope_layer_interval"):
        if t.has("no_rope_layers"):  # 1: the layer rotates, 0: it uses no positions
            uses = bool(t.list("no_rope_layers", n=t.int("num_hidden_layers"))[i])
        else:                        # SmolLM3: every interval-th layer has no positions
            uses = (i + 1) % t.int("no_rope_layer_interval", minimum=1) != 0
        partial = partial if uses else 0.0
    common = dict(d_model=D, n_heads=H, n_kv_heads=G, head_dim=K, partial_rotary=partial, rope_theta=rp.theta,
                  qk_norm=decl.qk_norm, qkv_bias=_bias(t, decl.qkv_bias), out_bias=_bias(t, decl.o_bias),
                  sink=kind in decl.sink_on, norm_eps=eps,
                  rope_scaling=rp.scaling if rp.kind in RUNS_ROPE[1:] else None)  # others: refused by runs()
    if kind == FULL:
        return AttentionConfig(**common)
    if kind == SLIDING:
        W = t.int("sliding_window", minimum=2)
        return WindowConfig(window=W - 1, **common)  # transformers' window counts the query itself
    raise CheckpointError(f"{t.where}: {t.prefix}layer_types[{i}]: {kind!r} is not supported by the {decl.name} "
                          f"family (storelab has no store for it yet)")


def _channel(t: Fields, i: int, sparse: bool, decl: Decl, D: int, eps: float):
    from storelab.stores.ffn import FFNConfig
    from storelab.stores.moe import MoEConfig

    act = t.str("hidden_act", "hidden_activation", "activation_function", default="silu")
    if ACTS.get(act) != "swiglu":
        raise t._err("hidden_act", f"{act!r} is not supported (storelab's {decl.name} layers run SiLU-gated MLPs)")
    if not sparse:
        width = decl.ffn_width(t) if decl.ffn_width else t.int("intermediate_size", "ffn_hidden_size", minimum=1)
        return FFNConfig(d_model=D, d_ff=width)
    E = t.int("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts", minimum=1)
    k = t.int("num_experts_per_tok", "num_experts_per_token", "moe_k", "top_k", minimum=1)
    width = t.int("moe_intermediate_size", "expert_intermediate_size", default=None, minimum=1)
    if width is None:
        width = t.int("intermediate_size", minimum=1)  # Mixtral: its experts are intermediate_size wide
    score = t.str("scoring_func", default=decl.router)
    bias = ((decl.router_bias and t.bool("use_expert_bias", default=True))  # LFM2-MoE may turn it off
            or t.str("topk_method", default="") == "noaux_tc")
    n_group = t.int("n_group", "num_expert_group", default=1, minimum=1)
    topk_group = t.int("topk_group", default=n_group, minimum=1)
    if t.str("topk_method", default="") == "greedy":  # DeepSeek-V2's plain top-k: the groups are not used
        n_group = topk_group = 1
    S = t.int("shared_expert_intermediate_size", default=0)
    n_shared = 1 if S else t.int("n_shared_experts", "num_shared_experts", "moe_num_shared_experts", default=0)
    return MoEConfig(d_model=D, n_experts=E, top_k=k, d_expert=width, router=score, router_bias=bias,
                     norm_topk_prob=t.bool("norm_topk_prob", default=decl.norm_topk_default),
                     routed_scaling=t.float("routed_scaling_factor", default=1.0, positive=True),
                     n_shared=n_shared, d_shared=S or (width if n_shared else None),
                     shared_gate=decl.shared_gate and n_shared > 0, n_group=n_group, topk_group=topk_group,
                     norm_eps=eps)


def to_config(decl: Decl, hf: dict):
    from storelab.checkpoint.families._common import model_config
    from storelab.models.config import LayerConfig
    from storelab.stores.depth import ResidualConfig

    t = text_fields(hf)
    D = t.int("hidden_size", "d_model", "n_embd", minimum=1)
    n = t.int("num_hidden_layers", "n_layer", "num_layers", minimum=1)
    eps = t.float("rms_norm_eps", "layer_norm_eps", "norm_eps", default=decl.eps, positive=True)
    types = decl.types(t, n) if decl.types else layer_types(t, n, every=decl.every)
    mlp = mlp_types(t, n, moe=True)
    layers = []
    for i in range(n):
        token = (decl.token or _attention)(t, i, types[i], decl, D, eps)
        channel = _channel(t, i, mlp[i] == "sparse", decl, D, eps)
        layers.append(LayerConfig(token=token, channel=channel, depth=ResidualConfig(d_model=D)))
    cfg = model_config(hf, t.d, name=decl.name.replace("_", "-"), title=decl.title, d_model=D, layers=layers,
                       norm_eps=eps, context=t.int("max_position_embeddings", default=0))
    import dataclasses

    return dataclasses.replace(cfg, tie_embeddings=tied(hf, t, decl.tied), vocab_size=t.int("vocab_size", minimum=1))


def table(decl: Decl, hf: dict, cfg, names: set[str]) -> dict:
    """transformers' usual names: ``model.layers.i.self_attn.{q,k,v,o}_proj`` (+ biases, ``q_norm``,
    ``k_norm``, ``sinks``), ``mlp.{gate,up,down}_proj`` or ``mlp.gate`` + ``mlp.experts`` (3-D or per
    expert, ``mlp`` or ``block_sparse_moe``) + ``mlp.shared_expert(s)`` (+ ``shared_expert_gate``)."""
    pre, head = layer_prefix(names)
    tab: dict = {}
    base_entries(tab, cfg, prefix=pre, head=head)
    for i, lay in enumerate(cfg.layers):
        a, o, tok = f"{pre}layers.{i}.self_attn", f"blocks.{i}.token", lay.token
        if decl.token_table is not None:
            decl.token_table(tab, o, a, tok, names)
        else:
            attention_entries(tab, o, a, tok)
        _channel_entries(tab, pre, i, lay.channel, names)
    if decl.extra is not None:
        decl.extra(tab, hf, cfg, names)
    return tab


def attention_entries(tab: dict, o: str, a: str, tok) -> None:
    """q/k/v/o projections (+ biases), per-head q/k norms and sinks under transformers' names."""
    for p in ("q_proj", "k_proj", "v_proj"):
        linear(tab, f"{o}.{p}", f"{a}.{p}", bias=tok.qkv_bias)
    linear(tab, f"{o}.o_proj", f"{a}.o_proj", bias=tok.out_bias)
    if tok.qk_norm:
        tab[f"{o}.q_norm.weight"] = norm(f"{a}.q_norm.weight", False)
        tab[f"{o}.k_norm.weight"] = norm(f"{a}.k_norm.weight", False)
    if tok.sink:
        tab[f"{o}.sinks"] = copy(f"{a}.sinks")


def _channel_entries(tab: dict, pre: str, i: int, ch, names: set[str]) -> None:
    """A dense MLP or an MoE layer (router, choice bias, experts, shared experts and their gate)."""
    m = next((p for p in (f"{pre}layers.{i}.mlp", f"{pre}layers.{i}.block_sparse_moe")
              if any(x.startswith(p + ".") for x in names)), f"{pre}layers.{i}.mlp")
    c = f"blocks.{i}.channel"
    if ch.KIND == "ffn":
        gated_mlp(tab, (f"{c}.gate_proj", f"{c}.up_proj", f"{c}.down_proj"), m, names, ch.d_ff)
        return
    tab[f"{c}.router.weight"] = copy(f"{m}.gate.weight")
    if ch.router_bias:
        tab[f"{c}.choice_bias"] = copy(next((x for x in (f"{m}.gate.e_score_correction_bias",
                                                         f"{m}.e_score_correction_bias") if x in names),
                                            f"{m}.gate.e_score_correction_bias"))
    experts(tab, c, f"{m}.experts", names, ch.n_experts)
    if ch.shared_width:
        sh = next((x for x in (f"{m}.shared_expert", f"{m}.shared_experts", f"{m}.shared_mlp")
                   if any(y.startswith(x + ".") for y in names)), f"{m}.shared_experts")
        gated_mlp(tab, (f"{c}.shared_gate_proj", f"{c}.shared_up_proj", f"{c}.shared_down_proj"), sh, names,
                  ch.shared_width)
    if ch.shared_gate:
        linear(tab, f"{c}.shared_gate", f"{m}.shared_expert_gate")


RUNS_ROPE = ("default", "linear", "llama3", "yarn")  # storelab.ops.rope.SCALINGS


def runs(decl: Decl, hf: dict) -> None:
    """What running needs beyond accounting: a rope scaling storelab's attention implements. Accounting
    (``models`` / ``memory --checkpoint``) does not depend on it and reads every kind."""
    t = text_fields(hf)
    for kind in set(layer_types(t, t.int("num_hidden_layers", minimum=1), every=decl.every)):
        rp = rope_of(t, kind)
        if rp.kind not in RUNS_ROPE:
            key = "rope_scaling" if t.has("rope_scaling") else "rope_parameters"
            raise t._err(f"{key}.rope_type", f"{rp.kind!r}: storelab's attention runs {', '.join(RUNS_ROPE)} "
                                             f"only (accounting reads it; loading weights does not)")


def family(decl: Decl) -> Family:
    """The loader's ``Family`` of a declaration."""
    return Family(name=decl.name, model_types=decl.model_types, to_config=lambda hf: to_config(decl, hf),
                  table=lambda hf, cfg, names: table(decl, hf, cfg, names),
                  ignored=lambda hf: _ignored(decl, hf), runs=lambda hf: runs(decl, hf), stores=decl.stores)


def _ignored(decl: Decl, hf: dict) -> tuple[str, ...]:
    if not decl.mtp:
        return decl.ignored
    t = text_fields(hf)
    n = t.int("num_hidden_layers", minimum=1)
    return decl.ignored + (beyond_layers(n), beyond_layers(n, r"model\.language_model\.layers\."))
