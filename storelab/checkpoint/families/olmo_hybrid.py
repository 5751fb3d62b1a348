"""Olmo Hybrid (AllenAI, ``olmo_hybrid``; essay section 6, arXiv 2604.03444): Gated DeltaNet layers
(arXiv 2412.06464, storelab's ``gated_deltanet``) with OLMo 3's full attention in every fourth layer.

The Gated DeltaNet layer, per value head and token (q and k L2-normalised, after a causal SiLU
convolution of ``linear_conv_kernel_dim`` taps over q, k and v):

  S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,   o_t = S_t^T q_t / sqrt(K)
  alpha_t = exp(-exp(A_log) softplus(W_a x_t + dt_bias)),  beta_t = beta_max sigmoid(W_b x_t)

with ``beta_max`` = 2 under ``linear_allow_neg_eigval`` (default true: I - beta k k^T may reflect,
the published models' setting) and 1 otherwise; the read is RMS-normalised per head (eps 1e-5,
whatever ``rms_norm_eps`` says) and gated by SiLU(W_g x). The layers differ in their norms:

* ``linear_attention`` layers: Llama's pre norms (``input_layernorm``, ``post_attention_layernorm``);
* ``full_attention`` layers: OLMo 3's post norms, x + norm(f(x)) (``post_attention_layernorm``,
  ``post_feedforward_layernorm``), one RMSNorm over all heads' query channels and one over the keys'
  before RoPE (``qk_norm_scope = "all"``), no window, biases on q, k, v and o with ``attention_bias``.

Every layer has a SwiGLU MLP ``intermediate_size`` wide. ``layer_types`` as given, else transformers'
default: full attention at every i with i % 4 == 3 (the last layer when there is none). RoPE: a file
with no ``rope_parameters`` (or null, or without ``rope_theta``) rotates with theta 10,000, as
transformers 5.23 reads it (its NoPE branch is never reached from a saved config). Defaults:
``linear_num_key_heads`` and ``linear_num_value_heads`` = ``num_attention_heads``, K =
``linear_key_head_dim`` = int(0.75 D / H), V = ``linear_value_head_dim`` = 2K, ``rms_norm_eps`` 1e-6.

Parameters of a Gated DeltaNet layer: q, k D*H*K each, v and the gate W_g D*HV*V each, a and b D*HV
each, the convolution (2HK + HV*V) W, A_log and dt_bias HV each, the output norm V and the output
projection HV*V*D. Its state per sequence: HV*K*V numbers of the recurrence (fp32) and W - 1 inputs
of the convolution (transformers keeps W).

Names as published (and as ``save_pretrained`` writes them; ``a`` = ``model.layers.i``). transformers renames
them when it loads (``conversion_mapping``: ``attention_layer_norm`` -> ``input_layernorm``,
``feedforward_layer_norm`` -> ``post_attention_layernorm``, the three convolutions concatenated into
``conv1d``); a folder in those names reads too.

| ours                                    | transformers                                         |
|-----------------------------------------|------------------------------------------------------|
| blocks.i.norm_token / norm_channel      | a.attention_layer_norm / a.feedforward_layer_norm (linear layers) |
| blocks.i.norm_token / norm_channel      | a.feedforward_layer_norm / a.post_feedforward_layernorm (attention) |
| blocks.i.token.{q,k,v}_proj, z_proj     | a.linear_attn.{q,k,v}_proj, a.linear_attn.g_proj     |
| blocks.i.token.{a,b}_proj, A_log, dt_bias | a.linear_attn.{a,b}_proj, A_log, dt_bias           |
| blocks.i.token.conv_weight              | a.linear_attn.{q,k,v}_conv1d.weight stacked, [C, 1, W] -> [C, W] |
| blocks.i.token.o_norm, o_proj           | a.linear_attn.o_norm.weight, a.linear_attn.o_proj    |
| blocks.i.token.{q,k,v,o}_proj, {q,k}_norm | a.self_attn.* (attention; norms H*K and G*K wide) |
| blocks.i.channel.{gate,up,down}_proj    | a.mlp.{gate,up,down}_proj                            |
"""

from __future__ import annotations

import dataclasses

import torch

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._common import layer_prefix, linear
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import FULL, Decl, Fields, attention_entries
from storelab.checkpoint.families.olmo2 import olmo_attention
from storelab.checkpoint.table import Src, copy

LINEAR = "linear_attention"
O_NORM_EPS = 1e-5  # OlmoHybridGatedDeltaNet's o_norm: fixed, not rms_norm_eps


def hybrid_types(t: Fields, n: int) -> list[str]:
    """``layer_types``, else full attention at i % 4 == 3 (the last layer when none is)."""
    if t.has("layer_types"):
        types = t.list("layer_types", n=n)
    else:
        types = [FULL if i % 4 == 3 else LINEAR for i in range(n)]
        if FULL not in types:
            types[-1] = FULL
    for i, x in enumerate(types):
        if x not in (LINEAR, FULL):
            raise t._err(f"layer_types[{i}]", f"{x!r} is not an Olmo Hybrid layer type ({LINEAR}, {FULL})")
    return types


def hybrid_token(t: Fields, i: int, kind: str, decl: Decl, D: int, eps: float):
    from storelab.stores.recurrent import GatedDeltaNetConfig

    if kind == FULL:
        return olmo_attention(t, i, kind, decl, D, eps)
    H = t.int("num_attention_heads", minimum=1)
    HK = t.int("linear_num_key_heads", default=H, minimum=1)
    HV = t.int("linear_num_value_heads", default=H, minimum=1)
    if HV % HK:
        raise t._err("linear_num_value_heads", f"{HV} value heads are not a multiple of {HK} key heads")
    K = t.int("linear_key_head_dim", default=int(0.75 * D / HK), minimum=1)
    V = t.int("linear_value_head_dim", default=2 * K, minimum=1)
    return GatedDeltaNetConfig(d_model=D, n_heads=HK, n_v_heads=HV, head_k_dim=K, head_v_dim=V,
                               conv_kernel=t.int("linear_conv_kernel_dim", default=4, minimum=1),
                               beta_max=2.0 if t.bool("linear_allow_neg_eigval", default=True) else 1.0,
                               norm_eps=O_NORM_EPS)


def hybrid_token_table(tab: dict, o: str, a: str, tok, names: set[str]) -> None:
    """``a`` is the reader's ``...layers.i.self_attn``; a Gated DeltaNet sits at ``...layers.i.linear_attn``."""
    if tok.KIND != "gated_deltanet":
        attention_entries(tab, o, a, tok)
        return
    g = a.rsplit(".", 1)[0] + ".linear_attn"
    for ours, theirs in (("q_proj", "q_proj"), ("k_proj", "k_proj"), ("v_proj", "v_proj"), ("z_proj", "g_proj"),
                         ("a_proj", "a_proj"), ("b_proj", "b_proj"), ("o_proj", "o_proj")):
        linear(tab, f"{o}.{ours}", f"{g}.{theirs}")
    if f"{g}.conv1d.weight" in names:
        tab[f"{o}.conv_weight"] = Src((f"{g}.conv1d.weight",), lambda w: w.squeeze(1), "[C, 1, W] -> [C, W]")
    else:   # the published layout: one convolution each for q, k and v
        tab[f"{o}.conv_weight"] = Src(tuple(f"{g}.{p}_conv1d.weight" for p in "qkv"),
                                      lambda q, k, v: torch.cat([q, k, v]).squeeze(1),
                                      "q, k, v rows stacked, [C, 1, W] -> [C, W]")
    tab[f"{o}.A_log"] = copy(f"{g}.A_log")
    tab[f"{o}.dt_bias"] = copy(f"{g}.dt_bias")
    tab[f"{o}.o_norm"] = copy(f"{g}.o_norm.weight")


def hybrid_norms(tab: dict, hf: dict, cfg, names: set[str]) -> None:
    """The block norms under either layout's names: the published files' ``attention_layer_norm`` /
    ``feedforward_layer_norm`` (what ``save_pretrained`` writes) or transformers' module names; the attention
    layers' post norms in place of the reader's pre norms."""
    pre, _ = layer_prefix(names)
    for i, lay in enumerate(cfg.layers):
        a, b = f"{pre}layers.{i}", f"blocks.{i}"
        saved = f"{a}.feedforward_layer_norm.weight" in names
        after_token = f"{a}.feedforward_layer_norm.weight" if saved else f"{a}.post_attention_layernorm.weight"
        if lay.norms == "post":
            tab[f"{b}.norm_token.weight"] = copy(after_token)
            tab[f"{b}.norm_channel.weight"] = copy(f"{a}.post_feedforward_layernorm.weight")
        else:
            tab[f"{b}.norm_token.weight"] = copy(f"{a}.attention_layer_norm.weight" if saved
                                                 else f"{a}.input_layernorm.weight")
            tab[f"{b}.norm_channel.weight"] = copy(after_token)


DECL = Decl(name="olmo_hybrid", model_types=("olmo_hybrid",), title="Olmo Hybrid (checkpoint)", qk_norm=True,
            eps=1e-6, types=hybrid_types, token=hybrid_token, token_table=hybrid_token_table, extra=hybrid_norms)


def to_config(hf: dict):
    """The reader's layers, the attention ones with OLMo 3's post norms."""
    cfg = _reader.to_config(DECL, hf)
    layers = [dataclasses.replace(lay, norms="post") if lay.token.KIND == "attention" else lay for lay in cfg.layers]
    return dataclasses.replace(cfg, layers=layers)


FAMILY = Family(stores=("gated_deltanet", "attention", "ffn", "residual"),
                name=DECL.name, model_types=DECL.model_types, to_config=to_config,
                table=lambda hf, cfg, names: _reader.table(DECL, hf, cfg, names),
                ignored=lambda hf: DECL.ignored, runs=lambda hf: _reader.runs(DECL, hf))
