"""MiniMax-Text-01 and MiniMax-M1 (MiniMax, arXiv 2501.08313 and 2506.13585; ``minimax``): lightning attention
(storelab's ``lightning``) in most layers, softmax GQA attention with RoPE in every eighth, a mixture of
experts on every layer. Read for accounting (``storelab models`` / ``memory --checkpoint``); loading
weights is refused, naming the field, because of the way the layers add their residuals (below).

Layers: ``layer_types`` ("linear_attention" / "full_attention"), else the published ``attn_type_list``
(0 lightning, 1 softmax), else transformers' default (softmax on even layers). A lightning layer l of L
decays with ALiBi's slopes times ``slope_scale`` = 1 - l / (L - 1 + 1e-5) + 1e-5 (``storelab.stores.
lightning``; its parameters 3 D H K + D H K + H K + H K D, its state H K x K matrices in fp32 whatever the
context). A softmax layer: ``num_attention_heads`` query and ``num_key_value_heads`` key/value heads of
``head_dim`` (default hidden / heads), RoPE on ``partial_rotary_factor`` of each head (``rotary_dim`` in
the published files), no biases. The experts: ``num_local_experts`` SwiGLU experts ``intermediate_size`` wide,
``num_experts_per_tok`` (2) chosen by a softmax router and renormalised (``block_sparse_moe``, Mixtral's).

The residuals (``MiniMaxDecoderLayer``): each sublayer adds its output to its *normed* input, scaled,

  h = alpha_a norm_1(x) + beta_a f(norm_1(x)),   x' = alpha_m norm_2(h) + beta_m moe(norm_2(h)),

with alpha and beta per sublayer kind (``layernorm_full_attention_alpha`` / ``_beta``,
``layernorm_linear_attention_alpha`` / ``_beta``, ``layernorm_mlp_alpha`` / ``_beta`` as published;
transformers' ``full_attn_alpha_factor`` and the rest; 1 by default). beta could be folded into the
output projections' weights, but the residual itself is the normed stream times alpha, not x: storelab's
layers compute x + f(norm(x)) (or the post, sandwich and parallel forms), and no transform of the weights
turns one into the other (the norms sit on the residual path). So ``runs`` refuses loading, naming the
alpha field. The accounting does not depend on it: norms, projections, experts and states are the same
tensors either way. transformers' lightning layers also keep decay tables as buffers (``slope_rate``,
``query_decay``, ``key_decay``, ``diagonal_decay``, functions of ``block_size`` and the slopes, saved
with the weights); they are no parameters and are not counted.
"""

from __future__ import annotations

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import FULL, Decl, Fields, _attention
from storelab.checkpoint.shards import CheckpointError

LINEAR = "linear_attention"
ALPHAS = (("layernorm_full_attention_alpha", "full_attn_alpha_factor"),
          ("layernorm_linear_attention_alpha", "linear_attn_alpha_factor"),
          ("layernorm_mlp_alpha", "mlp_alpha_factor"))
BETAS = (("layernorm_full_attention_beta", "full_attn_beta_factor"),
         ("layernorm_linear_attention_beta", "linear_attn_beta_factor"),
         ("layernorm_mlp_beta", "mlp_beta_factor"))


def minimax_types(t: Fields, n: int) -> list[str]:
    """``layer_types``; else ``attn_type_list`` (0 lightning, 1 softmax); else softmax on even layers."""
    if t.has("layer_types"):
        types = t.list("layer_types", n=n)
    elif t.has("attn_type_list"):
        kinds = t.list("attn_type_list", n=n)
        for i, x in enumerate(kinds):
            if x not in (0, 1) or isinstance(x, bool):
                raise t._err(f"attn_type_list[{i}]", f"must be 0 (lightning) or 1 (softmax), got {x!r}")
        types = [FULL if x == 1 else LINEAR for x in kinds]
    else:
        types = [FULL if i % 2 == 0 else LINEAR for i in range(n)]
    for i, x in enumerate(types):
        if x not in (LINEAR, FULL):
            raise t._err(f"layer_types[{i}]", f"{x!r} is not a MiniMax layer type ({LINEAR}, {FULL})")
    return types


def minimax_token(t: Fields, i: int, kind: str, decl: Decl, D: int, eps: float):
    from storelab.stores.lightning import LightningConfig

    if t.has("sliding_window"):
        raise t._err("sliding_window", f"{t.int('sliding_window')!r}: MiniMax's published attention has no window "
                                       "(transformers would window every softmax layer; not read)")
    if kind == FULL:
        return _attention(t, i, kind, decl, D, eps)
    H = t.int("num_attention_heads", minimum=1)
    L = t.int("num_hidden_layers", minimum=1)
    return LightningConfig(d_model=D, n_heads=H, head_dim=t.int("head_dim", default=D // H, minimum=1),
                           slope_scale=1 - i / (L - 1 + 1e-5) + 1e-5, norm_eps=eps)


DECL = Decl(name="minimax", model_types=("minimax",), title="MiniMax-Text-01 / M1 (checkpoint)", qkv_bias=False,
            o_bias=False, eps=1e-5, theta=1e6, types=minimax_types, token=minimax_token)


def runs(hf: dict) -> None:
    """Always refused: the residual of the normed stream (module docstring), named by its alpha field."""
    t = _reader.text_fields(hf)
    for names in ALPHAS + BETAS:  # malformed values are named first
        t.float(*names, default=1.0)
    key = next((k for names in ALPHAS for k in names if t.has(k)), ALPHAS[0][1])
    raise t._err(key, f"{t.float(key, default=1.0)!r}: MiniMax adds each sublayer's output to its normed input "
                      "(alpha norm(x) + beta f(norm(x))), storelab's layers to x itself; no weight transform "
                      "makes one the other (accounting reads it; loading weights does not)")


def table(hf: dict, cfg, names: set[str]) -> dict:
    runs(hf)                     # never returns: loading is refused before the table is asked for
    raise CheckpointError("unreachable")


FAMILY = Family(refused="its layers add each sublayer's output to the normed stream (alpha norm(x) + beta "
                        "f(norm(x))), storelab's to x itself: accounting only",
                oracle="transformers 5.23: parameters and cache bytes of its tiny model",
                stores=("lightning", "attention", "moe", "residual"), name=DECL.name, model_types=DECL.model_types, to_config=lambda hf: _reader.to_config(DECL, hf),
                table=table, ignored=lambda hf: DECL.ignored, runs=runs)
