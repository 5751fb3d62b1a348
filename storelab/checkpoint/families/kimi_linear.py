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

import math

import torch

from storelab.checkpoint.families._common import (model_config, base_entries, gated_mlp, linear, mla_entries,
                                                  routed_moe, unsupported)
from storelab.checkpoint.families._family import Family, fixed
from storelab.checkpoint.families._reader import Fields
from storelab.checkpoint.table import Src, copy

NAME = "kimi_linear"
MODEL_TYPES = ("kimi_linear", "kimi_k3")
WRAPPERS = ("kimi_k3",)  # multimodal: the text model under text_config
IGNORED = (r"rotary_emb\.",)


def text_config(hf: dict) -> Fields:
    """The text model's fields: a wrapper's ``text_config``, else the config itself."""
    if hf.get("model_type") in WRAPPERS:
        return Fields(hf).sub("text_config")
    return Fields(hf)


def vision_params(hf: dict) -> int:
    """Parameters of Kimi K3's vision tower and projector (not built), from ``vision_config``; 0 without one.

    Per block (``vt_num_hidden_layers``): fused q, k, v ``[3*qkv_hidden_size, vt_hidden_size]``, output
    ``[vt_hidden_size, qkv_hidden_size]``, a two-matrix MLP of ``vt_intermediate_size`` and two RMSNorm
    weights; then a final norm, the position table ``init_pos_emb_height x init_pos_emb_width`` and the
    patch projection ``[vt_hidden_size, 3, patch, patch]`` (no biases: ``linear_bias``, ``attn_bias``,
    ``patch_embed_proj_bias`` false). The projector merges ``merge_kernel_size`` patches, W = prod x
    vt_hidden_size: ``[W, W]``, ``[text_hidden_size, W]`` and a norm of ``text_hidden_size``.
    """
    if not hf.get("vision_config"):
        return 0
    v = Fields(hf).sub("vision_config")
    for k in ("linear_bias", "attn_bias", "patch_embed_proj_bias"):
        if v.bool(k, default=False):
            raise v._err(k, "true is not supported (biases in the vision tower are not counted)")
    V, L, Q, I, P, text = (v.int(k, minimum=1) for k in ("vt_hidden_size", "vt_num_hidden_layers", "qkv_hidden_size",
                                                         "vt_intermediate_size", "patch_size", "text_hidden_size"))
    merge = v.list("merge_kernel_size")
    for j, x in enumerate(merge):
        if isinstance(x, bool) or not isinstance(x, int) or x < 1:
            raise v._err(f"merge_kernel_size[{j}]", f"must be an integer >= 1, got {x!r}")
    W = V * math.prod(merge)
    block = 3 * Q * V + V * Q + 2 * V * I + 2 * V
    tower = L * block + V + v.int("init_pos_emb_height") * v.int("init_pos_emb_width") * V + V * 3 * P * P
    return tower + W * W + text * W + text


def token_types(t: Fields, lin: Fields, n: int) -> list[str]:
    """``layer_types`` (transformers'), else Moonshot's 1-based ``linear_attn_config.kda_layers`` (and
    ``full_attn_layers``: a layer named in both is refused)."""
    if t.has("layer_types"):
        types = t.list("layer_types", n=n)
    else:
        kda = set(lin.layers("kda_layers", n=n, base=1, default=[]))
        both = kda & set(lin.layers("full_attn_layers", n=n, base=1, default=[]))
        if both:
            raise lin._err("kda_layers", f"layer {min(both)} is also in {lin.name('full_attn_layers')} "
                                         f"(a layer is one or the other)")
        types = ["linear_attention" if i + 1 in kda else "full_attention" for i in range(n)]
    for i, x in enumerate(types):
        if x not in ("linear_attention", "full_attention"):
            raise t._err(f"layer_types[{i}]", f"{x!r} is not supported (Kimi Linear has linear_attention and "
                                              f"full_attention)")
    return types


def channel_types(t: Fields, n: int) -> list[str]:
    """``mlp_layer_types``, else the first ``first_k_dense_replace`` layers (default 1) dense."""
    if t.has("mlp_layer_types"):
        types = t.list("mlp_layer_types", n=n)
        for i, x in enumerate(types):
            if x not in ("dense", "sparse"):
                raise t._err(f"mlp_layer_types[{i}]", f"must be 'dense' or 'sparse', got {x!r}")
        return types
    first = t.int("first_k_dense_replace", default=1)
    return ["dense" if i < first else "sparse" for i in range(n)]


def to_config(hf: dict):
    from storelab.models.config import LayerConfig
    from storelab.stores.depth import AttnResConfig, ResidualConfig
    from storelab.stores.ffn import FFNConfig
    from storelab.stores.mla import MLAConfig
    from storelab.stores.moe import MoEConfig
    from storelab.stores.recurrent import KDAConfig

    t = text_config(hf)
    act = t.str("hidden_act", default="silu")
    if act not in ("silu", "situ"):  # Kimi K3's SiTU-GLU: SwiGLU shapes (see the module docstring)
        raise t._err("hidden_act", f"{act!r} is not supported (only silu is implemented for this family)")
    router = t.str("moe_router_activation_func", default="sigmoid")
    if router != "sigmoid":
        raise t._err("moe_router_activation_func", f"{router!r} is not supported (Kimi's router is sigmoid)")
    n, D = t.int("num_hidden_layers", minimum=1), t.int("hidden_size", minimum=1)
    lin = t.sub("linear_attn_config", default={})
    types, mlp = token_types(t, lin, n), channel_types(t, n)
    n_group = t.int("num_expert_group", "n_group", default=1, minimum=1)
    topk_group = t.int("topk_group", default=1, minimum=1)
    if n_group > 1 and topk_group < n_group:
        raise t._err("topk_group", f"{topk_group} is not supported (grouped routing ({n_group} groups) is not "
                                   f"implemented)")
    if t.bool("attention_bias", default=False):
        raise t._err("attention_bias", "true is not supported (our MLA projections have no biases)")
    latent = t.int("routed_expert_hidden_size", default=None, minimum=1)
    if latent is not None and not t.bool("latent_moe_use_norm", default=True):
        raise t._err("latent_moe_use_norm", "false is not supported (the latent experts' RMSNorm is always applied)")
    eps = t.float("rms_norm_eps", default=1e-5, positive=True)
    block = t.int("attn_res_block_size", default=None, minimum=1)
    depth = ResidualConfig(d_model=D) if block is None else AttnResConfig(d_model=D, group_size=block)
    layers = []
    for i in range(n):
        if types[i] == "linear_attention":
            K = t.int("linear_head_dim", minimum=1) if t.has("linear_head_dim") else lin.int("head_dim", minimum=1)
            H = t.int("linear_num_heads", minimum=1) if t.has("linear_num_heads") else lin.int("num_heads", minimum=1)
            W = (t.int("linear_conv_kernel_dim", minimum=1) if t.has("linear_conv_kernel_dim")
                 else lin.int("short_conv_kernel_size", minimum=1))
            token = KDAConfig(d_model=D, n_heads=H, head_k_dim=K, head_v_dim=K, gate_rank=K,
                              gate_lower_bound=lin.float("gate_lower_bound", default=None),
                              full_rank_output_gate=lin.bool("use_full_rank_gate", default=False),
                              conv_kernel=W, norm_eps=eps)
        else:
            token = MLAConfig(d_model=D, n_heads=t.int("num_attention_heads", minimum=1),
                              kv_lora_rank=t.int("kv_lora_rank", minimum=1),
                              qk_nope_head_dim=t.int("qk_nope_head_dim", minimum=1),
                              qk_rope_head_dim=t.int("qk_rope_head_dim"), v_head_dim=t.int("v_head_dim", minimum=1),
                              q_lora_rank=t.int("q_lora_rank", default=None, minimum=1), use_rope=False,
                              output_gate=t.bool("mla_use_output_gate", default=False), norm_eps=1e-6)
        if mlp[i] == "dense":
            channel = FFNConfig(d_model=D, d_ff=t.int("intermediate_size", minimum=1))
        else:
            channel = MoEConfig(d_model=D, n_experts=t.int("num_experts", "n_routed_experts", minimum=1),
                                top_k=t.int("num_experts_per_token", "num_experts_per_tok", minimum=1),
                                d_expert=t.int("moe_intermediate_size", minimum=1), router="sigmoid",
                                router_bias=True,
                                norm_topk_prob=t.bool("moe_renormalize", "norm_topk_prob", default=True),
                                routed_scaling=t.float("routed_scaling_factor", default=1.0, positive=True),
                                n_shared=t.int("num_shared_experts", "n_shared_experts", default=0),
                                d_shared=t.int("moe_intermediate_size"), latent_dim=latent, norm_eps=eps)
        layers.append(LayerConfig(token=token, channel=channel, depth=depth))
    vision = vision_params(hf)
    notes = (f"vision tower and projector (vision_config; not built, counted apart): {vision:,} parameters"
             if vision else "")
    cfg = model_config(hf, t, name="kimi-linear", title="Kimi Linear (checkpoint)", d_model=D, layers=layers,
                       norm_eps=eps, context=t.int("model_max_length", "max_position_embeddings", default=0))
    cfg.notes = notes
    return cfg


def runs(hf: dict) -> None:
    """Kimi K3's SiTU-GLU has no storelab activation: its config is accounted, not run."""
    if text_config(hf).str("hidden_act", default="silu") == "situ":
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
