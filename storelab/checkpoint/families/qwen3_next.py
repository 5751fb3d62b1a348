"""Qwen3-Next and Qwen3.5-MoE (Qwen3.8's family): Gated DeltaNet layers (arXiv 2412.06464) and
gated full attention (arXiv 2505.06708), MoE with softmax routing and a sigmoid-gated shared expert.

| ours                                   | transformers (``Qwen3NextForCausalLM``; Qwen3.5: ``model.language_model.``) |
|----------------------------------------|--------------------------------------------------|
| embed.weight                           | model.embed_tokens.weight                        |
| blocks.i.norm_token / norm_channel     | 1 + model.layers.i.input_layernorm / post_attention_layernorm |
| blocks.i.token.{q,k,v}_proj, z_proj (gdn) | model.layers.i.linear_attn.in_proj_qkvz, de-interleaved per key head (Qwen3.5: in_proj_qkv, in_proj_z) |
| blocks.i.token.b_proj, a_proj (gdn)    | model.layers.i.linear_attn.in_proj_ba, de-interleaved (Qwen3.5: in_proj_b, in_proj_a) |
| blocks.i.token.conv_weight (gdn)       | model.layers.i.linear_attn.conv1d.weight [C, 1, W] -> [C, W] |
| blocks.i.token.A_log, dt_bias, o_norm, o_proj (gdn) | ...linear_attn.A_log, dt_bias, norm.weight, out_proj |
| blocks.i.token.{q,k,v,o}_proj (attention) | model.layers.i.self_attn.{q,k,v,o}_proj (q_proj emits query and gate per head) |
| blocks.i.token.{q,k}_norm (attention)  | 1 + model.layers.i.self_attn.{q,k}_norm          |
| blocks.i.channel.router                | model.layers.i.mlp.gate.weight                   |
| blocks.i.channel.gate_up / down        | model.layers.i.mlp.experts.* (per expert or 3-D) |
| blocks.i.channel.shared_{gate,up,down}_proj, shared_gate | ...mlp.shared_expert.*, mlp.shared_expert_gate |
| norm.weight, lm_head.weight            | 1 + model.norm.weight, lm_head.weight            |

Qwen3-Next's fused ``in_proj_qkvz`` holds, for each key head g in turn, q_g, k_g, then the
value and gate rows of the value heads g serves; ``in_proj_ba`` likewise b then a per key head.
All Qwen3-Next RMSNorms but the GDN output norm store 1 + w. Qwen3.5's multimodal RoPE is plain
RoPE for text (its three position streams are equal). The vision tower and MTP layers are ignored.
"""

from __future__ import annotations

from storelab.checkpoint.families._common import (layer_prefix, model_config,
                                                  base_entries, check_act, experts, field, gated_mlp, linear, norm,
                                                  rope, unsupported)
from storelab.checkpoint.families._family import Family, fixed
from storelab.checkpoint.table import Src, copy

NAME = "qwen3_next"
MODEL_TYPES = ("qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text")
IGNORED = (r"^mtp\.", r"^model\.visual\.", r"^model\.mtp\.", r"rotary_emb\.", r"^visual\.")


def text_config(hf: dict) -> dict:
    """The text model's config, ``layer_types`` filled from ``full_attention_interval`` (default 4)."""
    t = dict(hf.get("text_config") or {}) if hf.get("model_type") == "qwen3_5_moe" else dict(hf)
    if t.get("layer_types") is None:
        every = t.get("full_attention_interval") or 4
        t["layer_types"] = ["linear_attention" if (i + 1) % every else "full_attention"
                            for i in range(field(t, "num_hidden_layers"))]
    return t


def _is_moe(t: dict, i: int) -> bool:
    if t.get("mlp_layer_types") is not None:
        return t["mlp_layer_types"][i] == "sparse"
    return (i not in (t.get("mlp_only_layers") or []) and field(t, "num_experts", 0) > 0
            and (i + 1) % field(t, "decoder_sparse_step", 1) == 0)


def to_config(hf: dict):
    return build_config(hf, text_config(hf), title="Qwen3-Next (checkpoint)")


def build_config(hf: dict, t: dict, *, title: str):
    """The ModelConfig of a Qwen3-Next style text config ``t`` (``layer_types`` filled in); ``hf`` is the
    whole config.json (tied embeddings are read there, then in ``t``)."""
    from storelab.models.config import LayerConfig
    from storelab.stores.attention import AttentionConfig
    from storelab.stores.depth import ResidualConfig
    from storelab.stores.ffn import FFNConfig
    from storelab.stores.moe import MoEConfig
    from storelab.stores.recurrent import GatedDeltaNetConfig

    check_act(t)
    D, n = field(t, "hidden_size"), field(t, "num_hidden_layers")
    eps = field(t, "rms_norm_eps", 1e-6)
    theta, partial = rope(field(t, "rope_parameters", {}), default_partial=0.25)
    if field(t, "attention_bias", False):
        raise unsupported("attention_bias", True, "Qwen3-Next's attention has no biases")
    types = field(t, "layer_types")
    layers = []
    for i in range(n):
        if types[i] == "linear_attention":
            token = GatedDeltaNetConfig(d_model=D, n_heads=field(t, "linear_num_key_heads"),
                                        n_v_heads=field(t, "linear_num_value_heads"),
                                        head_k_dim=field(t, "linear_key_head_dim"),
                                        head_v_dim=field(t, "linear_value_head_dim"),
                                        conv_kernel=field(t, "linear_conv_kernel_dim"), norm_eps=eps)
        elif types[i] == "full_attention":
            token = AttentionConfig(d_model=D, n_heads=field(t, "num_attention_heads"),
                                    n_kv_heads=field(t, "num_key_value_heads"), head_dim=field(t, "head_dim"),
                                    partial_rotary=partial, rope_theta=theta, gate=True, qk_norm=True, norm_eps=eps)
        else:
            raise unsupported(f"layer_types[{i}]", types[i], "Qwen3-Next has linear_attention and full_attention")
        if _is_moe(t, i):
            S = field(t, "shared_expert_intermediate_size", 0)
            channel = MoEConfig(d_model=D, n_experts=field(t, "num_experts"), top_k=field(t, "num_experts_per_tok"),
                                d_expert=field(t, "moe_intermediate_size"), router="softmax",
                                norm_topk_prob=bool(field(t, "norm_topk_prob", True)),
                                n_shared=1 if S else 0, d_shared=S or None, shared_gate=bool(S))
        else:
            channel = FFNConfig(d_model=D, d_ff=field(t, "intermediate_size"))
        layers.append(LayerConfig(token=token, channel=channel, depth=ResidualConfig(d_model=D)))
    tie = hf if "tie_word_embeddings" in hf else t
    return model_config(tie, t, name=t.get("model_type", "qwen3-next").replace("_", "-"),
                        title=title, d_model=D, layers=layers, norm_eps=eps)


def _grouped(name: str, H: int, sizes: list[int], part: int) -> Src:
    """Rows of piece ``part`` from a weight laid out per key head as [piece 0 | piece 1 | ...]."""
    start = sum(sizes[:part])

    def take(w):
        return w.view(H, sum(sizes), *w.shape[1:])[:, start:start + sizes[part]].reshape(-1, *w.shape[1:])

    return Src((name,), take, f"piece {part} of each key head's {sizes} rows")


def table(hf: dict, cfg, names: set[str]) -> dict:
    pre, head = layer_prefix(names)
    tab: dict = {}
    base_entries(tab, cfg, prefix=pre, head=head, offset=True)
    for i, lay in enumerate(cfg.layers):
        o, tok = f"blocks.{i}.token", lay.token
        if tok.KIND == "gated_deltanet":
            a = f"{pre}layers.{i}.linear_attn"
            H, HV, K, V = tok.n_heads, tok.n_v_heads, tok.head_k_dim, tok.head_v_dim
            r = HV // H
            if f"{a}.in_proj_qkvz.weight" in names:
                sizes = [K, K, r * V, r * V]
                for part, p in enumerate(("q_proj", "k_proj", "v_proj", "z_proj")):
                    tab[f"{o}.{p}.weight"] = _grouped(f"{a}.in_proj_qkvz.weight", H, sizes, part)
                tab[f"{o}.b_proj.weight"] = _grouped(f"{a}.in_proj_ba.weight", H, [r, r], 0)
                tab[f"{o}.a_proj.weight"] = _grouped(f"{a}.in_proj_ba.weight", H, [r, r], 1)
            else:
                qkv = f"{a}.in_proj_qkv.weight"
                bounds = [0, H * K, 2 * H * K, 2 * H * K + HV * V]
                for part, p in enumerate(("q_proj", "k_proj", "v_proj")):
                    lo, hi = bounds[part], bounds[part + 1]
                    tab[f"{o}.{p}.weight"] = Src((qkv,), lambda w, lo=lo, hi=hi: w[lo:hi], f"rows {lo}:{hi}")
                linear(tab, f"{o}.z_proj", f"{a}.in_proj_z")
                linear(tab, f"{o}.b_proj", f"{a}.in_proj_b")
                linear(tab, f"{o}.a_proj", f"{a}.in_proj_a")
            tab[f"{o}.conv_weight"] = Src((f"{a}.conv1d.weight",), lambda w: w.squeeze(1), "[C, 1, W] -> [C, W]")
            tab[f"{o}.A_log"] = copy(f"{a}.A_log")
            tab[f"{o}.dt_bias"] = copy(f"{a}.dt_bias")
            tab[f"{o}.o_norm"] = copy(f"{a}.norm.weight")
            linear(tab, f"{o}.o_proj", f"{a}.out_proj")
        else:
            a = f"{pre}layers.{i}.self_attn"
            for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
                linear(tab, f"{o}.{p}", f"{a}.{p}")
            tab[f"{o}.q_norm.weight"] = norm(f"{a}.q_norm.weight", True)
            tab[f"{o}.k_norm.weight"] = norm(f"{a}.k_norm.weight", True)
        m, c, ch = f"{pre}layers.{i}.mlp", f"blocks.{i}.channel", lay.channel
        if ch.KIND == "ffn":
            gated_mlp(tab, (f"{c}.gate_proj", f"{c}.up_proj", f"{c}.down_proj"), m, names, ch.d_ff)
            continue
        tab[f"{c}.router.weight"] = copy(f"{m}.gate.weight")
        experts(tab, c, f"{m}.experts", names, ch.n_experts)
        if ch.shared_width:
            gated_mlp(tab, (f"{c}.shared_gate_proj", f"{c}.shared_up_proj", f"{c}.shared_down_proj"),
                      f"{m}.shared_expert", names, ch.shared_width)
            linear(tab, f"{c}.shared_gate", f"{m}.shared_expert_gate")
    return tab


FAMILY = Family(stores=("gated_deltanet", "attention", "moe", "residual"),
                name=NAME, model_types=MODEL_TYPES, to_config=to_config, table=table, ignored=fixed(*IGNORED))
