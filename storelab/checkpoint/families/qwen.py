"""Qwen (the first; Alibaba, arXiv 2309.16609; ``qwen``: Qwen-1.8B/7B/14B/72B): the remote-code decoder
transformers ports as ``qwen2`` without GQA, in GPT-2's tensor names and its own fields.

* ``hidden_size`` / ``n_embd``, ``num_attention_heads`` / ``n_head``, ``num_hidden_layers`` / ``n_layer`` (the
  first Qwen-7B release wrote the second names), ``kv_channels`` (the head size), ``layer_norm_epsilon``;
* ``intermediate_size`` (``ffn_hidden_size``) is twice the MLP's width: ``w1`` and ``w2`` are each
  ``intermediate_size // 2`` wide, and the MLP is c_proj(w1(x) * silu(w2(x))), so ``w2`` is the gate and ``w1``
  the up projection;
* one key/value head per query head; ``c_attn`` packs q, k, v (H*K rows each) and always has a bias; ``no_bias``
  (true in every release) leaves ``c_proj`` and the MLP without; ``no_bias`` false is refused by name;
* RoPE on halves over the first ``rotary_pct`` of each head, base ``rotary_emb_base``;
* ``use_dynamic_ntk`` and ``use_logn_attn`` change nothing within ``seq_length`` tokens (the NTK alpha is 1 and the
  log-n factor is 1 up to the training length, modeling_qwen.py): storelab runs plain RoPE, so its logits are
  the remote code's up to ``seq_length`` (the context read) and not beyond it;
* ``scale_attn_weights`` false (no 1/sqrt(K)) is refused by name.

Parameters per layer: D*3*H*K + 3*H*K (c_attn) + H*K*D (c_proj) + 3*D*I/2 (MLP) + 2*D (norms); the state is
the keys and values, H*K each per token and layer.

Names (``a`` = ``transformer.h.i``): ``transformer.wte``, ``a.ln_1``, ``a.attn.c_attn``, ``a.attn.c_proj``,
``a.ln_2``, ``a.mlp.w1`` (up), ``a.mlp.w2`` (gate), ``a.mlp.c_proj`` (down), ``transformer.ln_f``, ``lm_head``.
"""

from __future__ import annotations

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._family import Family, fixed
from storelab.checkpoint.families._reader import Decl, Fields
from storelab.checkpoint.table import copy, rows

__all__ = ["FAMILY"]

DECL = Decl(name="qwen", model_types=("qwen",), title="Qwen (remote code, checkpoint)", qkv_bias=True, o_bias=False,
            stores=("attention", "ffn", "residual"))


def as_qwen2(hf: dict) -> dict:
    """The config in transformers' ``qwen2`` vocabulary, every field read (and refused) under its own name."""
    t = Fields(hf)
    if t.bool("no_bias", default=True) is not True:
        raise t._err("no_bias", "false is not supported (biases on c_proj and the MLP: no release has them)")
    if t.bool("scale_attn_weights", default=True) is not True:
        raise t._err("scale_attn_weights", "false is not supported (attention without the 1/sqrt(head size))")
    D = t.int("hidden_size", "n_embd", minimum=1)
    H = t.int("num_attention_heads", "n_head", minimum=1)
    K = t.int("kv_channels", default=D // H, minimum=2)
    if K < 2:
        raise t._err("num_attention_heads", f"{H} heads leave hidden_size {D} no head size (give kv_channels)")
    key = t.key("intermediate_size", "ffn_hidden_size") or "intermediate_size"
    I2 = t.int(key, minimum=2)
    if I2 % 2:
        raise t._err(key, f"{I2} is odd: it is twice the MLP's width (w1, w2 are each half of it)")
    return {"model_type": "qwen2", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": H,
            "head_dim": K, "num_hidden_layers": t.int("num_hidden_layers", "n_layer", minimum=1),
            "intermediate_size": I2 // 2, "vocab_size": t.int("vocab_size", "padded_vocab_size", minimum=1),
            "rms_norm_eps": t.float("layer_norm_epsilon", default=1e-6, positive=True),
            "rope_theta": t.float("rotary_emb_base", default=10000.0, positive=True),
            "partial_rotary_factor": t.float("rotary_pct", default=1.0, minimum=0.0, maximum=1.0),
            "max_position_embeddings": t.int("seq_length", "max_position_embeddings", default=0),
            "tie_word_embeddings": t.bool("tie_word_embeddings", default=False)}


def to_config(hf: dict):
    return _reader.to_config(DECL, as_qwen2(hf))


def table(hf: dict, cfg, names: set[str]) -> dict:
    """GPT-2's names; c_attn's rows split in three, w2 the gate and w1 the up projection."""
    tab = {"embed.weight": copy("transformer.wte.weight"), "norm.weight": copy("transformer.ln_f.weight")}
    if not cfg.tie_embeddings:
        tab["lm_head.weight"] = copy("lm_head.weight")
    for i, lay in enumerate(cfg.layers):
        a, b, tok = f"transformer.h.{i}", f"blocks.{i}", lay.token
        q = tok.n_heads * tok.head_dim
        tab[f"{b}.norm_token.weight"] = copy(f"{a}.ln_1.weight")
        tab[f"{b}.norm_channel.weight"] = copy(f"{a}.ln_2.weight")
        for j, p in enumerate(("q_proj", "k_proj", "v_proj")):
            for kind in ("weight", "bias"):
                tab[f"{b}.token.{p}.{kind}"] = rows(f"{a}.attn.c_attn.{kind}", j * q, (j + 1) * q)
        tab[f"{b}.token.o_proj.weight"] = copy(f"{a}.attn.c_proj.weight")
        for ours, theirs in (("gate_proj", "w2"), ("up_proj", "w1"), ("down_proj", "c_proj")):
            tab[f"{b}.channel.{ours}.weight"] = copy(f"{a}.mlp.{theirs}.weight")
    return tab


FAMILY = Family(stores=DECL.stores, name="qwen", model_types=DECL.model_types, to_config=to_config, table=table,
                ignored=fixed(r"rotary_emb\.inv_freq$"), runs=lambda hf: _reader.runs(DECL, as_qwen2(hf)),
                oracle="transformers 5.23's qwen2 (no GQA) repacked into modeling_qwen.py's names and fields: "
                       "logits (fp32, bf16), prefill-then-step, parameters of its tiny model")
