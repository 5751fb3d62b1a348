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
"""

from __future__ import annotations

from storelab.checkpoint.families._common import (layer_prefix, model_config,
                                                  base_entries, check_act, either, experts, field, linear, rope,
                                                  unsupported)
from storelab.checkpoint.families._family import Family, fixed
from storelab.checkpoint.table import copy

NAME = "mimo_v2_flash"
MODEL_TYPES = ("mimo_v2_flash",)
IGNORED = (r"^model\.mtp\.", r"rotary_emb\.")


def normalized(hf: dict) -> dict:
    """The config with transformers' defaults filled in (``MiMoV2FlashConfig.__post_init__``)."""
    hf = dict(hf)
    n = field(hf, "num_hidden_layers")
    if hf.get("layer_types") is None:
        hf["layer_types"] = ["full_attention" if i == 0 or (i + 1) % 6 == 0 else "sliding_attention" for i in range(n)]
    if hf.get("mlp_layer_types") is None:
        hf["mlp_layer_types"] = ["dense"] + ["sparse"] * (n - 1)
    if hf.get("rope_parameters") is None:
        hf["rope_parameters"] = {
            "full_attention": {"rope_type": "default", "rope_theta": 5_000_000.0, "partial_rotary_factor": 0.334},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0, "partial_rotary_factor": 0.334}}
    if hf.get("sliding_window_size") is not None:  # the reference's count: earlier tokens, without the query
        hf["sliding_window"] = hf["sliding_window_size"] + 1
    return hf


def to_config(hf: dict):
    from storelab.models.config import LayerConfig
    from storelab.stores.attention import AttentionConfig, WindowConfig
    from storelab.stores.depth import ResidualConfig
    from storelab.stores.ffn import FFNConfig
    from storelab.stores.moe import MoEConfig

    hf = normalized(hf)
    check_act(hf)
    n = field(hf, "num_hidden_layers")
    D = field(hf, "hidden_size")
    H, G = field(hf, "num_attention_heads"), field(hf, "num_key_value_heads")
    K = field(hf, "head_dim", D // H)
    V = field(hf, "v_head_dim", K)
    types = field(hf, "layer_types")
    mlp_types = field(hf, "mlp_layer_types")
    eps = field(hf, "rms_norm_eps", 1e-5)
    n_group, topk_group = field(hf, "n_group", 1), field(hf, "topk_group", 1)
    if n_group > 1 and topk_group < n_group:
        raise unsupported("topk_group", topk_group, f"grouped routing ({n_group} groups) is not implemented")
    rp = field(hf, "rope_parameters")
    attn = dict(d_model=D, n_heads=H, head_dim=K, v_head_dim=V, qkv_bias=bool(field(hf, "attention_bias", False)),
                value_scale=float(field(hf, "attention_value_scale", 1.0)), norm_eps=eps)
    layers = []
    for i in range(n):
        t = types[i]
        if t == "full_attention":
            theta, partial = rope(rp.get(t), where=f"rope_parameters.{t}", default_partial=0.334)
            token = AttentionConfig(n_kv_heads=G, rope_theta=theta, partial_rotary=partial, **attn)
        elif t == "sliding_attention":
            theta, partial = rope(rp.get(t), where=f"rope_parameters.{t}", default_partial=0.334)
            token = WindowConfig(window=field(hf, "sliding_window") - 1, n_kv_heads=2 * G, sink=True,
                                 rope_theta=theta, partial_rotary=partial, **attn)
        else:
            raise unsupported(f"layer_types[{i}]", t, "MiMo has full_attention and sliding_attention layers")
        if mlp_types[i] == "dense":
            channel = FFNConfig(d_model=D, d_ff=field(hf, "intermediate_size"))
        else:
            channel = MoEConfig(d_model=D, n_experts=field(hf, "n_routed_experts"),
                                top_k=field(hf, "num_experts_per_tok"),
                                d_expert=field(hf, "moe_intermediate_size"), router="sigmoid", router_bias=True,
                                norm_topk_prob=bool(field(hf, "norm_topk_prob", True)),
                                routed_scaling=float(field(hf, "routed_scaling_factor", 1.0)))
        layers.append(LayerConfig(token=token, channel=channel, depth=ResidualConfig(d_model=D)))
    return model_config(hf, hf, name="mimo-v2-flash", title="MiMo-V2-Flash (checkpoint)", d_model=D, layers=layers,
                        norm_eps=eps)


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


FAMILY = Family(stores=("window", "attention", "ffn", "moe", "residual"),
                name=NAME, model_types=MODEL_TYPES, to_config=to_config, table=table, ignored=fixed(*IGNORED))
