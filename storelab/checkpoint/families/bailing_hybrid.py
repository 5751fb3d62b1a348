"""Ling / Ring linear hybrids (Ant Group's inclusionAI; ``bailing_hybrid``, e.g. Ling-3.0-Flash): Kimi Delta
Attention (storelab's ``kda``, arXiv 2510.26692) in most layers, gated multi-head latent attention (``mla``,
arXiv 2405.04434) in the last layer of every ``layer_group_size`` (6), DeepSeek-V3's experts.

The delta attention (``BailingHybridDeltaAttention``), per head and token, after a causal SiLU convolution of
``short_conv_kernel_size`` taps over q, k and v (q and k L2-normalised):

  S_t = diag(alpha_t) (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,   beta_t = sigmoid(W_b x_t)
  log alpha_t = lb sigmoid(exp(A_log) (W_f x_t + dt_bias))        (``kda_safe_gate``, lb = ``kda_lower_bound``)
              = -exp(A_log) softplus(W_f x_t + dt_bias)            (without it: Kimi Linear's gate)
  y_t = W_o (RMSNorm(o_t) * sigmoid(W_g x_t))                      (per head; eps ``rms_norm_eps``)

storelab's ``kda`` store is this rule with two settings: the bounded gate (``gate_lower_bound``) and the
full-rank output gate W_g [H*K, D] (``full_rank_output_gate``, Kimi K3's). What differs from Kimi's layers is
the forget gate's projection: one full-rank W_f [H*K, D] here (``f_proj``), a rank-K pair W_fb W_fa in Kimi
Linear and K3; ``KDAConfig.full_rank_forget_gate`` says so. Heads: ``linear_num_heads`` (default
``num_attention_heads``) of ``linear_head_dim`` (the published ``head_dim``: transformers' config moves it
there and keeps ``qk_rope_head_dim`` in ``head_dim``), keys and values alike.

The attention (``BailingHybridAttention``): MLA without a query latent (``q_proj``), DeepSeek's interleaved
RoPE on the ``qk_rope_head_dim`` channels, and each head's output times sigmoid(W_g x), W_g [H, D]
(``MLAConfig.head_gate``). The MLP: ``first_k_dense_replace`` (or ``mlp_layer_types``) dense SwiGLU layers
``intermediate_size`` wide, then ``num_experts`` experts ``moe_intermediate_size`` wide chosen by sigmoid
scores plus ``expert_bias`` among ``topk_group`` of ``num_expert_group`` groups, renormalised
(``moe_renormalize``) and scaled by ``routed_scaling_factor``, beside ``num_shared_experts`` shared ones.
Pre norms. The MTP layers stored after the decoder's (``num_nextn_predict_layers``) are ignored.

Parameters of a delta layer: q, k, v D*H*K each, the convolution 3 H K W, b D*H, W_f D*H*K, dt_bias H*K,
A_log H, W_g D*H*K, the output norm K, the output H*K*D. Its state: H matrices K x K (fp32) and W - 1 inputs
of the convolution (transformers keeps W).

Names as published (and as ``save_pretrained`` writes them; transformers renames them when it loads);
``a`` = ``model.layers.i.attention``:

| ours                                     | checkpoint                                            |
|------------------------------------------|-------------------------------------------------------|
| embed.weight                             | model.word_embeddings.weight                          |
| blocks.i.token.{q,k,v}_proj, b_proj, g_proj | a.{q,k,v}_proj, a.b_proj, a.g_proj (delta layers)  |
| blocks.i.token.f_proj, dt_bias, A_log    | a.f_proj, a.dt_bias, a.A_log                          |
| blocks.i.token.conv_weight               | a.{q,k,v}_conv1d.weight joined, [C, 1, W] -> [C, W]   |
| blocks.i.token.o_norm, o_proj            | a.o_norm.weight, a.dense                              |
| blocks.i.token.q_proj, kv_down, kv_norm  | a.q_proj, a.kv_a_proj_with_mqa, a.kv_a_layernorm (MLA) |
| blocks.i.token.kv_up, out, gate          | a.kv_b_proj, a.dense, a.g_proj (MLA)                  |
| blocks.i.channel.choice_bias             | model.layers.i.mlp.gate.expert_bias                   |
"""

from __future__ import annotations

import dataclasses

import torch

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._common import layer_prefix, linear, mla_entries
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import FULL, RUNS_ROPE, Decl, Fields, rope_of
from storelab.checkpoint.table import Src, copy

LINEAR = "linear_attention"


def bailing_types(t: Fields, n: int) -> list[str]:
    """``layer_types``, else full attention in the last layer of every ``layer_group_size``."""
    if t.has("layer_types"):
        types = t.list("layer_types", n=n)
    else:
        every = t.int("layer_group_size", default=6, minimum=1)
        types = [FULL if (i + 1) % every == 0 else LINEAR for i in range(n)]
    for i, x in enumerate(types):
        if x not in (LINEAR, FULL):
            raise t._err(f"layer_types[{i}]", f"{x!r} is not a Bailing hybrid layer type ({LINEAR}, {FULL})")
    return types


def bailing_token(t: Fields, i: int, kind: str, decl: Decl, D: int, eps: float):
    from storelab.stores.mla import MLAConfig
    from storelab.stores.recurrent import KDAConfig

    H = t.int("num_attention_heads", minimum=1)
    if kind == LINEAR:
        K = t.int("linear_head_dim", "head_dim", default=128, minimum=1)
        bounded = t.bool("kda_safe_gate", default=True)
        if bounded and t.float("kda_lower_bound", default=-5.0) >= 0:
            raise t._err("kda_lower_bound", f"must be a number < 0 (a log retention), got {t.d['kda_lower_bound']!r}")
        return KDAConfig(d_model=D, n_heads=t.int("linear_num_heads", default=H, minimum=1), head_k_dim=K,
                         head_v_dim=K, conv_kernel=t.int("linear_conv_kernel_dim", "short_conv_kernel_size",
                                                         default=4, minimum=1),
                         gate_lower_bound=t.float("kda_lower_bound", default=-5.0) if bounded else None,
                         full_rank_output_gate=True, full_rank_forget_gate=True, norm_eps=eps)
    if t.bool("attention_bias", default=False):
        raise t._err("attention_bias", "true is not supported (storelab's MLA projections have no biases)")
    rp = rope_of(t, theta=decl.theta)
    return MLAConfig(d_model=D, n_heads=H, kv_lora_rank=t.int("kv_lora_rank", minimum=1),
                     qk_nope_head_dim=t.int("qk_nope_head_dim", minimum=1),
                     qk_rope_head_dim=t.int("qk_rope_head_dim", minimum=0), v_head_dim=t.int("v_head_dim", minimum=1),
                     rope_theta=rp.theta, rope_scaling=rp.scaling if rp.kind in RUNS_ROPE[1:] else None,
                     head_gate=True, norm_eps=eps)


def bailing_token_table(tab: dict, o: str, a: str, tok, names: set[str]) -> None:
    """``a`` is the reader's ``...layers.i.self_attn``; the published files say ``...layers.i.attention``."""
    a = a.rsplit(".", 1)[0] + ".attention"
    if tok.KIND == "mla":
        mla_entries(tab, o, a, tok)
        linear(tab, f"{o}.out", f"{a}.dense")
        linear(tab, f"{o}.gate", f"{a}.g_proj")
        return
    for p in ("q_proj", "k_proj", "v_proj", "b_proj", "f_proj", "g_proj"):
        linear(tab, f"{o}.{p}", f"{a}.{p}")
    linear(tab, f"{o}.o_proj", f"{a}.dense")
    tab[f"{o}.conv_weight"] = Src(tuple(f"{a}.{p}_conv1d.weight" for p in "qkv"),
                                  lambda *ws: torch.cat(ws, 0).squeeze(1),
                                  "q, k, v convolutions joined, [C, 1, W] -> [C, W]")
    tab[f"{o}.A_log"] = copy(f"{a}.A_log")
    tab[f"{o}.dt_bias"] = copy(f"{a}.dt_bias")
    tab[f"{o}.o_norm"] = copy(f"{a}.o_norm.weight")


def bailing_names(tab: dict, hf: dict, cfg, names: set[str]) -> None:
    pre, _ = layer_prefix(names)
    tab["embed.weight"] = copy(f"{pre}word_embeddings.weight")
    for i, lay in enumerate(cfg.layers):
        if lay.channel.KIND == "moe" and lay.channel.router_bias:
            tab[f"blocks.{i}.channel.choice_bias"] = copy(f"{pre}layers.{i}.mlp.gate.expert_bias")


DECL = Decl(name="bailing_hybrid", model_types=("bailing_hybrid",), title="Ling / Ring linear hybrid (checkpoint)",
            router="sigmoid", router_bias=True, eps=1e-6, theta=6e6, mtp=True, types=bailing_types,
            token=bailing_token, token_table=bailing_token_table, extra=bailing_names)


def to_config(hf: dict):
    """The reader's layers; the experts renormalised by ``moe_renormalize`` (transformers' ``norm_topk_prob``)."""
    t = _reader.text_fields(hf)
    cfg = _reader.to_config(DECL, hf)
    renorm = t.bool("norm_topk_prob", "moe_renormalize", default=True)

    def routed(lay):
        if lay.channel.KIND != "moe":
            return lay
        return dataclasses.replace(lay, channel=dataclasses.replace(lay.channel, norm_topk_prob=renorm))

    return dataclasses.replace(cfg, layers=[routed(lay) for lay in cfg.layers])


FAMILY = Family(stores=("kda", "mla", "ffn", "moe", "residual"),
                name=DECL.name, model_types=DECL.model_types, to_config=to_config,
                table=lambda hf, cfg, names: _reader.table(DECL, hf, cfg, names),
                ignored=lambda hf: _reader._ignored(DECL, hf), runs=lambda hf: _reader.runs(DECL, hf))
