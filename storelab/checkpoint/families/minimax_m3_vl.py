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

from storelab.checkpoint.families._common import (layer_prefix, model_config,
                                                  base_entries, either, experts, field, gated_mlp, linear, norm,
                                                  rope, unsupported)
from storelab.checkpoint.families._family import Family, fixed
from storelab.checkpoint.table import copy

NAME = "minimax_m3_vl"
MODEL_TYPES = ("minimax_m3_vl", "minimax_m3_vl_text", "minimax_m3")
IGNORED = (r"^model\.vision_tower\.", r"^model\.multi_modal_projector\.", r"^vision_tower\.",
           r"^multi_modal_projector\.", r"^patch_merge_mlp\.", r"rotary_emb\.", r"\.mtp\.")
LEGACY = {"index_n_heads": "sparse_num_index_heads", "index_head_dim": "sparse_index_dim",
          "index_block_size": "sparse_block_size", "index_topk_blocks": "sparse_topk_blocks",
          "index_local_blocks": "sparse_local_block"}


def text_config(hf: dict) -> dict:
    wrapped = hf.get("model_type") == "minimax_m3_vl" or ("hidden_size" not in hf and hf.get("text_config"))
    t = dict(hf.get("text_config") or {}) if wrapped else dict(hf)
    sparse = t.get("sparse_attention_config") or {}
    for flat, legacy in LEGACY.items():
        if flat not in t and legacy in sparse:
            t[flat] = sparse[legacy]
    n = field(t, "num_hidden_layers")
    if t.get("layer_types") is None:
        freq = sparse.get("sparse_attention_freq")
        t["layer_types"] = (["minimax_m3_sparse" if f else "full_attention" for f in freq] if freq is not None
                            else ["full_attention"] * n)
    if t.get("mlp_layer_types") is None:
        freq = t.get("moe_layer_freq")
        t["mlp_layer_types"] = ["sparse" if f else "dense" for f in freq] if freq is not None else ["sparse"] * n
    return t


def vision_params(hf: dict) -> int:
    """Parameters of the vision tower, projector and patch merger (not built), from the config; 0 without
    ``vision_config``. The CLIP-like tower (``hidden_size`` H, ``intermediate_size`` I, ``num_hidden_layers``):
    per layer q, k, v, out ``[H, H]`` and a two-matrix MLP, each with a bias, and two LayerNorms (weight and
    bias); a patch embedding ``[H, num_channels, temporal_patch_size, patch, patch]`` (no bias) and one
    LayerNorm before the layers (rotary positions: no table). The projector ``[P, H]``, ``[P, P]`` and the
    patch merger ``[P, P * spatial_merge_size^2]``, ``[P, P]``, with biases (P ``projector_hidden_size``)."""
    v = hf.get("vision_config")
    if not v:
        return 0
    H, I, L = field(v, "hidden_size"), field(v, "intermediate_size"), field(v, "num_hidden_layers")
    merge = v.get("img_token_compression_config") or hf.get("img_token_compression_config") or {}
    tp, sm = merge.get("temporal_patch_size", 1), merge.get("spatial_merge_size", 1)
    P = field(hf, "projector_hidden_size", field(v, "projection_dim"))
    bias = 1 if hf.get("multimodal_projector_bias", True) else 0
    layer = 4 * (H * H + H) + (H * I + I) + (I * H + H) + 4 * H
    tower = L * layer + H * field(v, "num_channels", 3) * tp * field(v, "patch_size") ** 2 + 2 * H
    return tower + (P * H + P * P + 2 * P * bias) + (P * P * sm * sm + P * P + 2 * P)


def to_config(hf: dict):
    from storelab.models.config import LayerConfig
    from storelab.stores.attention import AttentionConfig
    from storelab.stores.depth import ResidualConfig
    from storelab.stores.ffn import FFNConfig
    from storelab.stores.moe import MoEConfig
    from storelab.stores.msa import MsaConfig

    t = text_config(hf)
    D, H, G = field(t, "hidden_size"), field(t, "num_attention_heads"), field(t, "num_key_value_heads")
    K = field(t, "head_dim", D // H)
    eps = field(t, "rms_norm_eps", 1e-6)
    # transformers' rope_parameters, or the release's flat rope_theta / partial_rotary_factor
    theta, partial = rope(t.get("rope_parameters") or {k: t[k] for k in ("rope_theta", "partial_rotary_factor")
                                                        if t.get(k) is not None})
    attn = dict(d_model=D, n_heads=H, n_kv_heads=G, head_dim=K, partial_rotary=partial, rope_theta=theta,
                qk_norm=True, norm_eps=eps)
    unit = dict(activation="clamped_swiglu", swiglu_alpha=float(field(t, "swiglu_alpha", 1.702)),
                swiglu_limit=field(t, "swiglu_limit", None), swiglu_up_shift=1.0)
    layers = []
    for i in range(field(t, "num_hidden_layers")):
        kind = t["layer_types"][i]
        if kind == "full_attention":
            token = AttentionConfig(**attn)
        elif kind == "minimax_m3_sparse":
            if field(t, "index_n_heads") != G:
                raise unsupported("index_n_heads", t["index_n_heads"], f"MSA has one index head per key/value "
                                  f"head ({G})")
            token = MsaConfig(block_size=field(t, "index_block_size"), top_blocks=field(t, "index_topk_blocks"),
                              local_blocks=field(t, "index_local_blocks"), index_head_dim=field(t, "index_head_dim"),
                              **attn)
        else:
            raise unsupported(f"layer_types[{i}]", kind, "MiniMax-M3 has full_attention and minimax_m3_sparse")
        if t["mlp_layer_types"][i] == "dense":
            channel = FFNConfig(d_model=D, d_ff=field(t, "dense_intermediate_size"), **unit)
        else:
            S = field(t, "shared_intermediate_size", 0)
            channel = MoEConfig(d_model=D, n_experts=field(t, "num_local_experts"),
                                top_k=field(t, "num_experts_per_tok"),
                                d_expert=field(t, "intermediate_size"), router="sigmoid", router_bias=True,
                                norm_topk_prob=True, routed_scaling=float(field(t, "routed_scaling_factor", 1.0)),
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
