"""Falcon-H1 (TII, arXiv 2507.22448; ``falcon_h1``: Falcon-H1 0.5B to 34B, Falcon-H1R): every layer runs GQA
attention and a Mamba-2 mixer side by side on the same normalised input, their outputs summed (our layer's
``token`` and ``beside`` slots), then a SwiGLU MLP. Pre-norm RMSNorms (``input_layernorm``, ``pre_ff_layernorm``,
``final_layernorm``), eps ``rms_norm_eps``.

The muP multipliers of transformers' ``FalconH1ForCausalLM`` are folded into the weights they scale, so the stores
are the plain ones (each fold is exact up to the rounding of one product):

* ``attention_in_multiplier`` (on the attention's input) into ``q_proj``, ``k_proj``, ``v_proj``;
  ``key_multiplier`` (on the keys, before RoPE: a rotation commutes with a scalar) into ``k_proj`` and its bias;
  ``attention_out_multiplier`` into ``o_proj`` and its bias;
* ``ssm_in_multiplier`` (on the mixer's input) and ``ssm_multipliers`` (five factors on the rows of ``in_proj``'s
  output: z, x, B, C, dt; the mixer's ``mup_vector``) into ``in_proj`` (its bias takes the row factors only);
  ``ssm_out_multiplier`` into ``out_proj`` and its bias;
* ``mlp_multipliers`` (gate, down) into ``gate_proj`` and ``down_proj``;
* ``embedding_multiplier`` is the model's ``embed_scale``; ``lm_head_multiplier`` its ``logit_scale``.

Mamba-2 (``FalconH1Mixer``): ``mamba_d_ssm`` (else ``mamba_expand`` x hidden) channels in ``mamba_n_heads`` heads of
``mamba_d_head``, ``mamba_d_state``, ``mamba_n_groups``, ``mamba_d_conv``, ``time_step_limit``; the gated group norm
when ``mamba_rms_norm`` (``mamba_norm_before_gate`` says where the gate goes), else o * SiLU(z). ``in_proj`` has a
bias with ``mamba_proj_bias``, ``out_proj`` with ``projectors_bias``: storelab's mixer has both or neither, so
files where they differ are refused naming the field.

Names (``a`` = ``model.layers.i``): ``a.self_attn.*`` -> ``blocks.i.token.*``, ``a.mamba.*`` (Mamba2Mixer's names)
-> ``blocks.i.beside.*``, ``a.feed_forward.*`` -> ``blocks.i.channel.*``; ``model.final_layernorm``.
"""

from __future__ import annotations

import dataclasses

import torch

from storelab.checkpoint.families._common import linear, model_config
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Fields, RUNS_ROPE, rope_of, text_fields, tied
from storelab.checkpoint.families.mamba import mixer_entries, time_step_limit
from storelab.checkpoint.table import Src, copy

__all__ = ["FAMILY"]


def _scaled(name: str, factor: float) -> Src:
    return Src((name,), lambda w: w * factor, f"times {factor:g}")


def _rows_scaled(name: str, factors: torch.Tensor, extra: float = 1.0) -> Src:
    def make(w: torch.Tensor) -> torch.Tensor:
        f = (factors * extra).to(device=w.device, dtype=torch.float64)
        return (w.double() * (f[:, None] if w.dim() == 2 else f)).to(w.dtype)

    return Src((name,), make, "rows times the muP vector")


def _multipliers(t: Fields, key: str, n: int) -> list[float]:
    vals = t.list(key, default=[1.0] * n)
    if len(vals) != n:
        raise t._err(key, f"must list {n} numbers, got {vals!r}")
    for j, v in enumerate(vals):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
            raise t._err(f"{key}[{j}]", f"must be a number > 0, got {v!r}")
    return [float(v) for v in vals]


def mamba(t: Fields, D: int, eps: float):
    from storelab.stores.mamba2 import Mamba2Config

    heads = t.int("mamba_n_heads", default=128, minimum=1)
    inner = t.int("mamba_d_ssm", default=None, minimum=1)
    inner = inner if inner is not None else t.int("mamba_expand", default=2, minimum=1) * D
    if t.raw("mamba_d_head", default="auto") == "auto":
        if inner % heads:
            raise t._err("mamba_n_heads", f"{heads} heads do not divide the mixer's {inner} channels")
        head_dim = inner // heads
    else:
        head_dim = t.int("mamba_d_head", minimum=1)
    if head_dim * heads != inner:
        raise t._err("mamba_d_head", f"{head_dim} x {heads} heads is not the mixer's {inner} channels "
                                     "(mamba_d_ssm, else mamba_expand x hidden_size)")
    bias = t.bool("mamba_proj_bias", default=False)
    if bias != t.bool("projectors_bias", default=False):
        raise t._err("projectors_bias", "must equal mamba_proj_bias (storelab's Mamba-2 mixer has biases on both "
                                        "in_proj and out_proj, or on neither)")
    return Mamba2Config(d_model=D, n_heads=heads, head_dim=head_dim,
                        d_state=t.int("mamba_d_state", default=256, minimum=1),
                        n_groups=t.int("mamba_n_groups", default=1, minimum=1),
                        conv_kernel=t.int("mamba_d_conv", default=4, minimum=1), norm_eps=eps,
                        use_conv_bias=t.bool("mamba_conv_bias", default=True), use_bias=bias,
                        dt_limit=time_step_limit(t), chunk_size=t.int("mamba_chunk_size", default=256, minimum=1),
                        norm="group" if t.bool("mamba_rms_norm", default=False) else "none",
                        norm_before_gate=t.bool("mamba_norm_before_gate", default=True))


def to_config(hf: dict):
    from storelab.models.config import LayerConfig
    from storelab.stores.attention import AttentionConfig
    from storelab.stores.depth import ResidualConfig
    from storelab.stores.ffn import FFNConfig

    t = text_fields(hf)
    D, n = t.int("hidden_size", default=4096, minimum=1), t.int("num_hidden_layers", default=32, minimum=1)
    eps = t.float("rms_norm_eps", default=1e-5, positive=True)
    act = t.str("hidden_act", default="silu")
    if act != "silu":
        raise t._err("hidden_act", f"{act!r} is not supported (Falcon-H1's MLPs and Mamba-2 mixers use SiLU)")
    for key in ("attention_in_multiplier", "attention_out_multiplier", "key_multiplier", "ssm_in_multiplier",
                "ssm_out_multiplier", "embedding_multiplier", "lm_head_multiplier"):
        t.float(key, default=1.0, positive=True)
    _multipliers(t, "ssm_multipliers", 5)
    _multipliers(t, "mlp_multipliers", 2)
    H = t.int("num_attention_heads", default=32, minimum=1)
    G = t.int("num_key_value_heads", default=8, minimum=1)
    if H % G:
        raise t._err("num_key_value_heads", f"{G} key/value heads do not divide {H} query heads")
    rp = rope_of(t, theta=10000.0)
    bias = t.bool("attention_bias", default=False)
    attention = AttentionConfig(d_model=D, n_heads=H, n_kv_heads=G, head_dim=t.int("head_dim", default=D // H,
                                                                                    minimum=1),
                                partial_rotary=rp.partial, rope_theta=rp.theta, qkv_bias=bias, out_bias=bias,
                                norm_eps=eps, rope_scaling=rp.scaling if rp.kind in RUNS_ROPE[1:] else None)
    mixer = mamba(t, D, eps)
    mlp = FFNConfig(d_model=D, d_ff=t.int("intermediate_size", default=14336, minimum=1),
                    bias=t.bool("mlp_bias", default=False))
    layers = [LayerConfig(token=attention, beside=mixer, channel=mlp, depth=ResidualConfig(d_model=D))
              for _ in range(n)]
    cfg = model_config(hf, t.d, name="falcon-h1", title="Falcon-H1 (checkpoint)", d_model=D, layers=layers,
                       norm_eps=eps, context=t.int("max_position_embeddings", default=8192))
    return dataclasses.replace(cfg, tie_embeddings=tied(hf, t, False),
                               vocab_size=t.int("vocab_size", default=128000, minimum=1),
                               embed_scale=t.float("embedding_multiplier", default=1.0, positive=True),
                               logit_scale=t.float("lm_head_multiplier", default=1.0, positive=True))


def mup_vector(t: Fields, m) -> torch.Tensor:
    """The five ``ssm_multipliers`` spread over ``in_proj``'s rows: z, x (d_inner each), B, C (G N each), dt (H)."""
    z, x, B, C, dt = _multipliers(t, "ssm_multipliers", 5)
    inner, gn = m.n_heads * m.head_dim, m.n_groups * m.d_state
    return torch.tensor([z] * inner + [x] * inner + [B] * gn + [C] * gn + [dt] * m.n_heads, dtype=torch.float64)


def table(hf: dict, cfg, names: set[str]) -> dict:
    t = text_fields(hf)
    f = {k: t.float(k, default=1.0, positive=True) for k in (
        "attention_in_multiplier", "attention_out_multiplier", "key_multiplier", "ssm_in_multiplier",
        "ssm_out_multiplier")}
    gate_m, down_m = _multipliers(t, "mlp_multipliers", 2)
    tab: dict = {"embed.weight": copy("model.embed_tokens.weight"), "norm.weight": copy("model.final_layernorm.weight")}
    if not cfg.tie_embeddings:
        tab["lm_head.weight"] = copy("lm_head.weight")
    for i, lay in enumerate(cfg.layers):
        a, b, tok, mix = f"model.layers.{i}", f"blocks.{i}", lay.token, lay.beside
        tab[f"{b}.norm_token.weight"] = copy(f"{a}.input_layernorm.weight")
        tab[f"{b}.norm_channel.weight"] = copy(f"{a}.pre_ff_layernorm.weight")
        s = f"{a}.self_attn"
        tab[f"{b}.token.q_proj.weight"] = _scaled(f"{s}.q_proj.weight", f["attention_in_multiplier"])
        tab[f"{b}.token.k_proj.weight"] = _scaled(f"{s}.k_proj.weight",
                                                  f["attention_in_multiplier"] * f["key_multiplier"])
        tab[f"{b}.token.v_proj.weight"] = _scaled(f"{s}.v_proj.weight", f["attention_in_multiplier"])
        tab[f"{b}.token.o_proj.weight"] = _scaled(f"{s}.o_proj.weight", f["attention_out_multiplier"])
        if tok.qkv_bias:
            tab[f"{b}.token.q_proj.bias"] = copy(f"{s}.q_proj.bias")
            tab[f"{b}.token.k_proj.bias"] = _scaled(f"{s}.k_proj.bias", f["key_multiplier"])
            tab[f"{b}.token.v_proj.bias"] = copy(f"{s}.v_proj.bias")
            tab[f"{b}.token.o_proj.bias"] = _scaled(f"{s}.o_proj.bias", f["attention_out_multiplier"])
        m = f"{a}.mamba"
        mixer_entries(tab, f"{b}.beside", m, mix)
        mup = mup_vector(t, mix)
        tab[f"{b}.beside.in_proj.weight"] = _rows_scaled(f"{m}.in_proj.weight", mup, f["ssm_in_multiplier"])
        tab[f"{b}.beside.out_proj.weight"] = _scaled(f"{m}.out_proj.weight", f["ssm_out_multiplier"])
        if mix.use_bias:
            tab[f"{b}.beside.in_proj.bias"] = _rows_scaled(f"{m}.in_proj.bias", mup)
            tab[f"{b}.beside.out_proj.bias"] = _scaled(f"{m}.out_proj.bias", f["ssm_out_multiplier"])
        c, ff = f"{b}.channel", f"{a}.feed_forward"
        tab[f"{c}.gate_proj.weight"] = _scaled(f"{ff}.gate_proj.weight", gate_m)
        tab[f"{c}.up_proj.weight"] = copy(f"{ff}.up_proj.weight")
        tab[f"{c}.down_proj.weight"] = _scaled(f"{ff}.down_proj.weight", down_m)
        if lay.channel.bias:
            tab[f"{c}.gate_proj.bias"] = _scaled(f"{ff}.gate_proj.bias", gate_m)
            tab[f"{c}.up_proj.bias"] = copy(f"{ff}.up_proj.bias")
            tab[f"{c}.down_proj.bias"] = _scaled(f"{ff}.down_proj.bias", down_m)
    return tab


def runs(hf: dict) -> None:
    t = text_fields(hf)
    rp = rope_of(t)
    if rp.kind not in RUNS_ROPE:
        key = "rope_scaling" if t.has("rope_scaling") else "rope_parameters"
        raise t._err(f"{key}.rope_type", f"{rp.kind!r}: storelab's attention does not compute this scaling "
                                         f"(accounting reads it; loading weights does not)")


FAMILY = Family(stores=("attention", "mamba2", "ffn", "residual"), name="falcon_h1", model_types=("falcon_h1",),
                to_config=to_config, table=table, ignored=lambda hf: (r"rotary_emb\.", r"mup_vector"), runs=runs)
