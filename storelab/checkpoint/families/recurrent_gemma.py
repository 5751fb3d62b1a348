"""RecurrentGemma (Griffin, De et al., arXiv 2402.19427; ``recurrent_gemma``): residual blocks whose token
mixer is, in a repeating pattern, an RG-LRU recurrent block (storelab's ``rglru``) or local multi-query
attention, each followed by a GeGLU MLP:

* ``block_types`` (published also as ``_block_types``; default recurrent, recurrent, attention) repeats over
  ``num_hidden_layers`` (transformers' ``layers_block_type``): RecurrentGemma 2B's 26 layers are 18
  recurrent and 8 attention;
* the recurrent block: ``lru_width`` channels (default ``hidden_size``), the gates block-diagonal in
  ``num_attention_heads`` blocks, a ``conv1d_width``-tap causal convolution (``storelab.stores.rglru``
  maps its tensors to ``RecurrentGemmaRecurrentBlock``'s names);
* the attention: a window of ``attention_window_size`` positions counting the query (our ``window`` is one
  less), ``num_key_value_heads`` (1: MQA), head_dim = hidden_size // num_attention_heads (transformers
  computes it so, whatever ``head_dim`` the file gives), RoPE on the first ``partial_rotary_factor``
  (0.5) of each head, no q/k/v biases unless ``attention_bias``, an output bias always;
* the MLP: width ``intermediate_size`` // 2 (transformers halves it), biases on all three projections,
  gelu_pytorch_tanh on the gate;
* pre-norm RMSNorms storing w with (1 + w) applied; the embedding times sqrt(hidden_size) rounded to
  bfloat16 first (transformers' ``normalizer`` buffer: sqrt(2560) = 50.596 is applied as 50.5), then to
  the activations' dtype; tied embeddings; ``logits_soft_cap`` (30) on the logits.

``w_init_variance_scale`` and ``final_w_init_variance_scale`` only say how weights start; nothing reads them.

Names (transformers' ``RecurrentGemmaForCausalLM``; ``a`` = ``model.layers.i``; norms ``(1 + w)``):

| ours                              | transformers                                   |
|-----------------------------------|------------------------------------------------|
| blocks.i.norm_token / norm_channel | a.temporal_pre_norm / a.channel_pre_norm      |
| blocks.i.token.*  (rglru)         | a.temporal_block.{linear_y, linear_x, conv_1d, rg_lru.*, linear_out} |
| blocks.i.token.{q,k,v,o}_proj     | a.temporal_block.{q,k,v,o}_proj (o with bias)  |
| blocks.i.channel.{gate,up,down}_proj | a.mlp_block.{gate,up,down}_proj (weights, biases) |
| norm.weight                       | model.final_norm.weight                        |
"""

from __future__ import annotations

import dataclasses

import torch

from storelab.checkpoint.families._common import linear, norm
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Fields, rope_of, text_fields, tied
from storelab.checkpoint.table import Src, copy

RECURRENT, ATTENTION = "recurrent", "attention"
BLOCK_TYPES = (RECURRENT, RECURRENT, ATTENTION)  # transformers' RecurrentGemmaConfig default
ACTIVATION = "gelu_pytorch_tanh"
# transformers' RecurrentGemmaConfig defaults (RecurrentGemma 2B's shape), for a file that leaves a field out
DEFAULTS = dict(hidden_size=2560, num_hidden_layers=26, num_attention_heads=10, intermediate_size=3 * 2560,
                vocab_size=256_000)
RGLRU_NAMES = {"y_proj": "linear_y", "x_proj": "linear_x", "out_proj": "linear_out"}
RGLRU_PARAMS = ("input_gate_weight", "input_gate_bias", "recurrent_gate_weight", "recurrent_gate_bias",
                "recurrent_param")


def block_types(t: Fields, n: int) -> list[str]:
    """One of "recurrent" / "attention" per layer: ``block_types`` (or ``_block_types``) repeated over n."""
    key = t.key("block_types", "_block_types")
    pattern = t.list(key) if key else list(BLOCK_TYPES)
    if not pattern:
        raise t._err(key, "must name at least one block type")
    for j, x in enumerate(pattern):
        if x not in (RECURRENT, ATTENTION):
            raise t._err(f"{key}[{j}]", f"{x!r} is not a RecurrentGemma block type ({RECURRENT}, {ATTENTION})")
    return [pattern[i % len(pattern)] for i in range(n)]


def rg_token(t: Fields, kind: str, D: int, eps: float):
    from storelab.stores.attention import WindowConfig
    from storelab.stores.rglru import RGLRUConfig

    H = t.int("num_attention_heads", default=DEFAULTS["num_attention_heads"], minimum=1)
    if kind == RECURRENT:
        return RGLRUConfig(d_model=D, lru_width=t.int("lru_width", default=D, minimum=1), n_heads=H,
                           conv_kernel=t.int("conv1d_width", default=4, minimum=1))
    rp = rope_of(t, partial=0.5)
    return WindowConfig(d_model=D, n_heads=H, n_kv_heads=t.int("num_key_value_heads", default=H, minimum=1),
                        head_dim=D // H, partial_rotary=rp.partial, rope_theta=rp.theta,
                        qkv_bias=t.bool("attention_bias", default=False), out_bias=True, norm_eps=eps,
                        window=t.int("attention_window_size", "sliding_window", default=2048, minimum=2) - 1)


def to_config(hf: dict):
    from storelab.checkpoint.families._common import model_config
    from storelab.models.config import LayerConfig
    from storelab.stores.depth import ResidualConfig
    from storelab.stores.ffn import FFNConfig

    t = text_fields(hf)
    D = t.int("hidden_size", default=DEFAULTS["hidden_size"], minimum=1)
    n = t.int("num_hidden_layers", default=DEFAULTS["num_hidden_layers"], minimum=1)
    V = t.int("vocab_size", default=DEFAULTS["vocab_size"], minimum=1)
    eps = t.float("rms_norm_eps", default=1e-6, positive=True)
    act = t.str("hidden_activation", default=ACTIVATION)
    if act != ACTIVATION:
        raise t._err("hidden_activation", f"{act!r} is not supported (storelab's RG-LRU gate branch and GeGLU MLP "
                                          f"are {ACTIVATION})")
    width = t.int("intermediate_size", default=DEFAULTS["intermediate_size"], minimum=2) // 2
    channel = FFNConfig(d_model=D, d_ff=width, activation="geglu_tanh", bias=True)
    layers = [LayerConfig(token=rg_token(t, kind, D, eps), channel=channel, depth=ResidualConfig(d_model=D))
              for kind in block_types(t, n)]
    cfg = model_config(hf, dict(t.d, vocab_size=V), name="recurrent-gemma", title="RecurrentGemma (checkpoint)",
                       d_model=D, layers=layers, norm_eps=eps, context=0)
    # transformers' normalizer: sqrt(D) held in bfloat16, cast to the activations' dtype at the call
    scale = float(torch.tensor(D ** 0.5, dtype=torch.bfloat16))
    return dataclasses.replace(cfg, tie_embeddings=tied(hf, t, default=True), vocab_size=V, embed_scale=scale,
                               logit_softcap=t.float("logits_soft_cap", default=30.0, positive=True))


def runs(hf: dict) -> None:
    """Loading needs plain RoPE (as transformers' RecurrentGemma) and the scaled embedding it always applies."""
    t = text_fields(hf)
    kind = rope_of(t, partial=0.5).kind
    if kind != "default":
        key = "rope_scaling" if t.has("rope_scaling") else "rope_parameters"
        raise t._err(f"{key}.rope_type", f"{kind!r}: RecurrentGemma runs plain RoPE only (accounting reads it)")
    if not t.bool("embeddings_scale_by_sqrt_dim", default=True):
        raise t._err("embeddings_scale_by_sqrt_dim", "false is not supported (transformers' RecurrentGemma always "
                                                     "scales the embedding by sqrt(hidden_size))")


def table(hf: dict, cfg, names: set[str]) -> dict:
    tab: dict = {"embed.weight": copy("model.embed_tokens.weight"),
                 "norm.weight": norm("model.final_norm.weight", True)}
    if not cfg.tie_embeddings:
        tab["lm_head.weight"] = copy("lm_head.weight")
    for i, lay in enumerate(cfg.layers):
        a, b, tok = f"model.layers.{i}", f"blocks.{i}", lay.token
        tab[f"{b}.norm_token.weight"] = norm(f"{a}.temporal_pre_norm.weight", True)
        tab[f"{b}.norm_channel.weight"] = norm(f"{a}.channel_pre_norm.weight", True)
        o, m = f"{b}.token", f"{a}.temporal_block"
        if tok.KIND == "rglru":
            for ours, theirs in RGLRU_NAMES.items():
                linear(tab, f"{o}.{ours}", f"{m}.{theirs}", bias=True)
            tab[f"{o}.conv_weight"] = Src((f"{m}.conv_1d.weight",), lambda w: w.squeeze(1), "[C, 1, W] -> [C, W]")
            tab[f"{o}.conv_bias"] = copy(f"{m}.conv_1d.bias")
            for p in RGLRU_PARAMS:
                tab[f"{o}.{p}"] = copy(f"{m}.rg_lru.{p}")
        else:
            for p in ("q_proj", "k_proj", "v_proj"):
                linear(tab, f"{o}.{p}", f"{m}.{p}", bias=tok.qkv_bias)
            linear(tab, f"{o}.o_proj", f"{m}.o_proj", bias=True)
        for p in ("gate_proj", "up_proj", "down_proj"):
            linear(tab, f"{b}.channel.{p}", f"{a}.mlp_block.{p}", bias=True)
    return tab


def ignored(hf: dict) -> tuple[str, ...]:
    """Rotary buffers, and a stored copy of the tied head (the 9B's 19.25 GB of bf16 shards hold 8.58B weights
    plus ``lm_head.weight``; transformers ties it to the embedding)."""
    t = text_fields(hf)
    return (r"rotary_emb\.", r"\.normalizer$") + ((r"^lm_head\.weight$",) if tied(hf, t, default=True) else ())


FAMILY = Family(stores=("rglru", "window", "ffn", "residual"),
                name="recurrent_gemma", model_types=("recurrent_gemma",), to_config=to_config, table=table,
                ignored=ignored, runs=runs)
