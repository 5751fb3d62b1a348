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

from storelab.checkpoint.families._common import (layer_prefix, model_config, base_entries, experts, gated_mlp,
                                                  linear, norm)
from storelab.checkpoint.families._family import Family, fixed
from storelab.checkpoint.families._reader import Fields, rope_of, text_fields
from storelab.checkpoint.table import Src, copy

NAME = "qwen3_next"
MODEL_TYPES = ("qwen3_next", "qwen3_5_moe", "qwen3_5_moe_text")
IGNORED = (r"^mtp\.", r"^model\.visual\.", r"^model\.mtp\.", r"rotary_emb\.", r"^visual\.")


def text_config(hf: dict) -> Fields:
    """The text model's fields (a ``qwen3_5_moe`` wrapper's ``text_config``)."""
    return text_fields(hf) if hf.get("model_type") == "qwen3_5_moe" else Fields(hf)


def token_types(t: Fields, n: int) -> list[str]:
    """``layer_types`` (cut to the layers, as transformers does); else every ``full_attention_interval``-th
    layer (default 4) full attention, the others linear attention."""
    if t.has("layer_types"):
        types = t.list("layer_types", n=n)
    else:
        every = t.int("full_attention_interval", default=4, minimum=1)
        types = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(n)]
    for i, x in enumerate(types):
        if x not in ("linear_attention", "full_attention"):
            raise t._err(f"layer_types[{i}]", f"{x!r} is not supported (Qwen3-Next has linear_attention and "
                                              f"full_attention)")
    return types


def channel_types(t: Fields, n: int) -> list[bool]:
    """Whether each layer is a mixture of experts: ``mlp_layer_types``; else ``num_experts`` > 0, every
    ``decoder_sparse_step``-th layer, but the ``mlp_only_layers``."""
    if t.has("mlp_layer_types"):
        return [x == "sparse" for x in t.list("mlp_layer_types", n=n)]
    if not t.int("num_experts", default=0):
        return [False] * n
    only = set(t.layers("mlp_only_layers", n=n, default=[]))
    step = t.int("decoder_sparse_step", default=1, minimum=1)
    return [i not in only and (i + 1) % step == 0 for i in range(n)]


def _why_dense(t: Fields, i: int) -> str:
    if t.has("mlp_layer_types"):
        return f"{t.name('mlp_layer_types')} says so"
    if not t.int("num_experts", default=0):
        return f"{t.name('num_experts')} is {t.d.get('num_experts', 'absent')}"
    if i in t.list("mlp_only_layers", default=[]):
        return f"{t.name('mlp_only_layers')} names it"
    return f"{t.name('decoder_sparse_step')} is {t.int('decoder_sparse_step')}"


def to_config(hf: dict):
    return build_config(hf, text_config(hf), title="Qwen3-Next (checkpoint)")


def build_config(hf: dict, t: Fields, *, title: str, model_type: str = "qwen3-next"):
    """The ModelConfig of a Qwen3-Next style text config ``t``; ``hf`` is the whole config.json (tied
    embeddings are read there, then in ``t``)."""
    from storelab.models.config import LayerConfig
    from storelab.stores.attention import AttentionConfig
    from storelab.stores.depth import ResidualConfig
    from storelab.stores.ffn import FFNConfig
    from storelab.stores.moe import MoEConfig
    from storelab.stores.recurrent import GatedDeltaNetConfig

    act = t.str("hidden_act", default="silu")
    if act != "silu":
        raise t._err("hidden_act", f"{act!r} is not supported (only silu is implemented for this family)")
    D, n = t.int("hidden_size", minimum=1), t.int("num_hidden_layers", minimum=1)
    eps = t.float("rms_norm_eps", default=1e-6, positive=True)
    rp = rope_of(t, partial=0.25)  # rope_parameters (v5), else the published rope_theta (10,000,000)
    if rp.kind != "default":
        key = "rope_scaling" if t.has("rope_scaling") else "rope_parameters"
        raise t._err(f"{key}.rope_type", f"{rp.kind!r} is not supported (only plain RoPE is implemented)")
    theta, partial = rp.theta, rp.partial
    if t.bool("attention_bias", default=False):
        raise t._err("attention_bias", "true is not supported (Qwen3-Next's attention has no biases)")
    types, sparse = token_types(t, n), channel_types(t, n)
    layers = []
    for i in range(n):
        if types[i] == "linear_attention":
            token = GatedDeltaNetConfig(d_model=D, n_heads=t.int("linear_num_key_heads", minimum=1),
                                        n_v_heads=t.int("linear_num_value_heads", minimum=1),
                                        head_k_dim=t.int("linear_key_head_dim", minimum=1),
                                        head_v_dim=t.int("linear_value_head_dim", minimum=1),
                                        conv_kernel=t.int("linear_conv_kernel_dim", minimum=1), norm_eps=eps)
        else:
            token = AttentionConfig(d_model=D, n_heads=t.int("num_attention_heads", minimum=1),
                                    n_kv_heads=t.int("num_key_value_heads", minimum=1),
                                    head_dim=t.int("head_dim", minimum=1),
                                    partial_rotary=partial, rope_theta=theta, gate=True, qk_norm=True, norm_eps=eps)
        if sparse[i]:
            S = t.int("shared_expert_intermediate_size", default=0)
            channel = MoEConfig(d_model=D, n_experts=t.int("num_experts", minimum=1),
                                top_k=t.int("num_experts_per_tok", minimum=1),
                                d_expert=t.int("moe_intermediate_size", minimum=1), router="softmax",
                                norm_topk_prob=t.bool("norm_topk_prob", default=True),
                                n_shared=1 if S else 0, d_shared=S or None, shared_gate=bool(S))
        else:
            if not t.has("intermediate_size"):
                raise t._err("intermediate_size", f"missing, and layer {i} is a dense MLP ({_why_dense(t, i)})")
            channel = FFNConfig(d_model=D, d_ff=t.int("intermediate_size", minimum=1))
        layers.append(LayerConfig(token=token, channel=channel, depth=ResidualConfig(d_model=D)))
    return model_config(hf if "tie_word_embeddings" in hf else t.d, t,
                        name=t.str("model_type", default=model_type).replace("_", "-"),
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
