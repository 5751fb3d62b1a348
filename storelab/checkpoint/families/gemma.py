"""Gemma 1 (arXiv 2403.08295; ``gemma``), Gemma 2 (arXiv 2408.00118; ``gemma2``) and Gemma 3 (arXiv
2503.19786; ``gemma3_text``, and the ``gemma3`` image-text wrapper whose text model sits under ``text_config``):
GQA attention (Gemma 2 and 3 alternating sliding-window (local) and full (global) layers), GeGLU-tanh
feed-forwards, and Gemma's own habits (Gemma 1 has the second and third only):

* sandwich norms (``LayerConfig.norms = "sandwich"``): x + norm2(f(norm1(x))) around both mixers;
* every RMSNorm stores w and applies (1 + w) (the table's ``plus_one``), the q/k norms included;
* the embedding times sqrt(hidden_size), rounded to fp32 and then to the activations' dtype as
  ``Gemma2TextScaledWordEmbedding`` does; tied embeddings;
* attention logits scaled by ``query_pre_attn_scalar`` ** -0.5, not head_dim ** -0.5;
* Gemma 1: pre-norms only (``input_layernorm`` before the attention, ``post_attention_layernorm`` before the
  MLP, the usual ``norms = "pre"``), full attention on every layer scaled by head_dim ** -0.5, no soft caps,
  no q/k norms; ``hidden_act`` "gelu" (the published files' legacy value) read as ``gelu_pytorch_tanh``, as
  ``GemmaConfig`` does; 16 heads and 16 KV heads of 256 by default (Gemma 7B; Gemma 2B says 8 and 1);
* VaultGemma (Google, 2025; ``vaultgemma``): Gemma 2 with pre-norms only (``input_layernorm`` before the
  attention, ``pre_feedforward_layernorm`` before the MLP; no norms after either);
* Gemma 2: ``attn_logit_softcapping`` c (each scaled score s read as c tanh(s / c): the attention
  store's ``softcap``) and ``final_logit_softcapping`` (the model's ``logit_softcap``); the layers
  alternate local and global, the first local (transformers' fixed pattern of 2);
* Gemma 3: per-head q/k RMSNorms; no attention soft cap whatever ``attn_logit_softcapping`` says (the
  published files say null; transformers 5.23's ``Gemma3Attention`` never passes it on); the image-text
  wrapper never soft-caps its logits either (``Gemma3ForConditionalGeneration`` reads no
  ``final_logit_softcapping``), the text model alone does when it is set; five local layers to one global (``sliding_window_pattern``, 6);
  the local layers rotate with ``rope_local_base_freq`` (10,000), the global ones with ``rope_theta``
  (1,000,000) and ``rope_scaling`` (Gemma 3 4B and up: linear, factor 8, ``storelab.ops.rope``; a
  scaling storelab does not compute is read for accounting and refused for running, naming the field).
  ``rope_parameters`` per layer type (transformers v5) say the same.

A field the file leaves out takes transformers' default (Google's Gemma 3 4B-27B ``text_config`` names only the
width, depth, rope scaling and window: 8 heads, 4 KV heads, head_dim 256 and 262,208 tokens come from
``Gemma3TextConfig``). A field given as null keeps transformers' meaning: ``attn_logit_softcapping: null`` is
no cap (Gemma 3's default), absent is the family's default (Gemma 2: 50 and 30). ``sliding_window`` counts the query
itself, so our ``window`` is one less (``WindowConfig``). The bidirectional variant
(``use_bidirectional_attention``, EmbeddingGemma) is not a causal LM and is refused naming the field.

Gemma 4 (``gemma4``, ``gemma4_text``) is read by ``gemma4.py``.

Names (transformers' ``Gemma2ForCausalLM`` / ``Gemma3ForCausalLM``; the wrapper's text model is saved under
``language_model.model.``, as Google's Gemma 3 files and transformers 5's ``save_pretrained`` write it, or
``model.language_model.``; ``a`` = ``model.layers.i``; norms ``(1 + w)``):

| ours                            | transformers                                 |
|---------------------------------|----------------------------------------------|
| blocks.i.norm_token             | a.input_layernorm                            |
| blocks.i.post_norm_token        | a.post_attention_layernorm                   |
| blocks.i.norm_channel           | a.pre_feedforward_layernorm                  |
| blocks.i.post_norm_channel      | a.post_feedforward_layernorm                 |
| blocks.i.token.{q,k,v,o}_proj   | a.self_attn.{q,k,v,o}_proj                   |
| blocks.i.token.q_norm / k_norm  | a.self_attn.q_norm / k_norm (Gemma 3)        |
| blocks.i.channel.{gate,up,down}_proj | a.mlp.{gate,up,down}_proj               |
| norm.weight                     | model.norm.weight                            |

The vision tower and projector of the wrapper (``vision_tower.``, ``multi_modal_projector.``, with or
without ``model.`` before them) are ignored when loading and are no part of the text model's count.
"""

from __future__ import annotations

import dataclasses
import json

import torch

from storelab.checkpoint.families._common import base_entries, gated_mlp, layer_prefix, linear, norm
from storelab.checkpoint.families._family import Family, fixed
from storelab.checkpoint.families._reader import FULL, SLIDING, Fields, scaling_numbers, text_fields, tied
from storelab.ops.rope import SCALINGS

GEMMA1, GEMMA2, GEMMA3 = ("gemma",), ("gemma2",), ("gemma3_text", "gemma3")
VAULT = ("vaultgemma",)  # Gemma 2 with pre-norms only
ACTIVATIONS = {"gelu_pytorch_tanh": "geglu_tanh"}
ACTIVATIONS_1 = {"gelu_pytorch_tanh": "geglu_tanh", "gelu": "geglu_tanh"}  # GemmaConfig turns "gelu" into the tanh
# what each generation assumes when its config says nothing (transformers' Gemma2Config / Gemma3TextConfig):
# Google's Gemma 3 4B-27B files give only a few text fields (no heads, no vocabulary) and rely on these
SHAPE = dict(hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
             num_key_value_heads=4, head_dim=256)
DEFAULTS = {
    "gemma1": dict(hidden_size=3072, intermediate_size=24576, num_hidden_layers=28, num_attention_heads=16,
                   num_key_value_heads=16, head_dim=256, vocab_size=256_000, max_position_embeddings=8192, pattern=0,
                   final_softcap=None, theta=10000.0, local_theta=None),
    "gemma2": dict(SHAPE, vocab_size=256_000, max_position_embeddings=8192, pattern=2, final_softcap=30.0,
                   theta=10000.0, local_theta=None),
    "gemma3": dict(SHAPE, vocab_size=262_208, max_position_embeddings=131_072, pattern=6, final_softcap=None,
                   theta=1_000_000.0, local_theta=10000.0),
}


def _generation(hf: dict) -> str:
    mt = Fields(hf).str("model_type")
    return "gemma1" if mt in GEMMA1 else "gemma2" if mt in GEMMA2 + VAULT else "gemma3"


def _nullable(t: Fields, key: str, default: float | None) -> float | None:
    """A float that may be null on purpose (no soft cap): absent -> ``default``, null -> None."""
    if key not in t.d:
        return default
    return None if t.d[key] is None else t.float(key, positive=True)


def gemma_types(t: Fields, n: int, pattern: int) -> list[str]:
    """``layer_types``; else every ``pattern``-th layer global, the rest local (Gemma 3's pattern is
    ``sliding_window_pattern``, Gemma 2's always 2)."""
    if t.has("layer_types"):
        types = t.list("layer_types", n=n)
    else:
        types = [FULL if (i + 1) % pattern == 0 else SLIDING for i in range(n)]
    for i, x in enumerate(types):
        if x not in (FULL, SLIDING):
            raise t._err(f"layer_types[{i}]", f"{x!r} is not a Gemma layer type ({FULL}, {SLIDING})")
    return types


def gemma_rope(t: Fields, kind: str, gen: str) -> tuple[float, dict | None, str]:
    """(theta, the scaling as published or None, the field that says its type) of a layer type:
    ``rope_parameters[kind]`` (v5), else ``rope_theta`` / ``rope_scaling`` for global layers and
    ``rope_local_base_freq`` for Gemma 3's local ones (whose rotation transformers never scales)."""
    d = DEFAULTS[gen]
    if t.has("rope_parameters"):
        rp = t.sub("rope_parameters")
        if isinstance(rp.d.get(kind), dict):
            rp = rp.sub(kind)
        theta = d["local_theta"] if kind == SLIDING and d["local_theta"] else d["theta"]
        return rp.float("rope_theta", default=theta, positive=True), _scaling(rp), rp.prefix + "rope_type"
    if kind == SLIDING and d["local_theta"] is not None:
        return t.float("rope_local_base_freq", default=d["local_theta"], positive=True), None, "rope_local_base_freq"
    sc = _scaling(t.sub("rope_scaling")) if t.has("rope_scaling") else None
    return t.float("rope_theta", default=d["theta"], positive=True), sc, "rope_scaling.rope_type"


def _scaling(rp: Fields) -> dict | None:
    """A published scaling's keys (rope_type first named ``type``), None for plain RoPE."""
    kind = rp.str("rope_type", "type", default="default")
    if kind == "default":
        return None
    scaling_numbers(rp)
    return {**{k: v for k, v in rp.d.items() if k not in ("rope_theta", "type")}, "rope_type": kind}


def gemma_attention(t: Fields, i: int, kind: str, gen: str, D: int, eps: float):
    from storelab.stores.attention import AttentionConfig, WindowConfig

    d = DEFAULTS[gen]
    H = t.int("num_attention_heads", default=d["num_attention_heads"], minimum=1)
    bias = t.bool("attention_bias", default=False)
    theta, scaling, _ = gemma_rope(t, kind, gen)
    if scaling is not None and scaling.get("original_max_position_embeddings") is None:  # as transformers
        scaling["original_max_position_embeddings"] = t.int("max_position_embeddings", default=None)
    common = dict(d_model=D, n_heads=H, n_kv_heads=t.int("num_key_value_heads", default=d["num_key_value_heads"],
                                                         minimum=1),
                  head_dim=t.int("head_dim", default=d["head_dim"], minimum=1), rope_theta=theta,
                  qk_norm=gen == "gemma3",
                  qkv_bias=bias, out_bias=bias, norm_eps=eps, rope_scaling=scaling if _runs(scaling) else None,
                  attn_scale=None if gen == "gemma1" else
                  t.float("query_pre_attn_scalar", default=256.0, positive=True) ** -0.5,
                  softcap=_nullable(t, "attn_logit_softcapping", 50.0) if gen == "gemma2" else None)
    if kind == FULL:
        return AttentionConfig(**common)
    return WindowConfig(window=t.int("sliding_window", default=4096, minimum=2) - 1, **common)


def to_config(hf: dict):
    from storelab.checkpoint.families._common import model_config
    from storelab.models.config import LayerConfig
    from storelab.stores.depth import ResidualConfig
    from storelab.stores.ffn import FFNConfig

    gen = _generation(hf)
    vault = Fields(hf).str("model_type") in VAULT
    t = text_fields(hf)
    if t.bool("use_bidirectional_attention", default=False):
        raise t._err("use_bidirectional_attention", "true is not supported (a bidirectional encoder, not a causal LM)")
    d = DEFAULTS[gen]
    D = t.int("hidden_size", default=d["hidden_size"], minimum=1)
    n = t.int("num_hidden_layers", default=d["num_hidden_layers"], minimum=1)
    V = t.int("vocab_size", default=d["vocab_size"], minimum=1)
    eps = t.float("rms_norm_eps", default=1e-6, positive=True)
    keys, acts = (("hidden_act",), ACTIVATIONS_1) if gen == "gemma1" else (("hidden_activation", "hidden_act"),
                                                                          ACTIVATIONS)
    act = t.str(*keys, default="gelu_pytorch_tanh")
    if act not in acts:
        key = t.key(*keys)
        raise t._err(key, f"{act!r} is not supported (storelab's Gemma MLP is GeGLU with tanh GELU, "
                          f"gelu_pytorch_tanh)")
    if gen == "gemma1":  # GemmaConfig has no windows: every layer full
        types = [FULL] * n
    else:
        pattern = d["pattern"] if gen == "gemma2" else t.int("sliding_window_pattern", default=6, minimum=1)
        types = gemma_types(t, n, pattern)
    channel = FFNConfig(d_model=D, d_ff=t.int("intermediate_size", default=d["intermediate_size"], minimum=1),
                        activation=acts[act])
    layers = [LayerConfig(token=gemma_attention(t, i, types[i], gen, D, eps), channel=channel,
                          depth=ResidualConfig(d_model=D), norms="pre" if gen == "gemma1" or vault else "sandwich")
              for i in range(n)]
    title = {"gemma1": "Gemma (checkpoint)", "gemma2": "Gemma 2 (checkpoint)", "gemma3": "Gemma 3 (checkpoint)"}[gen]
    title, name = ("VaultGemma (checkpoint)", "vaultgemma") if vault else (title, gen)
    cfg = model_config(hf, dict(t.d, vocab_size=V), name=name, title=title, d_model=D, layers=layers, norm_eps=eps,
                       context=t.int("max_position_embeddings", default=d["max_position_embeddings"]))
    # sqrt(D) as transformers holds it: a float32 tensor, cast to the activations' dtype at the call
    scale = float(torch.tensor(D ** 0.5, dtype=torch.float32))
    # the image-text wrapper (Gemma3ForConditionalGeneration) never caps its logits, whatever text_config says
    cap = None if Fields(hf).str("model_type") == "gemma3" else \
        _nullable(t, "final_logit_softcapping", DEFAULTS[gen]["final_softcap"])
    return dataclasses.replace(cfg, tie_embeddings=tied(hf, t, default=True), vocab_size=V, embed_scale=scale,
                               logit_softcap=cap)


def _runs(scaling: dict | None) -> bool:
    return scaling is None or scaling["rope_type"] in SCALINGS


def runs(hf: dict) -> None:
    """Loading needs a rope scaling storelab computes (Gemma 3 4B and up scale the global layers' linearly)."""
    gen = _generation(hf)
    t = text_fields(hf)
    for kind in (SLIDING, FULL):
        _, scaling, key = gemma_rope(t, kind, gen)
        if not _runs(scaling):
            raise t._err(key, f"{scaling['rope_type']!r}: storelab's attention runs plain RoPE and "
                              f"{', '.join(SCALINGS)} (accounting reads it; loading weights does not)")


def _sandwich_entries(tab: dict, a: str, b: str) -> None:
    """Gemma 2 / 3's norms after each mixer and before the MLP (Gemma 1's two pre-norms are ``base_entries``')."""
    tab[f"{b}.post_norm_token.weight"] = norm(f"{a}.post_attention_layernorm.weight", True)
    tab[f"{b}.norm_channel.weight"] = norm(f"{a}.pre_feedforward_layernorm.weight", True)
    tab[f"{b}.post_norm_channel.weight"] = norm(f"{a}.post_feedforward_layernorm.weight", True)


def table(hf: dict, cfg, names: set[str]) -> dict:
    pre, head = layer_prefix(names, extra=(("language_model.model.", "language_model.lm_head.weight"),))
    tab: dict = {}
    base_entries(tab, cfg, prefix=pre, head=head, offset=True)
    for i, lay in enumerate(cfg.layers):
        a, b, tok = f"{pre}layers.{i}", f"blocks.{i}", lay.token
        if lay.norms == "sandwich":
            _sandwich_entries(tab, a, b)
        elif Fields(hf).str("model_type") in VAULT:  # VaultGemma's second pre-norm keeps Gemma 2's name
            tab[f"{b}.norm_channel.weight"] = norm(f"{a}.pre_feedforward_layernorm.weight", True)
        for p in ("q_proj", "k_proj", "v_proj"):
            linear(tab, f"{b}.token.{p}", f"{a}.self_attn.{p}", bias=tok.qkv_bias)
        linear(tab, f"{b}.token.o_proj", f"{a}.self_attn.o_proj", bias=tok.out_bias)
        if tok.qk_norm:
            tab[f"{b}.token.q_norm.weight"] = norm(f"{a}.self_attn.q_norm.weight", True)
            tab[f"{b}.token.k_norm.weight"] = norm(f"{a}.self_attn.k_norm.weight", True)
        c = f"{b}.channel"
        gated_mlp(tab, (f"{c}.gate_proj", f"{c}.up_proj", f"{c}.down_proj"), f"{a}.mlp", names, lay.channel.d_ff)
    return tab


FAMILY = Family(stores=("attention", "window", "ffn", "residual"),
                name="gemma", model_types=GEMMA1 + GEMMA2 + VAULT + GEMMA3, to_config=to_config, table=table,
                ignored=fixed(r"rotary_emb\.", r"^(model\.)?vision_tower\.", r"^(model\.)?multi_modal_projector\."),
                runs=runs)
