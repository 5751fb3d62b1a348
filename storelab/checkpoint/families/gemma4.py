"""Gemma 4 (Google, 2026; ``gemma4_text``, and the ``gemma4`` image-text-audio wrapper whose text model sits under
``text_config``): Gemma 3's layout (sandwich norms, local and global layers, GeGLU-tanh, the embedding times
sqrt(D), tied embeddings, q/k RMSNorms) with these changes, as transformers 5.23's ``Gemma4TextModel`` computes:

* norms store w and apply w (not Gemma 3's 1 + w); every value head also passes a weightless RMS norm
  (our attention's ``v_norm``); attention logits are not scaled (``attn_scale`` 1: the q/k norms fix their size);
* global (``full_attention``) layers have their own head size ``global_head_dim`` (512) and, under
  ``attention_k_eq_v``, ``num_global_key_value_heads`` heads whose values are the key projection itself (no
  ``v_proj``; our ``values_from_keys``: the 31B and 26B-A4B releases);
* global layers rotate with ``rope_type: proportional``: the whole head is paired as halves with full RoPE's
  frequencies, only the first ``partial_rotary_factor`` of the pairs turning (``storelab.ops.rope``);
* after each layer the stream is multiplied by its saved ``layer_scalar`` (``ResidualConfig.layer_scalar``);
* ``enable_moe_block`` (26B-A4B): beside the dense MLP, 128 experts of ``moe_intermediate_size`` read the same
  stream through their own norms and a router with a scale per channel and per expert, and the two outputs are
  summed before the post-feed-forward norm (the ``mlp_experts`` store);
* ``final_logit_softcapping``: the logits capped as c tanh(l / c), also by the wrapper.

Refused by name, accounted nowhere: per-layer input embeddings (``hidden_size_per_layer_input`` > 0, transformers'
default, the E2B / E4B releases), layers that reuse another layer's keys and values (``num_kv_shared_layers``),
the bidirectional variant (``use_bidirectional_attention: "all"``). ``"vision"`` only changes image tokens' masks,
so a text-only prompt reads causally as here. The vision and audio towers of the wrapper are ignored when loading.

Names (``Gemma4ForCausalLM``, or the wrapper's ``model.language_model.``; ``a`` = ``model.layers.i``):

| ours                                   | transformers                                |
|----------------------------------------|---------------------------------------------|
| blocks.i.norm_token / post_norm_token  | a.input_layernorm / post_attention_layernorm |
| blocks.i.norm_channel                  | a.pre_feedforward_layernorm (dense layers)  |
| blocks.i.post_norm_channel             | a.post_feedforward_layernorm                |
| blocks.i.token.{q,k,v,o}_proj, q/k_norm | a.self_attn.* (no v_proj under k_eq_v)     |
| blocks.i.channel.{gate,up,down}_proj   | a.mlp.* (dense layers)                      |
| blocks.i.channel.mlp.*, norm_mlp_in / norm_mlp_out | a.mlp.*, pre_feedforward_layernorm / post_feedforward_layernorm_1 |
| blocks.i.channel.norm_experts_in / _out | a.pre_feedforward_layernorm_2 / post_feedforward_layernorm_2 |
| blocks.i.channel.router.*, gate_up, down | a.router.{proj,scale,per_expert_scale}, a.experts.{gate_up_proj,down_proj} |
| blocks.i.depth_channel.scalar          | a.layer_scalar                              |
"""

from __future__ import annotations

import dataclasses

import torch

from storelab.checkpoint.families._common import gated_mlp, layer_prefix, linear, model_config
from storelab.checkpoint.families._family import Family, fixed
from storelab.checkpoint.families._reader import FULL, SLIDING, Fields, text_fields, tied
from storelab.checkpoint.table import copy

__all__ = ["FAMILY"]

GEMMA4 = ("gemma4", "gemma4_text")
# Gemma4TextConfig's defaults, for fields a file leaves out
DEFAULTS = dict(hidden_size=2304, intermediate_size=9216, num_hidden_layers=30, num_attention_heads=8,
                num_key_value_heads=4, head_dim=256, global_head_dim=512, vocab_size=262_144, sliding_window=512,
                max_position_embeddings=131_072, hidden_size_per_layer_input=256)
ROPE = {SLIDING: {"rope_type": "default", "rope_theta": 10_000.0},
        FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}}
PATTERN = 6  # five local layers to one global when layer_types is absent


def refuse(t: Fields) -> None:
    """The Gemma 4 devices no store here holds, each named by its field."""
    # null is no per-layer input (transformers tests it for truth); absent is its default, 256
    ple = 0 if "hidden_size_per_layer_input" in t.d and t.d["hidden_size_per_layer_input"] is None else \
        t.int("hidden_size_per_layer_input", default=DEFAULTS["hidden_size_per_layer_input"], minimum=0)
    if ple > 0:
        raise t._err("hidden_size_per_layer_input", "per-layer input embeddings (Gemma 4 E2B / E4B: a second "
                     "embedding table read by every layer) have no store in storelab yet; 0 reads")
    if t.int("num_kv_shared_layers", default=0, minimum=0) > 0:
        raise t._err("num_kv_shared_layers", "layers reusing an earlier layer's keys and values (Gemma 4 E2B / "
                     "E4B) are not read yet")
    if t.d.get("use_bidirectional_attention") == "all":
        raise t._err("use_bidirectional_attention", "'all' is not supported (a bidirectional encoder, not a "
                     "causal LM)")


def layer_types(t: Fields, n: int) -> list[str]:
    if t.has("layer_types"):
        types = t.list("layer_types", n=n)
    else:
        types = [FULL if (i + 1) % PATTERN == 0 else SLIDING for i in range(n)]
    for i, x in enumerate(types):
        if x not in (FULL, SLIDING):
            raise t._err(f"layer_types[{i}]", f"{x!r} is not a Gemma 4 layer type ({FULL}, {SLIDING})")
    return types[:-1] + [FULL]  # transformers forces the last layer global


def rope_of(t: Fields, kind: str) -> tuple[float, dict | None]:
    """(theta, scaling) of a layer type: ``rope_parameters[kind]``, else Gemma4TextConfig's default."""
    if not t.has("rope_parameters"):
        d = ROPE[kind]
        return d["rope_theta"], ({k: v for k, v in d.items() if k != "rope_theta"}
                                 if d["rope_type"] != "default" else None)
    rp = t.sub("rope_parameters")
    if rp.has(kind):
        rp = rp.sub(kind)
    theta = rp.float("rope_theta", default=ROPE[kind]["rope_theta"], positive=True)
    kind_of = rp.str("rope_type", "type", default="default")
    if kind_of == "default":
        return theta, None
    if kind_of == "proportional":
        p = rp.float("partial_rotary_factor", default=1.0, positive=True)
        if p > 1:
            raise rp._err("partial_rotary_factor", f"must be in (0, 1], got {p}")
        return theta, {"rope_type": "proportional", "partial_rotary_factor": p,
                       "factor": rp.float("factor", default=1.0, positive=True)}
    from storelab.checkpoint.families._reader import scaling_numbers

    scaling_numbers(rp)
    return theta, {**{k: v for k, v in rp.d.items() if k not in ("rope_theta", "type")}, "rope_type": kind_of}


def attention(t: Fields, i: int, kind: str, D: int, eps: float):
    from storelab.stores.attention import AttentionConfig, WindowConfig

    H = t.int("num_attention_heads", default=DEFAULTS["num_attention_heads"], minimum=1)
    G = t.int("num_key_value_heads", default=DEFAULTS["num_key_value_heads"], minimum=1)
    K = t.int("head_dim", default=DEFAULTS["head_dim"], minimum=2)
    k_eq_v = kind == FULL and t.bool("attention_k_eq_v", default=False)
    where = t
    if t.has("per_layer_config"):  # as transformers saves it: {layer: {head_dim, num_key_value_heads}}
        over = t.sub("per_layer_config")
        key = str(i) if over.has(str(i)) else None
        if key is not None:
            where = over.sub(key)
            unknown = sorted(set(where.d) - {"head_dim", "num_key_value_heads"})
            if unknown:
                raise where._err(unknown[0], "is not read per layer (storelab reads head_dim and num_key_value_heads)")
            K = where.int("head_dim", default=K, minimum=2)
            G = where.int("num_key_value_heads", default=G, minimum=1)
    elif kind == FULL:  # as Google publishes it
        K = t.int("global_head_dim", default=DEFAULTS["global_head_dim"], minimum=2)
        if k_eq_v and t.d.get("num_global_key_value_heads") is not None:
            G = t.int("num_global_key_value_heads", minimum=1)
            where = t
    if H % G:
        key = "num_key_value_heads" if where is not t or not (kind == FULL and k_eq_v and
                                                              t.d.get("num_global_key_value_heads") is not None) \
            else "num_global_key_value_heads"
        raise where._err(key, f"{G} key/value heads do not divide {H} query heads")
    theta, scaling = rope_of(t, kind)
    bias = t.bool("attention_bias", default=False)
    common = dict(d_model=D, n_heads=H, n_kv_heads=G, head_dim=K, rope_theta=theta, rope_scaling=scaling,
                  qk_norm=True, v_norm=True, values_from_keys=k_eq_v, attn_scale=1.0, qkv_bias=bias, out_bias=bias,
                  norm_eps=eps)
    if kind == FULL:
        return AttentionConfig(**common)
    window = t.int("sliding_window", default=DEFAULTS["sliding_window"], minimum=2)
    return WindowConfig(window=window - 1, **common)  # sliding_window counts the query itself


def channel(t: Fields, D: int, eps: float):
    from storelab.stores.ffn import FFNConfig
    from storelab.stores.mlp_experts import MLPExpertsConfig

    act = t.str("hidden_activation", "hidden_act", default="gelu_pytorch_tanh")
    if act != "gelu_pytorch_tanh":
        raise t._err(t.key("hidden_activation", "hidden_act"), f"{act!r} is not supported (Gemma 4's MLP is GeGLU "
                                                               "with tanh GELU, gelu_pytorch_tanh)")
    d_ff = t.int("intermediate_size", default=DEFAULTS["intermediate_size"], minimum=1)
    if not t.bool("enable_moe_block", default=False):
        return FFNConfig(d_model=D, d_ff=d_ff, activation="geglu_tanh")
    E = t.int("num_experts", minimum=1)
    k = t.int("top_k_experts", minimum=1)
    if k > E:
        raise t._err("top_k_experts", f"must be <= num_experts ({E}), got {k}")
    return MLPExpertsConfig(d_model=D, d_ff=d_ff, n_experts=E, top_k=k,
                            d_expert=t.int("moe_intermediate_size", minimum=1), activation="geglu_tanh", norm_eps=eps)


def to_config(hf: dict):
    from storelab.models.config import LayerConfig
    from storelab.stores.depth import ResidualConfig

    t = text_fields(hf)
    refuse(t)
    D = t.int("hidden_size", default=DEFAULTS["hidden_size"], minimum=1)
    n = t.int("num_hidden_layers", default=DEFAULTS["num_hidden_layers"], minimum=1)
    V = t.int("vocab_size", default=DEFAULTS["vocab_size"], minimum=1)
    eps = t.float("rms_norm_eps", default=1e-6, positive=True)
    types = layer_types(t, n)
    mix = channel(t, D, eps)
    layers = [LayerConfig(token=attention(t, i, kind, D, eps), channel=mix,
                          depth=ResidualConfig(d_model=D, layer_scalar=True), norms="sandwich") for i, kind in enumerate(types)]
    cfg = model_config(hf, dict(t.d, vocab_size=V), name="gemma4", title="Gemma 4 (checkpoint)", d_model=D,
                       layers=layers, norm_eps=eps,
                       context=t.int("max_position_embeddings", default=DEFAULTS["max_position_embeddings"]))
    cap = t.d.get("final_logit_softcapping")
    scale = float(torch.tensor(D ** 0.5, dtype=torch.float32))  # as transformers holds it, cast at the call
    return dataclasses.replace(cfg, tie_embeddings=tied(hf, t, default=True), vocab_size=V, embed_scale=scale,
                               logit_softcap=None if cap is None else t.float("final_logit_softcapping", positive=True))


def table(hf: dict, cfg, names: set[str]) -> dict:
    pre, head = layer_prefix(names)
    tab: dict = {"embed.weight": copy(f"{pre}embed_tokens.weight"), "norm.weight": copy(f"{pre}norm.weight")}
    if not cfg.tie_embeddings:
        tab["lm_head.weight"] = copy(head)
    for i, lay in enumerate(cfg.layers):
        a, b, tok = f"{pre}layers.{i}", f"blocks.{i}", lay.token
        tab[f"{b}.norm_token.weight"] = copy(f"{a}.input_layernorm.weight")
        tab[f"{b}.post_norm_token.weight"] = copy(f"{a}.post_attention_layernorm.weight")
        tab[f"{b}.post_norm_channel.weight"] = copy(f"{a}.post_feedforward_layernorm.weight")
        tab[f"{b}.depth_channel.scalar"] = copy(f"{a}.layer_scalar")
        for p in ("q_proj", "k_proj") + (() if tok.values_from_keys else ("v_proj",)):
            linear(tab, f"{b}.token.{p}", f"{a}.self_attn.{p}", bias=tok.qkv_bias)
        linear(tab, f"{b}.token.o_proj", f"{a}.self_attn.o_proj", bias=tok.out_bias)
        tab[f"{b}.token.q_norm.weight"] = copy(f"{a}.self_attn.q_norm.weight")
        tab[f"{b}.token.k_norm.weight"] = copy(f"{a}.self_attn.k_norm.weight")
        c = f"{b}.channel"
        if lay.channel.KIND == "ffn":
            tab[f"{b}.norm_channel.weight"] = copy(f"{a}.pre_feedforward_layernorm.weight")
            gated_mlp(tab, (f"{c}.gate_proj", f"{c}.up_proj", f"{c}.down_proj"), f"{a}.mlp", names, lay.channel.d_ff)
            continue
        gated_mlp(tab, (f"{c}.mlp.gate_proj", f"{c}.mlp.up_proj", f"{c}.mlp.down_proj"), f"{a}.mlp", names,
                  lay.channel.d_ff)
        for ours, theirs in (("norm_mlp_in", "pre_feedforward_layernorm"), ("norm_mlp_out", "post_feedforward_layernorm_1"),
                             ("norm_experts_in", "pre_feedforward_layernorm_2"),
                             ("norm_experts_out", "post_feedforward_layernorm_2")):
            tab[f"{c}.{ours}.weight"] = copy(f"{a}.{theirs}.weight")
        tab[f"{c}.router.proj.weight"] = copy(f"{a}.router.proj.weight")
        tab[f"{c}.router.scale"] = copy(f"{a}.router.scale")
        tab[f"{c}.router.per_expert_scale"] = copy(f"{a}.router.per_expert_scale")
        tab[f"{c}.gate_up"] = copy(f"{a}.experts.gate_up_proj")
        tab[f"{c}.down"] = copy(f"{a}.experts.down_proj")
    return tab


FAMILY = Family(stores=("attention", "window", "ffn", "mlp_experts", "residual"), name="gemma4", model_types=GEMMA4,
                to_config=to_config, table=table,
                ignored=fixed(r"rotary_emb\.", r"^(model\.)?(vision_tower|audio_tower|embed_vision|embed_audio)\.",
                              r"^(model\.)?multi_modal_projector\."))
