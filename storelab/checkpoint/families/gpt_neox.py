"""GPT-NeoX and Pythia (EleutherAI, arXiv 2204.06745, arXiv 2304.01373; ``gpt_neox``): a decoder whose attention
and MLP read the same stream through two LayerNorms with biases, in parallel, x + attn(n1(x)) + mlp(n2(x))
(``use_parallel_residual``, our ``norms = "parallel_two"``; false: the usual pre-norm block), and
``norm_kind = "layer_bias"`` everywhere (eps ``layer_norm_eps``).

* attention: multi-head (no GQA), RoPE on the first ``partial_rotary_factor`` of each head (``rotary_pct`` in
  v4 files, 0.25 by default; base ``rotary_emb_base`` / ``rope_theta``), rotated as halves; ``attention_bias``
  (true by default) on the fused ``query_key_value`` and the output ``dense``;
* ``query_key_value`` holds, per head, that head's query, key and value rows ([H, 3, K] by rows): the table
  takes every third block of K rows for each of our q/k/v projections;
* the MLP is not gated: ``dense_4h_to_h(gelu(dense_h_to_4h(x)))`` with biases (erf GELU, ``hidden_act`` "gelu");
* untied ``embed_out`` by default.

Parameters per layer: 4*D*D + 4*D (attention), 2*D*I + I + D (MLP), two norms of 2*D; the state is the keys and
values. Names: ``gpt_neox.embed_in``, ``gpt_neox.layers.i.{input_layernorm, post_attention_layernorm}``,
``.attention.{query_key_value, dense}``, ``.mlp.{dense_h_to_4h, dense_4h_to_h}``, ``gpt_neox.final_layer_norm``,
``embed_out``.
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families._common import linear, model_config
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import RUNS_ROPE, Fields, rope_of, text_fields, tied
from storelab.checkpoint.table import Src, copy

__all__ = ["FAMILY"]

ACTIVATIONS = {"gelu": "gelu", "relu": "relu"}


def _partial(t: Fields) -> float:
    return t.float("rotary_pct", default=rope_of(t, partial=0.25).partial)


def to_config(hf: dict):
    from storelab.models.config import LayerConfig
    from storelab.stores.attention import AttentionConfig
    from storelab.stores.depth import ResidualConfig
    from storelab.stores.ffn import FFNConfig

    t = text_fields(hf)
    D, n = t.int("hidden_size", minimum=1), t.int("num_hidden_layers", minimum=1)
    H = t.int("num_attention_heads", minimum=1)
    eps = t.float("layer_norm_eps", default=1e-5, positive=True)
    act = t.str("hidden_act", default="gelu")
    if act not in ACTIVATIONS:
        raise t._err("hidden_act", f"{act!r} is not supported (storelab's GPT-NeoX MLP runs {', '.join(ACTIVATIONS)})")
    bias = t.bool("attention_bias", default=True)
    rp = rope_of(t, partial=0.25, theta=t.float("rotary_emb_base", default=10000.0))
    attention = AttentionConfig(d_model=D, n_heads=H, n_kv_heads=H, head_dim=D // H, partial_rotary=_partial(t),
                                rope_theta=rp.theta, qkv_bias=bias, out_bias=bias, norm_eps=eps,
                                rope_scaling=rp.scaling if rp.kind in RUNS_ROPE[1:] else None)
    mlp = FFNConfig(d_model=D, d_ff=t.int("intermediate_size", minimum=1), activation=ACTIVATIONS[act], bias=True)
    norms = "parallel_two" if t.bool("use_parallel_residual", default=True) else "pre"
    layers = [LayerConfig(token=attention, channel=mlp, depth=ResidualConfig(d_model=D), norms=norms)
              for _ in range(n)]
    cfg = model_config(hf, t.d, name="gpt-neox", title="GPT-NeoX (checkpoint)", d_model=D, layers=layers,
                       norm_eps=eps, context=t.int("max_position_embeddings", default=0))
    return dataclasses.replace(cfg, tie_embeddings=tied(hf, t), vocab_size=t.int("vocab_size", minimum=1),
                               norm_kind="layer_bias")


def _norm(tab: dict, ours: str, theirs: str) -> None:
    tab[f"{ours}.weight"], tab[f"{ours}.bias"] = copy(f"{theirs}.weight"), copy(f"{theirs}.bias")


def _third(name: str, j: int, H: int, what: str) -> Src:
    """Rows of head h's j-th block (q 0, k 1, v 2) of a per-head [H, 3, K] fused projection."""
    return Src((name,), lambda w: w.reshape(H, 3, -1, *w.shape[1:])[:, j].reshape(-1, *w.shape[1:]),
               f"{what} rows of each head's [q; k; v] block")


def table(hf: dict, cfg, names: set[str]) -> dict:
    g = "gpt_neox"
    tab: dict = {"embed.weight": copy(f"{g}.embed_in.weight")}
    _norm(tab, "norm", f"{g}.final_layer_norm")
    if not cfg.tie_embeddings:
        tab["lm_head.weight"] = copy("embed_out.weight")
    for i, lay in enumerate(cfg.layers):
        a, b, tok = f"{g}.layers.{i}", f"blocks.{i}", lay.token
        _norm(tab, f"{b}.norm_token", f"{a}.input_layernorm")
        _norm(tab, f"{b}.norm_channel", f"{a}.post_attention_layernorm")
        qkv = f"{a}.attention.query_key_value"
        for j, p in enumerate(("q_proj", "k_proj", "v_proj")):
            tab[f"{b}.token.{p}.weight"] = _third(f"{qkv}.weight", j, tok.n_heads, p[0])
            if tok.qkv_bias:
                tab[f"{b}.token.{p}.bias"] = _third(f"{qkv}.bias", j, tok.n_heads, p[0])
        linear(tab, f"{b}.token.o_proj", f"{a}.attention.dense", bias=tok.out_bias)
        linear(tab, f"{b}.channel.up_proj", f"{a}.mlp.dense_h_to_4h", bias=True)
        linear(tab, f"{b}.channel.down_proj", f"{a}.mlp.dense_4h_to_h", bias=True)
    return tab


def runs(hf: dict) -> None:
    t = text_fields(hf)
    rp = rope_of(t)
    if rp.kind not in RUNS_ROPE:
        raise t._err("rope_parameters.rope_type", f"{rp.kind!r}: storelab's attention runs {', '.join(RUNS_ROPE)} only")


FAMILY = Family(stores=("attention", "ffn", "residual"), name="gpt_neox", model_types=("gpt_neox",),
                to_config=to_config, table=table, ignored=lambda hf: (r"rotary_emb\.", r"\.attention\.bias$",
                                                                       r"\.attention\.masked_bias$"), runs=runs)
