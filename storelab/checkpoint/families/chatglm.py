"""ChatGLM2-6B, ChatGLM3-6B and GLM-4-9B's remote-code release (Zhipu AI / THUDM, arXiv 2406.12793; ``chatglm``):
the decoder transformers ports as ``glm``, written in Megatron's vocabulary and tensor names.

The file's fields, and what they mean to ``glm`` (``glm.py``):

* ``num_layers``, ``hidden_size``, ``num_attention_heads``, ``kv_channels`` (the head size), ``ffn_hidden_size``
  (the MLP width), ``padded_vocab_size`` (the embedding's rows), ``layernorm_epsilon``, ``seq_length`` (the context);
* ``multi_query_attention`` with ``multi_query_group_num``: that many key/value heads (GQA), else one per query head;
* ``add_qkv_bias``: biases on q, k, v; ``add_bias_linear`` (biases on the output and MLP projections), ``rmsnorm``
  false (LayerNorms), ``post_layer_norm`` false (no final norm), ``apply_residual_connection_post_layernorm``
  (the residual taken after the norm) and ``pre_seq_len`` (P-tuning prefixes) are no published release's and are
  refused by name;
* RoPE (``RotaryEmbedding(kv_channels // 2)`` of modeling_chatglm.py) on the first half of each head's channels,
  on interleaved pairs (2i, 2i + 1), base 10000 x ``rope_ratio`` (1 by default; glm-4-9b-chat: 500): ``glm``'s
  rotation exactly; ``apply_query_key_layer_scaling`` divides the scores by the layer number and multiplies them
  back before the softmax: the plain 1/sqrt(K).

The first ChatGLM-6B (``position_encoding_2d``: 2-D positions, GeLU, post-norm) is another network and is refused.

Parameters per layer: the attention's D*(H + 2G)*K + H*K*D + (H + 2G)*K biases, the MLP's 3*D*I, two norms of D;
the state is the keys and values, G*K each per token and layer.

Names (``a`` = ``transformer.encoder.layers.i``): ``transformer.embedding.word_embeddings``,
``a.self_attention.query_key_value`` (q's H*K rows, then k's G*K, then v's G*K: split here),
``a.self_attention.dense``, ``a.mlp.dense_h_to_4h`` (the gate's rows, then the up projection's),
``a.mlp.dense_4h_to_h``, ``a.input_layernorm``, ``a.post_attention_layernorm``,
``transformer.encoder.final_layernorm``, ``transformer.output_layer``.
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._common import linear
from storelab.checkpoint.families._family import Family, fixed
from storelab.checkpoint.families._reader import Fields
from storelab.checkpoint.families.glm import DECL as GLM
from storelab.checkpoint.table import copy, rows

__all__ = ["FAMILY"]

# flags whose published value every ChatGLM2/3 and GLM-4 release shares; another value is a network not read here
_FIXED = {"add_bias_linear": False, "rmsnorm": True, "post_layer_norm": True,
          "apply_residual_connection_post_layernorm": False}


def as_glm(hf: dict) -> dict:
    """The config in transformers' ``glm`` vocabulary, every field read (and refused) under its own name."""
    t = Fields(hf)
    if t.has("position_encoding_2d"):
        raise t._err("position_encoding_2d", "the first ChatGLM-6B (2-D positions, GeLU, post-norm) is not read")
    for key, want in _FIXED.items():
        if t.bool(key, default=want) != want:
            raise t._err(key, f"{str(not want).lower()} is not supported (every ChatGLM2/3 and GLM-4 release has "
                              f"{str(want).lower()})")
    if t.has("pre_seq_len"):
        raise t._err("pre_seq_len", "a P-tuning prefix encoder is not supported")
    D = t.int("hidden_size", minimum=1)
    H = t.int("num_attention_heads", minimum=1)
    G = t.int("multi_query_group_num", minimum=1) if t.bool("multi_query_attention", default=False) else H
    if H % G:
        raise t._err("multi_query_group_num", f"{G} does not divide num_attention_heads ({H})")
    K = t.int("kv_channels", default=D // H, minimum=2)
    if K < 2:
        raise t._err("num_attention_heads", f"{H} heads leave hidden_size {D} no head size (give kv_channels)")
    return {"model_type": "glm", "hidden_size": D, "num_hidden_layers": t.int("num_layers", minimum=1),
            "num_attention_heads": H, "num_key_value_heads": G, "head_dim": K,
            "intermediate_size": t.int("ffn_hidden_size", minimum=1),
            "vocab_size": t.int("padded_vocab_size", "vocab_size", minimum=1),
            "rms_norm_eps": t.float("layernorm_epsilon", default=1e-5, positive=True),
            "rope_theta": 10000.0 * t.float("rope_ratio", default=1.0, positive=True), "partial_rotary_factor": 0.5,
            "attention_bias": t.bool("add_qkv_bias", default=False),
            "max_position_embeddings": t.int("seq_length", default=0),
            "tie_word_embeddings": t.bool("tie_word_embeddings", default=False)}


def to_config(hf: dict):
    cfg = _reader.to_config(GLM, as_glm(hf))
    return dataclasses.replace(cfg, name="chatglm", title="ChatGLM2/3, GLM-4 remote code (checkpoint)")


def table(hf: dict, cfg, names: set[str]) -> dict:
    """Megatron's names; the fused q/k/v and gate/up rows split."""
    tab = {"embed.weight": copy("transformer.embedding.word_embeddings.weight"),
           "norm.weight": copy("transformer.encoder.final_layernorm.weight")}
    if not cfg.tie_embeddings:
        tab["lm_head.weight"] = copy("transformer.output_layer.weight")
    for i, lay in enumerate(cfg.layers):
        a, b, tok = f"transformer.encoder.layers.{i}", f"blocks.{i}", lay.token
        q, kv = tok.n_heads * tok.head_dim, tok.n_kv_heads * tok.head_dim
        tab[f"{b}.norm_token.weight"] = copy(f"{a}.input_layernorm.weight")
        tab[f"{b}.norm_channel.weight"] = copy(f"{a}.post_attention_layernorm.weight")
        fused = f"{a}.self_attention.query_key_value"
        for p, (lo, hi) in zip(("q_proj", "k_proj", "v_proj"), ((0, q), (q, q + kv), (q + kv, q + 2 * kv))):
            tab[f"{b}.token.{p}.weight"] = rows(f"{fused}.weight", lo, hi)
            if tok.qkv_bias:
                tab[f"{b}.token.{p}.bias"] = rows(f"{fused}.bias", lo, hi)
        linear(tab, f"{b}.token.o_proj", f"{a}.self_attention.dense")
        width = lay.channel.d_ff
        tab[f"{b}.channel.gate_proj.weight"] = rows(f"{a}.mlp.dense_h_to_4h.weight", 0, width)
        tab[f"{b}.channel.up_proj.weight"] = rows(f"{a}.mlp.dense_h_to_4h.weight", width, 2 * width)
        tab[f"{b}.channel.down_proj.weight"] = copy(f"{a}.mlp.dense_4h_to_h.weight")
    return tab


FAMILY = Family(stores=("attention", "ffn", "residual"), name="chatglm", model_types=("chatglm",),
                to_config=to_config, table=table, ignored=fixed(r"rotary_pos_emb\.inv_freq$"),
                runs=lambda hf: _reader.runs(GLM, as_glm(hf)),
                oracle="transformers 5.23's glm (GLM-4's port) written under modeling_chatglm.py's names and fields: "
                       "logits (fp32, bf16), prefill-then-step, cache bytes and parameters of its tiny model")
