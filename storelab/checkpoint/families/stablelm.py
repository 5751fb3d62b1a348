"""StableLM (Stability AI; ``stablelm``: StableLM-3B-4E1T, StableLM 2 1.6B / 12B, StableCode): a Llama-like decoder
with LayerNorms with biases.

* norms: ``nn.LayerNorm`` with a bias (``norm_kind = "layer_bias"``), eps ``layer_norm_eps`` (1e-5);
* block: pre-norm, two norms per layer; with ``use_parallel_residual`` (StableLM 2 12B) one norm read by the
  attention and the MLP in parallel, x + attn(n(x)) + mlp(n(x)) (our ``norms = "parallel"``);
* attention: GQA, head size hidden / heads, RoPE on the first ``partial_rotary_factor`` (0.25 by default) of
  each head, rotated as halves; ``use_qkv_bias`` on q/k/v, never on the output;
* MLP: SwiGLU without biases; untied embeddings by default.

``qk_layernorm`` (StableLM 2 12B: a LayerNorm without bias over each query and key head, with one weight per
head, ``StableLmLayerNormPerHead``) has no norm of that shape in storelab's attention and is refused, naming the
field.

Parameters per layer: the attention's D*(H + 2G)*K + H*K*D (+ (H + 2G)*K biases), the MLP's 3*D*I, two norms
of 2*D (one in a parallel block); the state is the keys and values. Names: transformers' usual ones, each
LayerNorm with its ``.bias``.
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._common import layer_prefix
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Decl, Fields, _attention, text_fields
from storelab.checkpoint.table import copy

__all__ = ["FAMILY"]


def stablelm_attention(t: Fields, i: int, kind: str, decl: Decl, D: int, eps: float):
    if t.bool("qk_layernorm", default=False):
        raise t._err("qk_layernorm", "true is not supported (a LayerNorm over each query/key head with a weight "
                                     "per head and channel: storelab's attention has no such norm yet)")
    a = _attention(t, i, kind, decl, D, eps)
    bias = t.bool("use_qkv_bias", default=False)
    return dataclasses.replace(a, head_dim=D // a.n_heads, qkv_bias=bias, out_bias=False)


DECL = Decl(name="stablelm", model_types=("stablelm",), title="StableLM (checkpoint)", eps=1e-5, partial=0.25,
            token=stablelm_attention, types=lambda t, n: [_reader.FULL] * n)


def _parallel(hf: dict) -> bool:
    return text_fields(hf).bool("use_parallel_residual", default=False)


def to_config(hf: dict):
    cfg = _reader.to_config(DECL, hf)
    layers = [dataclasses.replace(lay, norms="parallel") for lay in cfg.layers] if _parallel(hf) else cfg.layers
    return dataclasses.replace(cfg, layers=layers, norm_kind="layer_bias")


def table(hf: dict, cfg, names: set[str]) -> dict:
    """The reader's names and each LayerNorm's bias; a parallel block has no ``post_attention_layernorm``."""
    tab = _reader.table(DECL, hf, cfg, names)
    pre = layer_prefix(names)[0]
    tab["norm.bias"] = copy(f"{pre}norm.bias")
    for i, lay in enumerate(cfg.layers):
        a, b = f"{pre}layers.{i}", f"blocks.{i}"
        tab[f"{b}.norm_token.bias"] = copy(f"{a}.input_layernorm.bias")
        if lay.norms == "parallel":
            del tab[f"{b}.norm_channel.weight"]
        else:
            tab[f"{b}.norm_channel.bias"] = copy(f"{a}.post_attention_layernorm.bias")
    return tab


FAMILY = Family(stores=("attention", "ffn", "residual"), name="stablelm", model_types=DECL.model_types,
                to_config=to_config, table=table, ignored=lambda hf: DECL.ignored,
                runs=lambda hf: _reader.runs(DECL, hf))
