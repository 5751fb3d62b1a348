"""MiniMax-M3's language model (arXiv 2606.13392): full attention and MSA block-sparse
attention, MoE with sigmoid routing, a choice bias and a shared expert; the vision tower
and projector of the VL checkpoint are left out.

| ours                                   | transformers (``MiniMaxM3VLForCausalLM``; VL: ``model.language_model.``) |
|----------------------------------------|--------------------------------------------------|
| embed.weight                           | model.embed_tokens.weight                        |
| blocks.i.norm_token / norm_channel     | 1 + model.layers.i.input_layernorm / post_attention_layernorm |
| blocks.i.token.{q,k,v,o}_proj          | model.layers.i.self_attn.{q,k,v,o}_proj          |
| blocks.i.token.{q,k}_norm              | 1 + model.layers.i.self_attn.{q,k}_norm          |
| blocks.i.token.index_{q,k} (msa)       | model.layers.i.self_attn.indexer.{q,k}_proj (release: index_{q,k}_proj) |
| blocks.i.token.index_{q,k}_norm (msa)  | 1 + model.layers.i.self_attn.indexer.{q,k}_norm (release: index_{q,k}_norm) |
| blocks.i.channel.{gate,up}_proj (dense)| model.layers.i.mlp.gate_up_proj rows [:I], [I:] (release: gate_proj, up_proj) |
| blocks.i.channel.router / choice_bias  | model.layers.i.mlp.gate.weight / .e_score_correction_bias (release: block_sparse_moe.gate.weight / .e_score_correction_bias) |
| blocks.i.channel.gate_up / down        | model.layers.i.mlp.experts.gate_up_proj / down_proj (or per expert w1/w3/w2) |
| blocks.i.channel.shared_{gate,up,down}_proj | model.layers.i.mlp.shared_experts.gate_up_proj rows / down_proj |
| norm.weight, lm_head.weight            | 1 + model.norm.weight, lm_head.weight            |

The release's own names (``language_model.model.`` prefix, ``block_sparse_moe``, per-expert
``w1/w3/w2``, ``index_*``) are read as well as transformers'. The published MiniMax-M3 config is
the ``minimax_m3_vl`` wrapper (remote code ``configuration_minimax_m3_vl``; its text fields under
``text_config``, the MSA settings under ``sparse_attention_config``); a text-only ``minimax_m3``
config (the same fields at the top level, or under ``text_config``) is read the same way. The
vision tower, projector and patch merger are not built: ``vision_params`` counts them apart from
``vision_config`` and the model's notes say how many.
Every RMSNorm of MiniMax-M3 stores its scale as an offset from one (Gemma's form): we add 1.
The experts, shared expert and dense MLPs use a clamped SwiGLU with ``swiglu_alpha`` and
``up + 1`` (gpt-oss's unit): their ``ffn``/``moe`` configs say ``activation="clamped_swiglu"``
with the checkpoint's ``swiglu_alpha`` (default 1.702), ``swiglu_limit`` and ``swiglu_up_shift=1``.
RoPE rotates ``int(head_dim * rope_parameters.partial_rotary_factor)`` channels (default all),
as transformers 5.23 does; the config's ``rotary_dim`` is not read by transformers and not by us.
"""

from __future__ import annotations

from storelab.checkpoint.families._common import (layer_prefix, model_config, base_entries, either, experts,
                                                  gated_mlp, linear, norm)
from storelab.checkpoint.families._family import Family, fixed
from storelab.checkpoint.families._reader import Fields
from storelab.checkpoint.table import copy

NAME = "minimax_m3_vl"
MODEL_TYPES = ("minimax_m3_vl", "minimax_m3_vl_text", "minimax_m3")
IGNORED = (r"^model\.vision_tower\.", r"^model\.multi_modal_projector\.", r"^vision_tower\.",
           r"^multi_modal_projector\.", r"^patch_merge_mlp\.", r"rotary_emb\.", r"\.mtp\.")
LEGACY = {"index_n_heads": "sparse_num_index_heads", "index_head_dim": "sparse_index_dim",
          "index_block_size": "sparse_block_size", "index_topk_blocks": "sparse_topk_blocks",
          "index_local_blocks": "sparse_local_block"}


def text_config(hf: dict) -> Fields:
    """The text model's fields: a wrapper's ``text_config``, else the config itself."""
    top = Fields(hf)
    wrapped = hf.get("model_type") == "minimax_m3_vl" or ("hidden_size" not in hf and hf.get("text_config"))
    return top.sub("text_config", default={}) if wrapped else top


def _index(t: Fields, flat: str, minimum: int = 1) -> int:
    """An MSA indexer field: transformers' flat name, else the release's in ``sparse_attention_config``."""
    if t.has(flat):
        return t.int(flat, minimum=minimum)
    return t.sub("sparse_attention_config", default={}).int(LEGACY[flat], minimum=minimum)


def _per_layer(t: Fields, sub: Fields, key: str, n: int, on: str, off: str, default: str) -> list[str]:
    """Per-layer kinds from a list of 0/1 flags ``key`` of ``sub`` (``sparse_attention_freq``,
    ``moe_layer_freq``): ``on`` where set; all ``default`` without one."""
    if not sub.has(key):
        return [default] * n
    flags = sub.list(key, n=n)
    for i, f in enumerate(flags):
        if f not in (0, 1) or isinstance(f, float):
            raise sub._err(f"{key}[{i}]", f"must be 0 or 1 (true or false), got {f!r}")
    return [on if f else off for f in flags]


def vision_params(hf: dict) -> int:
    """Parameters of the vision tower, projector and patch merger (not built), from the config; 0 without
    ``vision_config``. The CLIP-like tower (``hidden_size`` H, ``intermediate_size`` I, ``num_hidden_layers``):
    per layer q, k, v, out ``[H, H]`` and a two-matrix MLP, each with a bias, and two LayerNorms (weight and
    bias); a patch embedding ``[H, num_channels, temporal_patch_size, patch, patch]`` (no bias) and one
    LayerNorm before the layers (rotary positions: no table). The projector ``[P, H]``, ``[P, P]`` and the
    patch merger ``[P, P * spatial_merge_size^2]``, ``[P, P]``, with biases (P ``projector_hidden_size``)."""
    if not hf.get("vision_config"):
        return 0
    top = Fields(hf)
    v = top.sub("vision_config")
    H, I, L = (v.int(k, minimum=1) for k in ("hidden_size", "intermediate_size", "num_hidden_layers"))
    merge = (v.sub("img_token_compression_config") if v.has("img_token_compression_config")
             else top.sub("img_token_compression_config", default={}))
    tp = merge.int("temporal_patch_size", default=1, minimum=1)
    sm = merge.int("spatial_merge_size", default=1, minimum=1)
    P = top.int("projector_hidden_size", minimum=1) if top.has("projector_hidden_size") else \
        v.int("projection_dim", minimum=1)
    bias = 1 if top.bool("multimodal_projector_bias", default=True) else 0
    layer = 4 * (H * H + H) + (H * I + I) + (I * H + H) + 4 * H
    tower = L * layer + H * v.int("num_channels", default=3, minimum=1) * tp * v.int("patch_size", minimum=1) ** 2 \
        + 2 * H
    return tower + (P * H + P * P + 2 * P * bias) + (P * P * sm * sm + P * P + 2 * P)


def to_config(hf: dict):
    from storelab.models.config import LayerConfig
    from storelab.stores.attention import AttentionConfig
    from storelab.stores.depth import ResidualConfig
    from storelab.stores.ffn import FFNConfig
    from storelab.stores.moe import MoEConfig
    from storelab.stores.msa import MsaConfig

    t = text_config(hf)
    n = t.int("num_hidden_layers", minimum=1)
    D, H = t.int("hidden_size", minimum=1), t.int("num_attention_heads", minimum=1)
    G = t.int("num_key_value_heads", minimum=1)
    K = t.int("head_dim", default=D // H, minimum=1)
    eps = t.float("rms_norm_eps", default=1e-6, positive=True)
    # transformers' rope_parameters, or the release's flat rope_theta / partial_rotary_factor
    rp = t.sub("rope_parameters") if t.has("rope_parameters") else t
    kind = rp.str("rope_type", "type", default="default") if rp is not t else "default"
    if kind != "default":
        raise rp._err("rope_type", f"{kind!r} is not supported (only plain RoPE is implemented)")
    theta = rp.float("rope_theta", default=10000.0, positive=True)
    partial = rp.float("partial_rotary_factor", default=1.0, minimum=0.0, maximum=1.0)
    attn = dict(d_model=D, n_heads=H, n_kv_heads=G, head_dim=K, partial_rotary=partial, rope_theta=theta,
                qk_norm=True, norm_eps=eps)
    unit = dict(activation="clamped_swiglu", swiglu_alpha=t.float("swiglu_alpha", default=1.702),
                swiglu_limit=t.float("swiglu_limit", default=None, positive=True), swiglu_up_shift=1.0)
    sparse = t.sub("sparse_attention_config", default={})
    types = (t.list("layer_types", n=n) if t.has("layer_types") else
             _per_layer(t, sparse, "sparse_attention_freq", n, "minimax_m3_sparse", "full_attention", "full_attention"))
    mlp = (t.list("mlp_layer_types", n=n) if t.has("mlp_layer_types") else
           _per_layer(t, t, "moe_layer_freq", n, "sparse", "dense", "sparse"))
    layers = []
    for i in range(n):
        if types[i] == "full_attention":
            token = AttentionConfig(**attn)
        elif types[i] == "minimax_m3_sparse":
            n_index = _index(t, "index_n_heads")
            if n_index != G:
                where, key = (t, "index_n_heads") if t.has("index_n_heads") else (sparse, LEGACY["index_n_heads"])
                raise where._err(key, f"{n_index} is not supported (MSA has one index head per key/value head, "
                                      f"num_key_value_heads {G})")
            token = MsaConfig(block_size=_index(t, "index_block_size"), top_blocks=_index(t, "index_topk_blocks"),
                              local_blocks=_index(t, "index_local_blocks", minimum=0),
                              index_head_dim=_index(t, "index_head_dim"), **attn)
        else:
            raise t._err(f"layer_types[{i}]", f"{types[i]!r} is not supported (MiniMax-M3 has full_attention and "
                                              f"minimax_m3_sparse)")
        if mlp[i] == "dense":
            channel = FFNConfig(d_model=D, d_ff=t.int("dense_intermediate_size", minimum=1), **unit)
        else:
            S = t.int("shared_intermediate_size", default=0)
            channel = MoEConfig(d_model=D, n_experts=t.int("num_local_experts", minimum=1),
                                top_k=t.int("num_experts_per_tok", minimum=1),
                                d_expert=t.int("intermediate_size", minimum=1), router="sigmoid", router_bias=True,
                                norm_topk_prob=True,
                                routed_scaling=t.float("routed_scaling_factor", default=1.0, positive=True),
                                n_shared=1 if S else 0, d_shared=S or None, **unit)
        layers.append(LayerConfig(token=token, channel=channel, depth=ResidualConfig(d_model=D)))
    cfg = model_config(hf, t, name="minimax-m3", title="MiniMax-M3 text (checkpoint)", d_model=D, layers=layers,
                       norm_eps=eps)
    vision = vision_params(hf)
    if vision:
        cfg.notes = (f"vision tower, projector and patch merger (vision_config; not built, counted apart): "
                     f"{vision:,} parameters")
    return cfg


def table(hf: dict, cfg, names: set[str]) -> dict:
    original_vl = (("language_model.model.", "language_model.lm_head.weight"),)
    pre, head = layer_prefix(names, original_vl)
    tab: dict = {}
    base_entries(tab, cfg, prefix=pre, head=head, offset=True)
    for i, lay in enumerate(cfg.layers):
        a, o = f"{pre}layers.{i}.self_attn", f"blocks.{i}.token"
        for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
            linear(tab, f"{o}.{p}", f"{a}.{p}")
        tab[f"{o}.q_norm.weight"] = norm(f"{a}.q_norm.weight", True)
        tab[f"{o}.k_norm.weight"] = norm(f"{a}.k_norm.weight", True)
        if lay.token.KIND == "msa":  # transformers' indexer.* or the release's index_*
            for x in ("q", "k"):
                linear(tab, f"{o}.index_{x}", either(names, f"{a}.indexer.{x}_proj.weight",
                                                      f"{a}.index_{x}_proj.weight")[: -len(".weight")])
                tab[f"{o}.index_{x}_norm.weight"] = norm(either(names, f"{a}.indexer.{x}_norm.weight",
                                                                f"{a}.index_{x}_norm.weight"), True)
        c, ch = f"blocks.{i}.channel", lay.channel
        if ch.KIND == "ffn":
            gated_mlp(tab, (f"{c}.gate_proj", f"{c}.up_proj", f"{c}.down_proj"), f"{pre}layers.{i}.mlp", names, ch.d_ff)
            continue
        m = next((m for m in (f"{pre}layers.{i}.mlp", f"{pre}layers.{i}.block_sparse_moe")
                  if f"{m}.gate.weight" in names), f"{pre}layers.{i}.mlp")
        tab[f"{c}.router.weight"] = copy(f"{m}.gate.weight")
        tab[f"{c}.choice_bias"] = copy(either(names, f"{m}.gate.e_score_correction_bias",
                                              f"{m}.e_score_correction_bias"))
        experts(tab, c, f"{m}.experts", names, ch.n_experts)
        if ch.shared_width:
            gated_mlp(tab, (f"{c}.shared_gate_proj", f"{c}.shared_up_proj", f"{c}.shared_down_proj"),
                      f"{m}.shared_experts", names, ch.shared_width)
    return tab


FAMILY = Family(stores=("msa", "attention", "ffn", "moe", "residual"),
                name=NAME, model_types=MODEL_TYPES, to_config=to_config, table=table, ignored=fixed(*IGNORED))
