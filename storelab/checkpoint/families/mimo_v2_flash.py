"""MiMo-V2-Flash (Xiaomi, arXiv 2610.11959): window attention with learned sinks and full
attention, MoE with sigmoid routing and a choice bias.

| ours                                   | transformers (``MiMoV2FlashForCausalLM``)        |
|----------------------------------------|--------------------------------------------------|
| embed.weight                           | model.embed_tokens.weight                        |
| blocks.i.norm_token / norm_channel     | model.layers.i.input_layernorm / post_attention_layernorm |
| blocks.i.token.{q,k,v,o}_proj          | model.layers.i.self_attn.{q,k,v,o}_proj          |
| blocks.i.token.sinks (window layers)   | model.layers.i.self_attn.attention_sink_bias (or .sinks) |
| blocks.i.channel.{gate,up,down}_proj   | model.layers.i.mlp.{gate,up,down}_proj (dense)   |
| blocks.i.channel.router / choice_bias  | model.layers.i.mlp.gate.weight / .e_score_correction_bias |
| blocks.i.channel.gate_up / down        | model.layers.i.mlp.experts.gate_up_proj / down_proj (or per expert) |
| norm.weight, lm_head.weight            | model.norm.weight, lm_head.weight                |

Config: ``sliding_window`` counts the query (129 = 128 earlier tokens + itself): our
``window`` is one less. Window layers have twice the key/value heads and a sink per head.
The MTP layers (``model.mtp.*``) are not part of the causal LM and are ignored.

MiMo-V2.5 (``mimo_v2``, remote code ``MiMoV2ForCausalLM``) is the same decoder under an omnimodal wrapper; its
config.json is read as its own modeling file reads it, where transformers' ``mimo_v2_flash`` fixes values instead:
``hybrid_layer_pattern`` (0 full, 1 window) and ``moe_layer_freq`` (0 dense, 1 experts) place the layers;
``rope_theta`` (10,000,000 in V2.5, not Flash's fixed 5,000,000) and ``swa_rope_theta``, the top-level
``partial_rotary_factor``; the window layers' own ``swa_num_attention_heads``, ``swa_num_key_value_heads``,
``swa_head_dim``, ``swa_v_head_dim``; sinks where ``add_swa_attention_sink_bias`` /
``add_full_attention_sink_bias``; eps ``layernorm_epsilon``. Its vision tower, audio encoder and speech embeddings
(``visual.*``, ``audio_encoder.*``, ``speech_embeddings.*``) are not the text model's and are ignored. Accounted,
not run: its attention is one fused ``self_attn.qkv_proj`` (FP8, ``attention_projection_layout`` "fused_qkv") whose
row order no implementation here checks.
"""

from __future__ import annotations

from storelab.checkpoint.families._common import model_config, base_entries, either, experts, linear
from storelab.checkpoint.families._family import Family, fixed
from storelab.checkpoint.families._reader import Fields
from storelab.checkpoint.table import copy

NAME = "mimo_v2_flash"
REMOTE = "mimo_v2"  # MiMo-V2.5
MODEL_TYPES = ("mimo_v2_flash", REMOTE)
IGNORED = (r"^model\.mtp\.", r"rotary_emb\.", r"^visual\.", r"^audio_encoder\.", r"^speech_embeddings\.")


ROPE_DEFAULTS = {"full_attention": 5_000_000.0, "sliding_attention": 10_000.0}  # MiMoV2FlashConfig's


def _types(t: Fields, n: int) -> tuple[list[str], list[str]]:
    """(token mixer, channel) per layer: ``layer_types`` / ``mlp_layer_types``, else transformers' defaults
    (layer 0 and every sixth full attention, the rest a window; layer 0 dense, the rest experts)."""
    if t.has("layer_types"):
        types = t.list("layer_types", n=n)
        for i, x in enumerate(types):
            if x not in ROPE_DEFAULTS:
                raise t._err(f"layer_types[{i}]", f"{x!r} is not supported (MiMo has full_attention and "
                                                  f"sliding_attention layers)")
    else:
        types = ["full_attention" if i == 0 or (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)]
    mlp = t.list("mlp_layer_types", n=n) if t.has("mlp_layer_types") else ["dense"] + ["sparse"] * (n - 1)
    return types, mlp


def _remote_types(t: Fields, n: int) -> tuple[list[str], list[str]]:
    """MiMo-V2.5's per-layer lists: ``hybrid_layer_pattern`` 0 full / 1 window, ``moe_layer_freq`` 0 dense / 1 experts."""
    out = []
    for key, names in (("hybrid_layer_pattern", ("full_attention", "sliding_attention")), ("moe_layer_freq",
                                                                                           ("dense", "sparse"))):
        v = t.list(key, n=n)
        for i, x in enumerate(v):
            if x not in (0, 1) or isinstance(x, bool):
                raise t._err(f"{key}[{i}]", f"must be 0 or 1, got {x!r}")
        out.append([names[x] for x in v])
    return out[0], out[1]


def _rope(t: Fields, kind: str) -> tuple[float, float]:
    """(theta, rotated fraction) of a layer type: ``rope_parameters[kind]``, else transformers' defaults
    (MiMo-V2.5: ``rope_theta`` / ``swa_rope_theta`` and ``partial_rotary_factor``)."""
    if t.str("model_type", default="") == REMOTE:
        key = "rope_theta" if kind == "full_attention" else "swa_rope_theta"
        return (t.float(key, default=ROPE_DEFAULTS[kind], positive=True),
                t.float("partial_rotary_factor", default=0.334, minimum=0.0, maximum=1.0))
    if not t.has("rope_parameters"):
        return ROPE_DEFAULTS[kind], 0.334
    rp = t.sub("rope_parameters").sub(kind, default={})
    rope_type = rp.str("rope_type", "type", default="default")
    if rope_type != "default":
        raise rp._err("rope_type", f"{rope_type!r} is not supported (only plain RoPE is implemented)")
    return (rp.float("rope_theta", default=10000.0, positive=True),
            rp.float("partial_rotary_factor", default=0.334, minimum=0.0, maximum=1.0))


def _window(t: Fields) -> int:
    """transformers' window (the query included): ``sliding_window``, or the reference's
    ``sliding_window_size`` (earlier tokens only) + 1."""
    if t.has("sliding_window_size"):
        return t.int("sliding_window_size", minimum=1) + 1
    return t.int("sliding_window", minimum=2)


def to_config(hf: dict):
    from storelab.models.config import LayerConfig
    from storelab.stores.attention import AttentionConfig, WindowConfig
    from storelab.stores.depth import ResidualConfig
    from storelab.stores.ffn import FFNConfig
    from storelab.stores.moe import MoEConfig

    t = Fields(hf)
    act = t.str("hidden_act", default="silu")
    if act != "silu":
        raise t._err("hidden_act", f"{act!r} is not supported (only silu is implemented for this family)")
    n = t.int("num_hidden_layers", minimum=1)
    D = t.int("hidden_size", minimum=1)
    H, G = t.int("num_attention_heads", minimum=1), t.int("num_key_value_heads", minimum=1)
    K = t.int("head_dim", default=D // H, minimum=1)
    V = t.int("v_head_dim", default=K, minimum=1)
    remote = t.str("model_type", default="") == REMOTE
    types, mlp_types = _remote_types(t, n) if remote else _types(t, n)
    # the window layers' heads: MiMo-V2.5 names them, transformers doubles the key/value heads
    swa = dict(n_heads=t.int("swa_num_attention_heads", default=H, minimum=1),
               n_kv_heads=t.int("swa_num_key_value_heads", default=2 * G, minimum=1),
               head_dim=t.int("swa_head_dim", default=K, minimum=1),
               v_head_dim=t.int("swa_v_head_dim", default=V, minimum=1)) if remote else dict(n_kv_heads=2 * G)
    sinks = {"full_attention": t.bool("add_full_attention_sink_bias", default=False),
             "sliding_attention": t.bool("add_swa_attention_sink_bias", default=True)} if remote else {}
    eps = t.float("rms_norm_eps", "layernorm_epsilon", default=1e-5, positive=True)
    n_group, topk_group = t.int("n_group", default=1, minimum=1), t.int("topk_group", default=1, minimum=1)
    if n_group > 1 and topk_group < n_group:
        raise t._err("topk_group", f"{topk_group} is not supported (grouped routing ({n_group} groups) is not "
                                   f"implemented)")
    attn = dict(d_model=D, qkv_bias=t.bool("attention_bias", default=False),
                value_scale=t.float("attention_value_scale", default=1.0, positive=True), norm_eps=eps)
    full = dict(n_heads=H, head_dim=K, v_head_dim=V, n_kv_heads=G)
    layers = []
    for i in range(n):
        theta, partial = _rope(t, types[i])
        if types[i] == "full_attention":
            token = AttentionConfig(rope_theta=theta, partial_rotary=partial, sink=sinks.get(types[i], False),
                                    **full, **attn)
        else:
            token = WindowConfig(window=_window(t) - 1, sink=sinks.get(types[i], True), rope_theta=theta,
                                 partial_rotary=partial, **{**full, **swa}, **attn)
        if mlp_types[i] == "dense":
            channel = FFNConfig(d_model=D, d_ff=t.int("intermediate_size", minimum=1))
        else:
            channel = MoEConfig(d_model=D, n_experts=t.int("n_routed_experts", minimum=1),
                                top_k=t.int("num_experts_per_tok", minimum=1),
                                d_expert=t.int("moe_intermediate_size", minimum=1), router="sigmoid",
                                router_bias=True, norm_topk_prob=t.bool("norm_topk_prob", default=True),
                                routed_scaling=t.float("routed_scaling_factor", default=1.0, positive=True))
        layers.append(LayerConfig(token=token, channel=channel, depth=ResidualConfig(d_model=D)))
    return model_config(hf, t, name="mimo-v2.5" if remote else "mimo-v2-flash", norm_eps=eps, d_model=D,
                        title="MiMo-V2.5 (checkpoint)" if remote else "MiMo-V2-Flash (checkpoint)", layers=layers)


def runs(hf: dict) -> None:
    t = Fields(hf)
    if t.str("model_type", default="") == REMOTE:
        raise t._err("attention_projection_layout", f"{t.str('attention_projection_layout', default='fused_qkv')!r}: "
                     "MiMo-V2.5 is accounted, not run (its fused FP8 qkv_proj's row order is held to no "
                     "implementation here)")


def table(hf: dict, cfg, names: set[str]) -> dict:
    tab: dict = {}
    base_entries(tab, cfg)
    for i, lay in enumerate(cfg.layers):
        a, o = f"model.layers.{i}.self_attn", f"blocks.{i}.token"
        for p in ("q_proj", "k_proj", "v_proj"):
            linear(tab, f"{o}.{p}", f"{a}.{p}", bias=lay.token.qkv_bias)
        linear(tab, f"{o}.o_proj", f"{a}.o_proj")
        if lay.token.sink:
            tab[f"{o}.sinks"] = copy(either(names, f"{a}.attention_sink_bias", f"{a}.sinks"))
        m, c = f"model.layers.{i}.mlp", f"blocks.{i}.channel"
        if lay.channel.KIND == "ffn":
            for p in ("gate_proj", "up_proj", "down_proj"):
                linear(tab, f"{c}.{p}", f"{m}.{p}")
        else:
            tab[f"{c}.router.weight"] = copy(f"{m}.gate.weight")
            tab[f"{c}.choice_bias"] = copy(f"{m}.gate.e_score_correction_bias")
            experts(tab, c, f"{m}.experts", names, lay.channel.n_experts)
    return tab


FAMILY = Family(stores=("window", "attention", "ffn", "moe", "residual"), runs=runs,
                name=NAME, model_types=MODEL_TYPES, to_config=to_config, table=table, ignored=fixed(*IGNORED),
                oracle="transformers 5.23 (mimo_v2_flash): logits, prefill-then-step, cache bytes and parameters of its "
                       "tiny model; MiMo-V2.5 (mimo_v2): accounting only, its text parameters counted against its "
                       "published tensor list")
