"""Jamba (AI21, arXiv 2403.19887; ``jamba``: Jamba v0.1, Jamba 1.5 Mini / Large, Jamba Reasoning): a stack of
Mamba layers with an attention layer every ``attn_layer_period`` (8) layers, at ``attn_layer_offset`` (4) (or as a
``layers_block_type`` list says), each mixer followed by a mixture of experts every ``expert_layer_period`` (2)
layers at ``expert_layer_offset`` (1), else a SwiGLU MLP. Pre-norm RMSNorms, eps ``rms_norm_eps``.

* Mamba (``JambaMambaMixer``): storelab's ``mamba`` store with weighted RMS norms on dt_r, B and C
  (``bcdt_norm = "weighted"``, eps ``rms_norm_eps``); d_inner = ``mamba_expand`` x hidden, d_state
  ``mamba_d_state``, dt_rank ``mamba_dt_rank`` ("auto": ceil(hidden / 16)), conv ``mamba_d_conv``,
  ``mamba_conv_bias``, ``mamba_proj_bias``.
* Attention (``JambaAttention``): GQA without positions (no RoPE; the Mamba layers carry the order) and
  without biases, head width hidden / heads.
* Experts (``JambaSparseMoeBlock``): ``num_experts`` (16) of width ``intermediate_size``, a softmax over all
  logits, the top ``num_experts_per_tok`` (2) kept with their weights as they are (not renormalised). With
  ``num_experts`` 1 every layer is the MLP.

Fields the published files leave out take transformers' defaults (``JambaConfig``).

Names (transformers' ``JambaForCausalLM``; ``a`` = ``model.layers.i``):

| ours                                 | transformers                                                   |
|--------------------------------------|----------------------------------------------------------------|
| blocks.i.norm_token / norm_channel   | a.input_layernorm / a.pre_ff_layernorm                         |
| blocks.i.token.* (mamba)             | a.mamba.* (MambaMixer's names)                                 |
| blocks.i.token.{dt,b,c}_norm         | a.mamba.{dt,b,c}_layernorm.weight                              |
| blocks.i.token.{q,k,v,o}_proj        | a.self_attn.{q,k,v,o}_proj                                     |
| blocks.i.channel.{gate,up,down}_proj | a.feed_forward.{gate,up,down}_proj (MLP layers)                |
| blocks.i.channel.router              | a.feed_forward.router.weight                                   |
| blocks.i.channel.gate_up, down       | a.feed_forward.experts.{e}.{gate,up,down}_proj, stacked        |
|                                      | (or the 3-D experts.gate_up_proj / down_proj)                  |
| norm.weight                          | model.final_layernorm.weight                                   |
"""

from __future__ import annotations

import dataclasses
import math

from storelab.checkpoint.families._common import experts, gated_mlp, linear, model_config
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Fields, attention_entries, text_fields, tied
from storelab.checkpoint.families.mamba import mixer_entries
from storelab.checkpoint.table import copy

ATTENTION, MAMBA = "attention", "mamba"


def _period(t: Fields, period: str, offset: str, default: tuple[int, int]) -> tuple[int, int]:
    p = t.int(period, default=default[0], minimum=1)
    o = t.int(offset, default=default[1])
    if o >= p:
        raise t._err(offset, f"{o} must be smaller than {period} ({p})")
    return p, o


KINDS = {"attention": ATTENTION, "full_attention": ATTENTION, "mamba": MAMBA, "linear_attention": MAMBA}


def block_types(t: Fields, n: int) -> list[str]:
    """A ``layers_block_type`` (or ``layer_types``) list as written; else "attention" at layers i with
    i % attn_layer_period == attn_layer_offset (transformers' rule) and "mamba" elsewhere."""
    if t.has("layers_block_type", "layer_types"):
        key = t.key("layers_block_type", "layer_types")
        types = t.list(key, n=n)
        for i, x in enumerate(types):
            if x not in KINDS:
                raise t._err(f"{key}[{i}]", f"{x!r} is not a Jamba layer type (mamba, attention)")
        return [KINDS[x] for x in types]
    p, o = _period(t, "attn_layer_period", "attn_layer_offset", (8, 4))
    return [ATTENTION if i % p == o else MAMBA for i in range(n)]


def expert_layers(t: Fields, n: int) -> list[bool]:
    p, o = _period(t, "expert_layer_period", "expert_layer_offset", (2, 1))
    many = t.int("num_experts", "num_local_experts", default=16, minimum=1) > 1
    return [many and i % p == o for i in range(n)]


def to_config(hf: dict):
    from storelab.models.config import LayerConfig
    from storelab.stores.attention import AttentionConfig
    from storelab.stores.depth import ResidualConfig
    from storelab.stores.ffn import FFNConfig
    from storelab.stores.mamba import MambaConfig
    from storelab.stores.moe import MoEConfig

    t = text_fields(hf)
    D, n = t.int("hidden_size", default=4096, minimum=1), t.int("num_hidden_layers", default=32, minimum=1)
    eps = t.float("rms_norm_eps", default=1e-6, positive=True)
    act = t.str("hidden_act", default="silu")
    if act != "silu":
        raise t._err("hidden_act", f"{act!r} is not supported (Jamba's MLPs and Mamba layers use SiLU)")
    rank = t.raw("mamba_dt_rank", default="auto")
    mamba = MambaConfig(d_model=D, d_inner=t.int("mamba_expand", default=2, minimum=1) * D,
                        d_state=t.int("mamba_d_state", default=16, minimum=1),
                        dt_rank=math.ceil(D / 16) if rank == "auto" else t.int("mamba_dt_rank", minimum=1),
                        conv_kernel=t.int("mamba_d_conv", default=4, minimum=1),
                        use_conv_bias=t.bool("mamba_conv_bias", default=True),
                        use_bias=t.bool("mamba_proj_bias", default=False), bcdt_norm="weighted", bcdt_norm_eps=eps)
    H = t.int("num_attention_heads", default=32, minimum=1)
    attention = AttentionConfig(d_model=D, n_heads=H, n_kv_heads=t.int("num_key_value_heads", default=8, minimum=1),
                                head_dim=D // H, partial_rotary=0.0, norm_eps=eps)
    width = t.int("intermediate_size", default=14336, minimum=1)
    layers = []
    for kind, sparse in zip(block_types(t, n), expert_layers(t, n)):
        channel = (MoEConfig(d_model=D, n_experts=t.int("num_experts", "num_local_experts", default=16),
                             top_k=t.int("num_experts_per_tok", default=2, minimum=1), d_expert=width,
                             router="softmax", norm_topk_prob=False, norm_eps=eps)
                   if sparse else FFNConfig(d_model=D, d_ff=width))
        layers.append(LayerConfig(token=attention if kind == ATTENTION else mamba, channel=channel,
                                  depth=ResidualConfig(d_model=D)))
    cfg = model_config(hf, t.d, name="jamba", title="Jamba (checkpoint)", d_model=D, layers=layers, norm_eps=eps,
                       context=t.int("max_position_embeddings", default=262144))
    return dataclasses.replace(cfg, tie_embeddings=tied(hf, t, False), vocab_size=t.int("vocab_size", default=65536,
                                                                                         minimum=1))


def table(hf: dict, cfg, names: set[str]) -> dict:
    tab: dict = {"embed.weight": copy("model.embed_tokens.weight"), "norm.weight": copy("model.final_layernorm.weight")}
    if not cfg.tie_embeddings:
        tab["lm_head.weight"] = copy("lm_head.weight")
    for i, lay in enumerate(cfg.layers):
        a, b = f"model.layers.{i}", f"blocks.{i}"
        tab[f"{b}.norm_token.weight"] = copy(f"{a}.input_layernorm.weight")
        tab[f"{b}.norm_channel.weight"] = copy(f"{a}.pre_ff_layernorm.weight")
        if lay.token.KIND == "mamba":
            mixer_entries(tab, f"{b}.token", f"{a}.mamba", lay.token)
            for ours, theirs in (("dt_norm", "dt_layernorm"), ("b_norm", "b_layernorm"), ("c_norm", "c_layernorm")):
                tab[f"{b}.token.{ours}"] = copy(f"{a}.mamba.{theirs}.weight")
        else:
            attention_entries(tab, f"{b}.token", f"{a}.self_attn", lay.token)
        f, c = f"{a}.feed_forward", f"{b}.channel"
        if lay.channel.KIND == "ffn":
            gated_mlp(tab, (f"{c}.gate_proj", f"{c}.up_proj", f"{c}.down_proj"), f, names, lay.channel.d_ff)
        else:
            linear(tab, f"{c}.router", f"{f}.router")
            experts(tab, c, f"{f}.experts", names, lay.channel.n_experts)
    return tab


FAMILY = Family(stores=("mamba", "attention", "ffn", "moe", "residual"),
                name="jamba", model_types=("jamba",), to_config=to_config, table=table,
                ignored=lambda hf: (r"rotary_emb\.",))
