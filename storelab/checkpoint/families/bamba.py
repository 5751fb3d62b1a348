"""Bamba (IBM, ``bamba``: Bamba-9B): Mamba-2 layers with a few GQA attention layers at
``attn_layer_indices``, every mixer followed by a SwiGLU MLP (``intermediate_size``, biases with
``mlp_bias``). Pre-norm RMSNorms, eps ``rms_norm_eps``.

* Mamba-2 (``BambaMixer``, transformers' Mamba2Mixer under ``mamba_*`` names): storelab's ``mamba2`` store,
  ``mamba_n_heads`` heads of ``mamba_d_head`` ("auto": mamba_expand x hidden / heads), ``mamba_d_state``,
  ``mamba_n_groups``, ``mamba_d_conv``, ``mamba_conv_bias``, ``mamba_proj_bias``, ``time_step_limit``, the
  gated group norm with eps ``rms_norm_eps``.
* Attention (``BambaAttention``): GQA with RoPE on half of each head (transformers sets
  ``partial_rotary_factor`` 0.5 whatever the file says), ``rope_theta``, biases with ``attention_bias``.

Fields the published files leave out take transformers' defaults (``BambaConfig``).

Names (transformers' ``BambaForCausalLM``; ``a`` = ``model.layers.i``):

| ours                                 | transformers                                       |
|--------------------------------------|----------------------------------------------------|
| blocks.i.norm_token / norm_channel   | a.input_layernorm / a.pre_ff_layernorm             |
| blocks.i.token.* (mamba2)            | a.mamba.* (Mamba2Mixer's names)                    |
| blocks.i.token.{q,k,v,o}_proj        | a.self_attn.{q,k,v,o}_proj                         |
| blocks.i.channel.{gate,up,down}_proj | a.feed_forward.{gate,up,down}_proj                 |
| norm.weight                          | model.final_layernorm.weight                       |
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families._common import gated_mlp, linear, model_config
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Fields, attention_entries, rope_of, text_fields, tied
from storelab.checkpoint.families.mamba import mixer_entries, time_step_limit
from storelab.checkpoint.table import copy


def hybrid_mamba2(t: Fields, D: int, eps: float):
    """The Mamba-2 mixer of IBM's hybrids (``BambaMixer``, ``GraniteMoeHybridMambaLayer``) from its fields."""
    from storelab.stores.mamba2 import Mamba2Config

    heads = t.int("mamba_n_heads", default=128, minimum=1)
    inner = t.int("mamba_expand", default=2, minimum=1) * D
    if t.raw("mamba_d_head", default="auto") == "auto":
        if inner % heads:
            raise t._err("mamba_n_heads", f"{heads} heads do not divide mamba_expand x hidden_size = {inner}")
        head_dim = inner // heads
    else:
        head_dim = t.int("mamba_d_head", minimum=1)
    if head_dim * heads != inner:
        raise t._err("mamba_d_head", f"{head_dim} x {heads} heads is not mamba_expand x hidden_size = {inner}")
    return Mamba2Config(d_model=D, n_heads=heads, head_dim=head_dim, d_state=t.int("mamba_d_state", default=256,
                                                                                   minimum=1),
                        n_groups=t.int("mamba_n_groups", default=1, minimum=1),
                        conv_kernel=t.int("mamba_d_conv", default=4, minimum=1), norm_eps=eps,
                        use_conv_bias=t.bool("mamba_conv_bias", default=True),
                        use_bias=t.bool("mamba_proj_bias", default=False), dt_limit=time_step_limit(t),
                        chunk_size=t.int("mamba_chunk_size", default=256, minimum=1))


def check_silu(t: Fields, family: str) -> None:
    act = t.str("hidden_act", default="silu")
    if act != "silu":
        raise t._err("hidden_act", f"{act!r} is not supported ({family}'s MLPs and Mamba-2 layers use SiLU)")


def block_types(t: Fields, n: int) -> list[str]:
    where = t.list("attn_layer_indices", default=[])
    for j, x in enumerate(where):
        if isinstance(x, bool) or not isinstance(x, int):
            raise t._err(f"attn_layer_indices[{j}]", f"must be a layer index, got {x!r}")
    return ["full_attention" if i in where else "linear_attention" for i in range(n)]


def to_config(hf: dict):
    from storelab.models.config import LayerConfig
    from storelab.stores.attention import AttentionConfig
    from storelab.stores.depth import ResidualConfig
    from storelab.stores.ffn import FFNConfig

    t = text_fields(hf)
    D, n = t.int("hidden_size", default=4096, minimum=1), t.int("num_hidden_layers", default=32, minimum=1)
    eps = t.float("rms_norm_eps", default=1e-5, positive=True)
    check_silu(t, "Bamba")
    mamba = hybrid_mamba2(t, D, eps)
    H, bias = t.int("num_attention_heads", default=32, minimum=1), t.bool("attention_bias", default=False)
    attention = AttentionConfig(d_model=D, n_heads=H, n_kv_heads=t.int("num_key_value_heads", default=8, minimum=1),
                                head_dim=t.int("head_dim", default=D // H, minimum=1), partial_rotary=0.5,
                                rope_theta=rope_of(t).theta, qkv_bias=bias, out_bias=bias, norm_eps=eps)
    mlp = FFNConfig(d_model=D, d_ff=t.int("intermediate_size", default=14336, minimum=1),
                    bias=t.bool("mlp_bias", default=False))
    layers = [LayerConfig(token=attention if kind == "full_attention" else mamba, channel=mlp,
                          depth=ResidualConfig(d_model=D)) for kind in block_types(t, n)]
    cfg = model_config(hf, t.d, name="bamba", title="Bamba (checkpoint)", d_model=D, layers=layers, norm_eps=eps,
                       context=t.int("max_position_embeddings", default=262144))
    return dataclasses.replace(cfg, tie_embeddings=tied(hf, t, False), vocab_size=t.int("vocab_size", default=128000,
                                                                                         minimum=1))


def table(hf: dict, cfg, names: set[str]) -> dict:
    tab: dict = {"embed.weight": copy("model.embed_tokens.weight"), "norm.weight": copy("model.final_layernorm.weight")}
    if not cfg.tie_embeddings:
        tab["lm_head.weight"] = copy("lm_head.weight")
    for i, lay in enumerate(cfg.layers):
        a, b = f"model.layers.{i}", f"blocks.{i}"
        tab[f"{b}.norm_token.weight"] = copy(f"{a}.input_layernorm.weight")
        tab[f"{b}.norm_channel.weight"] = copy(f"{a}.pre_ff_layernorm.weight")
        if lay.token.KIND == "mamba2":
            mixer_entries(tab, f"{b}.token", f"{a}.mamba", lay.token)
        else:
            attention_entries(tab, f"{b}.token", f"{a}.self_attn", lay.token)
        c, f = f"{b}.channel", f"{a}.feed_forward"
        if lay.channel.bias:
            for p in ("gate_proj", "up_proj", "down_proj"):
                linear(tab, f"{c}.{p}", f"{f}.{p}", bias=True)
        else:
            gated_mlp(tab, (f"{c}.gate_proj", f"{c}.up_proj", f"{c}.down_proj"), f, names, lay.channel.d_ff)
    return tab


def runs(hf: dict) -> None:
    """Plain RoPE only: another rope type (``rope_parameters.rope_type``) is read for accounting, refused here."""
    t = text_fields(hf)
    kind = rope_of(t).kind
    if kind != "default":
        key = "rope_scaling" if t.has("rope_scaling") else "rope_parameters"
        raise t._err(f"{key}.rope_type", f"{kind!r}: storelab's attention runs plain RoPE only "
                                         f"(accounting reads it; loading weights does not)")


FAMILY = Family(stores=("mamba2", "attention", "ffn", "residual"),
                name="bamba", model_types=("bamba",), to_config=to_config, table=table,
                ignored=lambda hf: (r"rotary_emb\.",), runs=runs)
