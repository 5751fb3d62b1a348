"""Arcee (Arcee AI's AFM-4.5B; ``arcee``): a Llama decoder whose MLP is not gated: down(act(up(x))) with
``hidden_act`` ReLU^2 (max(0, h)^2, Primer, arXiv 2109.08668; plain ReLU and erf GELU read too), and
``mlp_bias`` on its two projections. The attention is the shared reader's (GQA, RoPE with the file's
scaling, ``attention_bias`` on all four projections).

Parameters per layer: the attention's D*(H + 2G)*K + H*K*D, the MLP's 2*D*I (+ I + D biases), two
d_model norms; the state is the keys and values.

Names: transformers' usual ones; the MLP's ``mlp.up_proj`` and ``mlp.down_proj`` (no ``gate_proj``).
"""

from __future__ import annotations

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._common import base_entries, layer_prefix, linear, model_config
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Decl, _attention, attention_entries, layer_types, text_fields, tied

__all__ = ["FAMILY"]

ACTIVATIONS = {"relu2": "relu2", "relu": "relu", "gelu": "gelu"}  # transformers' ACT2FN name -> ffn's
DECL = Decl(name="arcee", model_types=("arcee",), title="Arcee AFM (checkpoint)", eps=1e-5)


def to_config(hf: dict):
    import dataclasses

    from storelab.models.config import LayerConfig
    from storelab.stores.depth import ResidualConfig
    from storelab.stores.ffn import FFNConfig

    t = text_fields(hf)
    D = t.int("hidden_size", minimum=1)
    n = t.int("num_hidden_layers", minimum=1)
    eps = t.float("rms_norm_eps", default=DECL.eps, positive=True)
    act = t.str("hidden_act", default="relu2")
    if act not in ACTIVATIONS:
        raise t._err("hidden_act", f"{act!r} is not supported (storelab's arcee layers run {', '.join(ACTIVATIONS)})")
    mlp = FFNConfig(d_model=D, d_ff=t.int("intermediate_size", minimum=1), activation=ACTIVATIONS[act],
                    bias=t.bool("mlp_bias", default=False))
    layers = [LayerConfig(token=_attention(t, i, kind, DECL, D, eps), channel=mlp, depth=ResidualConfig(d_model=D))
              for i, kind in enumerate(layer_types(t, n))]
    cfg = model_config(hf, t.d, name="arcee", title=DECL.title, d_model=D, layers=layers, norm_eps=eps,
                       context=t.int("max_position_embeddings", default=0))
    return dataclasses.replace(cfg, tie_embeddings=tied(hf, t), vocab_size=t.int("vocab_size", minimum=1))


def table(hf: dict, cfg, names: set[str]) -> dict:
    pre, head = layer_prefix(names)
    tab: dict = {}
    base_entries(tab, cfg, prefix=pre, head=head)
    for i, lay in enumerate(cfg.layers):
        attention_entries(tab, f"blocks.{i}.token", f"{pre}layers.{i}.self_attn", lay.token)
        for p in ("up_proj", "down_proj"):
            linear(tab, f"blocks.{i}.channel.{p}", f"{pre}layers.{i}.mlp.{p}", bias=lay.channel.bias)
    return tab


FAMILY = Family(stores=("attention", "ffn", "residual"),
                name="arcee", model_types=DECL.model_types, to_config=to_config, table=table,
                ignored=lambda hf: DECL.ignored, runs=lambda hf: _reader.runs(DECL, hf))
