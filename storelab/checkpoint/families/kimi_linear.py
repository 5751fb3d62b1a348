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

Kimi K3 (``model_type`` "kimi_k3", Moonshot's remote code): a multimodal wrapper whose
``text_config`` is this family's text model, read by its published field names:
``linear_attn_config.gate_lower_bound`` (the bounded forget gate) and ``use_full_rank_gate``
(the KDA output gate ``g_proj [H*V, D]``, ``KDAConfig.full_rank_output_gate``),
``mla_use_nope`` / ``mla_use_output_gate`` (MLA without rotary, with a sigmoid output gate),
``routed_expert_hidden_size`` (Stable LatentMoE: the routed experts work at that width, after a
down-projection and RMSNorm, ``latent_moe_use_norm``), ``attn_res_block_size`` (AttnRes over
groups of that many layers, one query and norm per sublayer: ``attnres``) and
``moe_router_activation_func``. Its ``hidden_act`` "situ" (SiTU-GLU, ``activation_situ_beta``,
``activation_situ_linear_beta``) has no storelab activation: the units are SwiGLU of the same
shapes, so the accounting is exact but the weights are not loaded (``runs`` refuses them).
The vision tower and projector (``vision_config``: MoonViT blocks, patch merger) are not
built; ``vision_params`` counts them apart, from the config, and the model's notes say how many.
"""

from __future__ import annotations

import torch

from storelab.checkpoint.families._common import (layer_prefix, model_config,
                                                  base_entries, check_act, field, gated_mlp, linear,
                                                  mla_entries, routed_moe, unsupported)
from storelab.checkpoint.families._family import Family, fixed
from storelab.checkpoint.table import Src, copy

NAME = "kimi_linear"
MODEL_TYPES = ("kimi_linear", "kimi_k3")
WRAPPERS = ("kimi_k3",)  # multimodal: the text model under text_config
IGNORED = (r"rotary_emb\.",)


def _first(hf: dict, *keys, default=None):
    for k in keys:
        if hf.get(k) is not None:
            return hf[k]
    if default is None:
        raise unsupported(keys[0], None, "missing from config.json")
    return default


def text_config(hf: dict) -> dict:
    """The text model's fields: a wrapper's ``text_config``, else the config itself."""
    if hf.get("model_type") in WRAPPERS:
        t = field(hf, "text_config")
        if not isinstance(t, dict):
            raise unsupported("text_config", t, "expected the text model's config (a JSON object)")
        return t
    return hf


def vision_params(hf: dict) -> int:
    """Parameters of Kimi K3's vision tower and projector (not built), from ``vision_config``; 0 without one.

    Per block (``vt_num_hidden_layers``): fused q, k, v ``[3*qkv_hidden_size, vt_hidden_size]``, output
    ``[vt_hidden_size, qkv_hidden_size]``, a two-matrix MLP of ``vt_intermediate_size`` and two RMSNorm
    weights; then a final norm, the position table ``init_pos_emb_height x init_pos_emb_width`` and the
    patch projection ``[vt_hidden_size, 3, patch, patch]`` (no biases: ``linear_bias``, ``attn_bias``,
    ``patch_embed_proj_bias`` false). The projector merges ``merge_kernel_size`` patches, W = prod x
    vt_hidden_size: ``[W, W]``, ``[text_hidden_size, W]`` and a norm of ``text_hidden_size``.
    """
    v = hf.get("vision_config")
    if not v:
        return 0
    for k in ("linear_bias", "attn_bias", "patch_embed_proj_bias"):
        if v.get(k):
            raise unsupported(f"vision_config.{k}", v[k], "biases in the vision tower are not counted")
    V, L, Q, I = (field(v, k) for k in ("vt_hidden_size", "vt_num_hidden_layers", "qkv_hidden_size",
                                        "vt_intermediate_size"))
    P, text = field(v, "patch_size"), field(v, "text_hidden_size")
    W = V * int(torch.tensor(field(v, "merge_kernel_size")).prod())
    block = 3 * Q * V + V * Q + 2 * V * I + 2 * V
    tower = L * block + V + field(v, "init_pos_emb_height") * field(v, "init_pos_emb_width") * V + V * 3 * P * P
    return tower + W * W + text * W + text


def to_config(hf: dict):
    from storelab.models.config import LayerConfig
    from storelab.stores.depth import AttnResConfig, ResidualConfig
    from storelab.stores.ffn import FFNConfig
    from storelab.stores.mla import MLAConfig
    from storelab.stores.moe import MoEConfig
    from storelab.stores.recurrent import KDAConfig

    t = text_config(hf)
    if t.get("hidden_act") != "situ":  # Kimi K3's SiTU-GLU: SwiGLU shapes (see the module docstring)
        check_act(t)
    router = t.get("moe_router_activation_func", "sigmoid")
    if router != "sigmoid":
        raise unsupported("moe_router_activation_func", router, "Kimi's router is sigmoid")
    n, D = field(t, "num_hidden_layers"), field(t, "hidden_size")
    lin = t.get("linear_attn_config") or {}
    types = t.get("layer_types")
    if types is None:
        kda = set(lin.get("kda_layers", []))
        types = ["linear_attention" if i + 1 in kda else "full_attention" for i in range(n)]
    mlp_types = t.get("mlp_layer_types") or ["dense" if i < t.get("first_k_dense_replace", 1) else "sparse"
                                             for i in range(n)]
    n_group, topk_group = _first(t, "num_expert_group", "n_group", default=1), _first(t, "topk_group", default=1)
    if n_group > 1 and topk_group < n_group:
        raise unsupported("topk_group", topk_group, f"grouped routing ({n_group} groups) is not implemented")
    if field(t, "attention_bias", False):
        raise unsupported("attention_bias", True, "our MLA projections have no biases")
    latent = t.get("routed_expert_hidden_size")
    if latent is not None and not t.get("latent_moe_use_norm", True):
        raise unsupported("latent_moe_use_norm", False, "the latent experts' RMSNorm is always applied")
    eps = field(t, "rms_norm_eps", 1e-5)
    K = _first(t, "linear_head_dim", default=lin.get("head_dim"))
    block = t.get("attn_res_block_size")
    depth = ResidualConfig(d_model=D) if block is None else AttnResConfig(d_model=D, group_size=block)
    layers = []
    for i in range(n):
        if types[i] == "linear_attention":
            token = KDAConfig(d_model=D, n_heads=_first(t, "linear_num_heads", default=lin.get("num_heads")),
                              head_k_dim=K, head_v_dim=K, gate_rank=K, gate_lower_bound=lin.get("gate_lower_bound"),
                              full_rank_output_gate=bool(lin.get("use_full_rank_gate", False)),
                              conv_kernel=_first(t, "linear_conv_kernel_dim",
                                                 default=lin.get("short_conv_kernel_size")),
                              norm_eps=eps)
        elif types[i] == "full_attention":
            token = MLAConfig(d_model=D, n_heads=field(t, "num_attention_heads"),
                              kv_lora_rank=field(t, "kv_lora_rank"),
                              qk_nope_head_dim=field(t, "qk_nope_head_dim"),
                              qk_rope_head_dim=field(t, "qk_rope_head_dim"), v_head_dim=field(t, "v_head_dim"),
                              q_lora_rank=t.get("q_lora_rank"), use_rope=False,
                              output_gate=bool(t.get("mla_use_output_gate", False)), norm_eps=1e-6)
        else:
            raise unsupported(f"layer_types[{i}]", types[i], "Kimi Linear has linear_attention and full_attention")
        if mlp_types[i] == "dense":
            channel = FFNConfig(d_model=D, d_ff=field(t, "intermediate_size"))
        else:
            channel = MoEConfig(d_model=D, n_experts=_first(t, "num_experts", "n_routed_experts"),
                                top_k=_first(t, "num_experts_per_token", "num_experts_per_tok"),
                                d_expert=field(t, "moe_intermediate_size"), router="sigmoid", router_bias=True,
                                norm_topk_prob=bool(_first(t, "moe_renormalize", "norm_topk_prob", default=True)),
                                routed_scaling=float(field(t, "routed_scaling_factor", 1.0)),
                                n_shared=_first(t, "num_shared_experts", "n_shared_experts", default=0),
                                d_shared=field(t, "moe_intermediate_size"), latent_dim=latent, norm_eps=eps)
        layers.append(LayerConfig(token=token, channel=channel, depth=depth))
    vision = vision_params(hf)
    notes = (f"vision tower and projector (vision_config; not built, counted apart): {vision:,} parameters"
             if vision else "")
    cfg = model_config(hf, t, name="kimi-linear", title="Kimi Linear (checkpoint)", d_model=D, layers=layers,
                       norm_eps=eps, context=_first(t, "model_max_length", "max_position_embeddings", default=0))
    cfg.notes = notes
    return cfg


def runs(hf: dict) -> None:
    """Kimi K3's SiTU-GLU has no storelab activation: its config is accounted, not run."""
    if text_config(hf).get("hidden_act") == "situ":
        raise unsupported("hidden_act", "situ", "SiTU-GLU has no storelab activation: Kimi K3 is read for "
                          "accounting only (storelab models / memory --checkpoint), its weights are not loaded")


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


FAMILY = Family(stores=("kda", "mla", "ffn", "moe", "attnres", "residual"),
                name=NAME, model_types=MODEL_TYPES, to_config=to_config, table=table, ignored=fixed(*IGNORED),
                runs=runs)
