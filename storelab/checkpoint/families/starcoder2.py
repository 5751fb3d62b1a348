"""StarCoder2 (BigCode, arXiv 2402.19173; ``starcoder2``): a pre-norm GQA decoder with LayerNorms with biases and
an ungated MLP.

* norms: ``nn.LayerNorm`` with a bias (``norm_kind = "layer_bias"``), eps ``norm_epsilon`` (1e-5);
* attention: GQA with RoPE (rotated as halves), head size hidden / heads unless ``head_dim``; ``use_bias``
  (true by default) puts a bias on all four projections; with ``sliding_window`` set every layer reads that
  window (transformers' window counts the query itself: our ``window`` is one less), else full attention;
* MLP: ``c_proj(act(c_fc(x)))`` with biases under ``use_bias``, ``hidden_act`` ``gelu_pytorch_tanh`` (our ungated
  ``gelu_tanh``) by default;
* tied embeddings by default.

Parameters per layer: the attention's D*(H + 2G)*K + H*K*D (+ (H + 2G)*K + D biases), the MLP's 2*D*I (+ I + D),
two norms of 2*D; the state is the keys and values. Names: transformers' ``model.layers.i.self_attn.*``,
``.mlp.{c_fc, c_proj}``, ``input_layernorm`` / ``post_attention_layernorm`` / ``model.norm`` with ``.bias``.
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._common import base_entries, layer_prefix, linear, model_config
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Decl, _attention, layer_types, text_fields, tied
from storelab.checkpoint.table import copy

__all__ = ["FAMILY"]

ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu": "gelu", "relu": "relu"}  # ACT2FN name -> ffn's
DECL = Decl(name="starcoder2", model_types=("starcoder2",), title="StarCoder2 (checkpoint)", eps=1e-5, tied=True)


def to_config(hf: dict):
    from storelab.models.config import LayerConfig
    from storelab.stores.depth import ResidualConfig
    from storelab.stores.ffn import FFNConfig

    t = text_fields(hf)
    D, n = t.int("hidden_size", minimum=1), t.int("num_hidden_layers", minimum=1)
    eps = t.float("norm_epsilon", default=1e-5, positive=True)
    bias = t.bool("use_bias", default=True)
    act = t.str("hidden_act", default="gelu_pytorch_tanh")
    if act not in ACTIVATIONS:
        raise t._err("hidden_act", f"{act!r} is not supported (storelab's StarCoder2 MLP runs "
                                   f"{', '.join(ACTIVATIONS)})")
    decl = dataclasses.replace(DECL, qkv_bias=bias, o_bias=bias)
    mlp = FFNConfig(d_model=D, d_ff=t.int("intermediate_size", minimum=1), activation=ACTIVATIONS[act], bias=bias)
    layers = [LayerConfig(token=_attention(t, i, kind, decl, D, eps), channel=mlp, depth=ResidualConfig(d_model=D))
              for i, kind in enumerate(layer_types(t, n))]
    cfg = model_config(hf, t.d, name="starcoder2", title=DECL.title, d_model=D, layers=layers, norm_eps=eps,
                       context=t.int("max_position_embeddings", default=0))
    return dataclasses.replace(cfg, tie_embeddings=tied(hf, t, True), vocab_size=t.int("vocab_size", minimum=1),
                               norm_kind="layer_bias")


def table(hf: dict, cfg, names: set[str]) -> dict:
    pre, head = layer_prefix(names)
    tab: dict = {}
    base_entries(tab, cfg, prefix=pre, head=head)
    tab["norm.bias"] = copy(f"{pre}norm.bias")
    for i, lay in enumerate(cfg.layers):
        a, b = f"{pre}layers.{i}", f"blocks.{i}"
        tab[f"{b}.norm_token.bias"] = copy(f"{a}.input_layernorm.bias")
        tab[f"{b}.norm_channel.bias"] = copy(f"{a}.post_attention_layernorm.bias")
        _reader.attention_entries(tab, f"{b}.token", f"{a}.self_attn", lay.token)
        linear(tab, f"{b}.channel.up_proj", f"{a}.mlp.c_fc", bias=lay.channel.bias)
        linear(tab, f"{b}.channel.down_proj", f"{a}.mlp.c_proj", bias=lay.channel.bias)
    return tab


FAMILY = Family(stores=("attention", "window", "ffn", "residual"), name="starcoder2", model_types=DECL.model_types,
                to_config=to_config, table=table, ignored=lambda hf: DECL.ignored,
                runs=lambda hf: _reader.runs(DECL, hf))
