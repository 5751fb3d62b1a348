"""Granite 4.0 (IBM, ``granitemoehybrid``: granite-4.0-h-small / -tiny / -micro): Mamba-2 and GQA attention
layers as ``layer_types`` lists them ("mamba" / "attention", or "linear_attention" / "full_attention"; all
Mamba-2 when absent), every mixer followed by experts plus a shared MLP (``num_local_experts`` > 0), or by the
shared MLP alone. Pre-norm RMSNorms, eps ``rms_norm_eps``.

* Mamba-2 (``GraniteMoeHybridMambaLayer``): as Bamba's (``bamba.hybrid_mamba2``).
* Attention (``GraniteMoeHybridAttention``): the logits scaled by ``attention_multiplier`` (our
  ``attn_scale``) instead of head_dim^-1/2; RoPE over the whole head when ``position_embedding_type`` is
  "rope", else no positions at all (NoPE: "nope" in the published files, and transformers' default).
* Experts (``GraniteMoeHybridMoE``): ``num_local_experts`` of width ``intermediate_size``, the top
  ``num_experts_per_tok`` logits softmaxed among themselves; the shared MLP (``shared_mlp``, width
  ``shared_intermediate_size``) added unweighted, our moe store's shared expert.
* muP multipliers: ``embedding_multiplier`` -> ``embed_scale``; the logits divided by ``logits_scaling`` ->
  ``logit_scale`` = 1 / logits_scaling; ``residual_multiplier`` m scales each mixer's and each channel's
  output before its residual add, x + m f(x). Our blocks add f(x) as it is, so m is folded into the weights
  at load: the rows of every output projection (attention's o_proj, Mamba-2's out_proj, the experts' and the
  shared MLP's down projections, and their biases) are multiplied by m (the table's ``Src`` says
  "x residual_multiplier"). The loaded model computes the same function; its tensors are not the file's.

Fields the published files leave out take transformers' defaults (``GraniteMoeHybridConfig``).

Names (transformers' ``GraniteMoeHybridForCausalLM``; ``a`` = ``model.layers.i``, ``m`` = a.block_sparse_moe):

| ours                                 | transformers                                                        |
|--------------------------------------|---------------------------------------------------------------------|
| blocks.i.norm_token / norm_channel   | a.input_layernorm / a.post_attention_layernorm                      |
| blocks.i.token.* (mamba2)            | a.mamba.* (Mamba2Mixer's names; out_proj x m)                       |
| blocks.i.token.{q,k,v,o}_proj        | a.self_attn.{q,k,v,o}_proj (o_proj x m)                             |
| blocks.i.channel.router              | m.router.layer.weight (or m.router.weight)                          |
| blocks.i.channel.gate_up             | m.input_linear.weight [E, 2I, D] (or m.experts.gate_up_proj)        |
| blocks.i.channel.down                | m.output_linear.weight [E, D, I] x m (or m.experts.down_proj)       |
| blocks.i.channel.shared_{gate,up}_proj | a.shared_mlp.input_linear.weight [2S, D]: gate rows, then up rows |
| blocks.i.channel.shared_down_proj    | a.shared_mlp.output_linear.weight x m                               |
| blocks.i.channel.{gate,up,down}_proj | the same shared_mlp tensors, when there are no experts              |
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families._common import base_entries, either, model_config
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Fields, attention_entries, rope_of, text_fields, tied
from storelab.checkpoint.families.bamba import check_silu, hybrid_mamba2, runs as bamba_runs
from storelab.checkpoint.families.mamba import mixer_entries
from storelab.checkpoint.table import Src, copy, rows

KINDS = {"mamba": "linear_attention", "attention": "full_attention", "linear_attention": "linear_attention",
         "full_attention": "full_attention"}


def block_types(t: Fields, n: int) -> list[str]:
    types = t.list("layer_types", "layers_block_type", n=n, default=["mamba"] * n)
    for i, x in enumerate(types):
        if x not in KINDS:
            raise t._err(f"layer_types[{i}]", f"{x!r} is not a Granite 4.0 layer type (mamba, attention)")
    return [KINDS[x] for x in types]


def residual_multiplier(hf: dict) -> float:
    m = text_fields(hf).float("residual_multiplier", default=1.0)
    if m <= 0:
        raise text_fields(hf)._err("residual_multiplier", f"must be > 0, got {m}")
    return m


def to_config(hf: dict):
    from storelab.models.config import LayerConfig
    from storelab.stores.attention import AttentionConfig
    from storelab.stores.depth import ResidualConfig
    from storelab.stores.ffn import FFNConfig
    from storelab.stores.moe import MoEConfig

    t = text_fields(hf)
    D, n = t.int("hidden_size", default=4096, minimum=1), t.int("num_hidden_layers", default=32, minimum=1)
    eps = t.float("rms_norm_eps", default=1e-6, positive=True)
    check_silu(t, "Granite 4.0")
    residual_multiplier(hf)
    mamba = hybrid_mamba2(t, D, eps)
    H, bias = t.int("num_attention_heads", default=32, minimum=1), t.bool("attention_bias", default=False)
    rope = t.str("position_embedding_type", default="nope") == "rope"
    attention = AttentionConfig(d_model=D, n_heads=H, n_kv_heads=t.int("num_key_value_heads", default=H, minimum=1),
                                head_dim=D // H, partial_rotary=1.0 if rope else 0.0, rope_theta=rope_of(t).theta,
                                attn_scale=t.float("attention_multiplier", default=1.0, positive=True), qkv_bias=bias,
                                out_bias=bias, norm_eps=eps)
    shared = t.int("shared_intermediate_size", default=1024, minimum=1)
    E = t.int("num_local_experts", default=8)
    if E:
        channel = MoEConfig(d_model=D, n_experts=E, top_k=t.int("num_experts_per_tok", default=2, minimum=1),
                            d_expert=t.int("intermediate_size", default=11008, minimum=1), router="softmax",
                            norm_topk_prob=True, n_shared=1, d_shared=shared, norm_eps=eps)
    else:
        channel = FFNConfig(d_model=D, d_ff=shared)
    layers = [LayerConfig(token=attention if kind == "full_attention" else mamba, channel=channel,
                          depth=ResidualConfig(d_model=D)) for kind in block_types(t, n)]
    cfg = model_config(hf, t.d, name="granitemoehybrid", title="Granite 4.0 (checkpoint)", d_model=D, layers=layers,
                       norm_eps=eps, context=t.int("max_position_embeddings", default=2048))
    logits = t.float("logits_scaling", default=1.0)
    if logits <= 0:
        raise t._err("logits_scaling", f"must be > 0, got {logits}")
    return dataclasses.replace(cfg, tie_embeddings=tied(hf, t, False), vocab_size=t.int("vocab_size", default=32000,
                                                                                         minimum=1),
                               embed_scale=t.float("embedding_multiplier", default=1.0, positive=True), logit_scale=1.0 / logits)


def _times(name: str, m: float) -> Src:
    return Src((name,), lambda w: w * m, f"x residual_multiplier {m:g}")


def table(hf: dict, cfg, names: set[str]) -> dict:
    m = residual_multiplier(hf)
    tab: dict = {}
    base_entries(tab, cfg)
    for i, lay in enumerate(cfg.layers):
        a, b = f"model.layers.{i}", f"blocks.{i}"
        o, tok = f"{b}.token", lay.token
        if tok.KIND == "mamba2":
            mixer_entries(tab, o, f"{a}.mamba", tok)
            out = (f"{o}.out_proj", f"{a}.mamba.out_proj", tok.use_bias)
        else:
            attention_entries(tab, o, f"{a}.self_attn", tok)
            out = (f"{o}.o_proj", f"{a}.self_attn.o_proj", tok.out_bias)
        tab[f"{out[0]}.weight"] = _times(f"{out[1]}.weight", m)
        if out[2]:
            tab[f"{out[0]}.bias"] = _times(f"{out[1]}.bias", m)
        c, ch, s = f"{b}.channel", lay.channel, f"{a}.shared_mlp"
        if ch.KIND == "ffn":
            gate, up, down, S = f"{c}.gate_proj", f"{c}.up_proj", f"{c}.down_proj", ch.d_ff
        else:
            gate, up, down, S = f"{c}.shared_gate_proj", f"{c}.shared_up_proj", f"{c}.shared_down_proj", ch.shared_width
            e = f"{a}.block_sparse_moe"
            tab[f"{c}.router.weight"] = copy(either(names, f"{e}.router.layer.weight", f"{e}.router.weight"))
            tab[f"{c}.gate_up"] = copy(either(names, f"{e}.input_linear.weight", f"{e}.experts.gate_up_proj"))
            tab[f"{c}.down"] = _times(either(names, f"{e}.output_linear.weight", f"{e}.experts.down_proj"), m)
        tab[f"{gate}.weight"] = rows(f"{s}.input_linear.weight", 0, S)
        tab[f"{up}.weight"] = rows(f"{s}.input_linear.weight", S, 2 * S)
        tab[f"{down}.weight"] = _times(f"{s}.output_linear.weight", m)
    return tab


def runs(hf: dict) -> None:
    """Plain RoPE only, where the attention rotates at all (``position_embedding_type`` "rope")."""
    if text_fields(hf).str("position_embedding_type", default="nope") == "rope":
        bamba_runs(hf)


FAMILY = Family(stores=("mamba2", "attention", "ffn", "moe", "residual"),
                name="granitemoehybrid", model_types=("granitemoehybrid",), to_config=to_config, table=table,
                ignored=lambda hf: (r"rotary_emb\.",), runs=runs)
