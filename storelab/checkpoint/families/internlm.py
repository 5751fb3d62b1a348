"""InternLM (Shanghai AI Laboratory; ``internlm``: InternLM-7B/20B) and InternLM2 / 2.5 (arXiv 2403.17297;
``internlm2``): Llama decoders of their remote code, read in transformers' vocabulary.

* ``internlm`` writes transformers' names (``self_attn.{q,k,v,o}_proj``, ``mlp.{gate,up,down}_proj``); ``bias``
  puts a bias on all four attention projections (InternLM-7B: true; InternLM-20B: false);
* ``internlm2`` packs q, k and v in one ``attention.wqkv`` laid out per key/value head: for each of the G
  groups, its H/G query heads, then its key head, then its value head (``rearrange(..., "(h gs d)", gs=2 + H/G)``
  of modeling_internlm2.py); ``bias`` puts a bias on ``wqkv`` and ``wo``; the MLP is ``feed_forward.w1`` (gate),
  ``w3`` (up), ``w2`` (down); the norms ``attention_norm``, ``ffn_norm``, ``model.norm``; the head ``output``;
* an early InternLM2 release says ``model_type`` "internlm" with ``architectures`` InternLM2ForCausalLM: read as
  ``internlm2``, as its modeling file is;
* RoPE on halves, ``rope_theta``; a ``rope_scaling`` of type "dynamic" (InternLM2.5's NTK scaling beyond
  ``max_position_embeddings``) is accounted and refused for loading, as for every family (``_reader.runs``).

Parameters per layer: the attention's D*(H + 2G)*K + H*K*D (+ (H + 2G)*K + D biases with ``bias``), the MLP's
3*D*I, two norms of D; the state is the keys and values.
"""

from __future__ import annotations

import torch

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Decl, Fields
from storelab.checkpoint.table import Src, copy

__all__ = ["FAMILY"]

DECL = Decl(name="internlm", model_types=("internlm", "internlm2"), title="InternLM / InternLM2 (checkpoint)",
            stores=("attention", "ffn", "residual"))


def _v2(hf: dict) -> bool:
    t = Fields(hf)
    return t.str("model_type") == "internlm2" or "InternLM2ForCausalLM" in t.list("architectures", default=[])


def as_llama(hf: dict) -> dict:
    """The config with ``bias`` said as transformers' ``attention_bias``."""
    return dict(hf, attention_bias=Fields(hf).bool("bias", default=False))


def to_config(hf: dict):
    import dataclasses

    cfg = _reader.to_config(DECL, as_llama(hf))
    return dataclasses.replace(cfg, name="internlm2" if _v2(hf) else "internlm")


def _wqkv(G: int, per: int, K: int, part: str):
    """Our q, k or v from InternLM2's ``wqkv`` (its rows, or its bias): group g holds rows
    [g*(per + 2)*K, (g + 1)*(per + 2)*K): ``per`` query heads, one key head, one value head."""
    def pick(w: torch.Tensor) -> torch.Tensor:
        w = w.reshape(G, per + 2, K, *w.shape[1:])
        got = {"q": w[:, :per], "k": w[:, per:per + 1], "v": w[:, per + 1:]}[part]
        return got.reshape(-1, *w.shape[3:])

    return pick


def table(hf: dict, cfg, names: set[str]) -> dict:
    if not _v2(hf):
        return _reader.table(DECL, as_llama(hf), cfg, names)
    tab = {"embed.weight": copy("model.tok_embeddings.weight"), "norm.weight": copy("model.norm.weight")}
    if not cfg.tie_embeddings:
        tab["lm_head.weight"] = copy("output.weight")
    for i, lay in enumerate(cfg.layers):
        a, b, tok = f"model.layers.{i}", f"blocks.{i}", lay.token
        G, K = tok.n_kv_heads, tok.head_dim
        per = tok.n_heads // G
        tab[f"{b}.norm_token.weight"] = copy(f"{a}.attention_norm.weight")
        tab[f"{b}.norm_channel.weight"] = copy(f"{a}.ffn_norm.weight")
        for p in ("q", "k", "v"):
            for kind in ("weight", "bias") if tok.qkv_bias else ("weight",):
                tab[f"{b}.token.{p}_proj.{kind}"] = Src((f"{a}.attention.wqkv.{kind}",), _wqkv(G, per, K, p),
                                                        f"wqkv's {p} rows of each of {G} groups")
        tab[f"{b}.token.o_proj.weight"] = copy(f"{a}.attention.wo.weight")
        if tok.out_bias:
            tab[f"{b}.token.o_proj.bias"] = copy(f"{a}.attention.wo.bias")
        for ours, theirs in (("gate_proj", "w1"), ("up_proj", "w3"), ("down_proj", "w2")):
            tab[f"{b}.channel.{ours}.weight"] = copy(f"{a}.feed_forward.{theirs}.weight")
    return tab


FAMILY = Family(stores=DECL.stores, name="internlm", model_types=DECL.model_types, to_config=to_config,
                table=table, ignored=lambda hf: DECL.ignored, runs=lambda hf: _reader.runs(DECL, as_llama(hf)),
                oracle="transformers 5.23's llama with attention_bias, saved under InternLM's names (internlm) or "
                       "repacked into InternLM2's wqkv (internlm2): logits (fp32, bf16), prefill-then-step, "
                       "parameters of its tiny model")
