"""Kimi Linear (Moonshot, arXiv 2510.26692; Kimi K3's family): KDA layers and MLA layers
without RoPE, MoE with sigmoid routing, a choice bias and shared experts.

| ours                                   | transformers (``KimiLinearForCausalLM``)         |
|----------------------------------------|--------------------------------------------------|
| embed.weight                           | model.embed_tokens.weight                        |
| blocks.i.norm_token / norm_channel     | model.layers.i.input_layernorm / post_attention_layernorm |
| blocks.i.token.{q,k,v,o}_proj (kda)    | model.layers.i.self_attn.{q,k,v,o}_proj          |
| blocks.i.token.conv_weight (kda)       | model.layers.i.self_attn.{q,k,v}_conv1d.weight joined, [C, 1, W] -> [C, W] |
| blocks.i.token.f_a_proj, f_b_proj, dt_bias, A_log (kda) | ...self_attn.f_a_proj, f_b_proj, dt_bias, A_log [1, 1, H, 1] -> [H] |
| blocks.i.token.b_proj, g_a_proj, g_b_proj, o_norm (kda) | ...self_attn.b_proj, g_a_proj, g_b_proj, o_norm.weight |
| blocks.i.token.q_proj / q_down, q_norm, q_up (mla) | ...self_attn.q_proj / q_a_proj, q_a_layernorm, q_b_proj |
| blocks.i.token.kv_down, kv_norm, kv_up, out (mla) | ...self_attn.kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj |
| blocks.i.channel.{gate,up,down}_proj   | model.layers.i.block_sparse_moe.{gate,up,down}_proj (dense; or mlp.*) |
| blocks.i.channel.router / choice_bias  | ...block_sparse_moe.gate.weight / gate.e_score_correction_bias |
| blocks.i.channel.gate_up / down        | ...block_sparse_moe.experts.{e}.w1, w3 / w2 (or 3-D)  |
| blocks.i.channel.shared_{gate,up,down}_proj | ...block_sparse_moe.shared_experts.{gate,up,down}_proj |
| norm.weight, lm_head.weight            | model.norm.weight, lm_head.weight                |

The config may be transformers' (``layer_types``, ``mlp_layer_types``, ``linear_head_dim``) or
Moonshot's (``linear_attn_config`` with 1-based ``kda_layers``, ``first_k_dense_replace``).
"""

from __future__ import annotations

import torch

from storelab.checkpoint.families._common import (layer_prefix, model_config,
                                                  base_entries, check_act, field, gated_mlp, linear,
                                                  mla_entries, routed_moe, unsupported)
from storelab.checkpoint.families._family import Family, fixed
from storelab.checkpoint.table import Src, copy

NAME = "kimi_linear"
MODEL_TYPES = ("kimi_linear",)
IGNORED = (r"rotary_emb\.",)


def _first(hf: dict, *keys, default=None):
    for k in keys:
        if hf.get(k) is not None:
            return hf[k]
    if default is None:
        raise unsupported(keys[0], None, "missing from config.json")
    return default


def to_config(hf: dict):
    from storelab.models.config import LayerConfig
    from storelab.stores.depth import ResidualConfig
    from storelab.stores.ffn import FFNConfig
    from storelab.stores.mla import MLAConfig
    from storelab.stores.moe import MoEConfig
    from storelab.stores.recurrent import KDAConfig

    check_act(hf)
    n, D = field(hf, "num_hidden_layers"), field(hf, "hidden_size")
    lin = hf.get("linear_attn_config") or {}
    types = hf.get("layer_types")
    if types is None:
        kda = set(lin.get("kda_layers", []))
        types = ["linear_attention" if i + 1 in kda else "full_attention" for i in range(n)]
    mlp_types = hf.get("mlp_layer_types") or ["dense" if i < hf.get("first_k_dense_replace", 1) else "sparse"
                                              for i in range(n)]
    n_group, topk_group = _first(hf, "num_expert_group", "n_group", default=1), _first(hf, "topk_group", default=1)
    if n_group > 1 and topk_group < n_group:
        raise unsupported("topk_group", topk_group, f"grouped routing ({n_group} groups) is not implemented")
    if field(hf, "attention_bias", False):
        raise unsupported("attention_bias", True, "our MLA projections have no biases")
    eps = field(hf, "rms_norm_eps", 1e-5)
    K = _first(hf, "linear_head_dim", default=lin.get("head_dim"))
    layers = []
    for i in range(n):
        if types[i] == "linear_attention":
            token = KDAConfig(d_model=D, n_heads=_first(hf, "linear_num_heads", default=lin.get("num_heads")),
                              head_k_dim=K, head_v_dim=K, gate_rank=K, gate_lower_bound=None,
                              conv_kernel=_first(hf, "linear_conv_kernel_dim",
                                                 default=lin.get("short_conv_kernel_size")),
                              norm_eps=eps)
        elif types[i] == "full_attention":
            token = MLAConfig(d_model=D, n_heads=field(hf, "num_attention_heads"),
                              kv_lora_rank=field(hf, "kv_lora_rank"),
                              qk_nope_head_dim=field(hf, "qk_nope_head_dim"),
                              qk_rope_head_dim=field(hf, "qk_rope_head_dim"), v_head_dim=field(hf, "v_head_dim"),
                              q_lora_rank=hf.get("q_lora_rank"), use_rope=False, norm_eps=1e-6)
        else:
            raise unsupported(f"layer_types[{i}]", types[i], "Kimi Linear has linear_attention and full_attention")
        if mlp_types[i] == "dense":
            channel = FFNConfig(d_model=D, d_ff=field(hf, "intermediate_size"))
        else:
            channel = MoEConfig(d_model=D, n_experts=_first(hf, "num_experts", "n_routed_experts"),
                                top_k=_first(hf, "num_experts_per_token", "num_experts_per_tok"),
                                d_expert=field(hf, "moe_intermediate_size"), router="sigmoid", router_bias=True,
                                norm_topk_prob=bool(_first(hf, "moe_renormalize", "norm_topk_prob", default=True)),
                                routed_scaling=float(field(hf, "routed_scaling_factor", 1.0)),
                                n_shared=_first(hf, "num_shared_experts", "n_shared_experts", default=0),
                                d_shared=field(hf, "moe_intermediate_size"))
        layers.append(LayerConfig(token=token, channel=channel, depth=ResidualConfig(d_model=D)))
    return model_config(hf, hf, name="kimi-linear", title="Kimi Linear (checkpoint)", d_model=D, layers=layers,
                        norm_eps=eps, context=_first(hf, "model_max_length", "max_position_embeddings", default=0))


def table(hf: dict, cfg, names: set[str]) -> dict:
    tab: dict = {}
    base_entries(tab, cfg)
    for i, lay in enumerate(cfg.layers):
        a, o = f"model.layers.{i}.self_attn", f"blocks.{i}.token"
        if lay.token.KIND == "kda":
            for p in ("q_proj", "k_proj", "v_proj", "o_proj", "b_proj", "f_a_proj", "f_b_proj", "g_a_proj", "g_b_proj"):
                linear(tab, f"{o}.{p}", f"{a}.{p}")
            if f"{a}.conv1d.weight" in names:
                tab[f"{o}.conv_weight"] = Src((f"{a}.conv1d.weight",), lambda w: w.squeeze(1), "[C, 1, W] -> [C, W]")
            else:
                convs = tuple(f"{a}.{p}_conv1d.weight" for p in "qkv")
                tab[f"{o}.conv_weight"] = Src(convs, lambda *ws: torch.cat(ws, 0).squeeze(1),
                                              "q, k, v convolutions joined, [C, 1, W] -> [C, W]")
            tab[f"{o}.A_log"] = Src((f"{a}.A_log",), lambda w: w.reshape(-1), "[1, 1, H, 1] -> [H]")
            tab[f"{o}.dt_bias"] = copy(f"{a}.dt_bias")
            tab[f"{o}.o_norm"] = copy(f"{a}.o_norm.weight")
        else:
            mla_entries(tab, o, a, lay.token)
        m = next((p for p in (f"model.layers.{i}.block_sparse_moe", f"model.layers.{i}.mlp")
                  if any(n.startswith(p + ".") for n in names)), f"model.layers.{i}.block_sparse_moe")
        c, ch = f"blocks.{i}.channel", lay.channel
        if ch.KIND == "ffn":
            gated_mlp(tab, (f"{c}.gate_proj", f"{c}.up_proj", f"{c}.down_proj"), m, names, ch.d_ff)
        else:
            routed_moe(tab, c, m, names, ch)
    return tab


FAMILY = Family(name=NAME, model_types=MODEL_TYPES, to_config=to_config, table=table, ignored=fixed(*IGNORED))
