"""Aria's text model (Rhymes AI, arXiv 2410.05993; ``aria_text``): a Llama decoder whose every MLP is a mixture of
experts beside shared experts (transformers 5.23's ``AriaTextForCausalLM``).

* attention: Llama's GQA with RoPE, biases with ``attention_bias``;
* channel, every layer: ``moe_num_experts`` (8) SwiGLU experts of ``intermediate_size``; the router takes the top
  ``moe_topk`` (2) logits and softmaxes them among themselves (our softmax top-k, renormalised: the same
  weights); ``moe_num_shared_experts`` (2) shared experts fused into one SwiGLU of width
  ``moe_num_shared_experts * intermediate_size``, added unweighted;
* pre-norm RMSNorms, untied embeddings by default.
``mlp_bias`` (biases on the shared experts) has no place in storelab's shared experts and is refused by name.

Parameters per layer: the attention's D*(H + 2G)*K + H*K*D, the experts' 3*E*D*I + E*D and the shared 3*D*S*I,
two d_model norms; the state is the keys and values. Names: ``mlp.router.weight``, the experts as Aria stores them,
``mlp.experts.fc1.weight`` [E, D, 2I] and ``fc2.weight`` [E, I, D] (input rows first: transposed into ours; or
transformers' in-memory ``gate_up_proj`` / ``down_proj``, the same layout), ``mlp.shared_experts.*``.
"""

from __future__ import annotations

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._common import either, layer_prefix
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Decl, text_fields
from storelab.checkpoint.table import Src, copy

__all__ = ["FAMILY"]


def _transposed(name: str) -> Src:
    return Src((name,), lambda w: w.transpose(1, 2).contiguous(), "[E, in, out] transposed to [E, out, in]")


def _experts(tab: dict, hf: dict, cfg, names: set[str]) -> None:
    pre = layer_prefix(names)[0]
    for i in range(cfg.n_layers):
        m, c = f"{pre}layers.{i}.mlp", f"blocks.{i}.channel"
        tab[f"{c}.router.weight"] = copy(f"{m}.router.weight")
        tab[f"{c}.gate_up"] = _transposed(either(names, f"{m}.experts.fc1.weight", f"{m}.experts.gate_up_proj"))
        tab[f"{c}.down"] = _transposed(either(names, f"{m}.experts.fc2.weight", f"{m}.experts.down_proj"))


DECL = Decl(name="aria_text", model_types=("aria_text",), title="Aria text model (checkpoint)", extra=_experts,
            stores=("attention", "moe", "residual"))


def _fields(hf: dict) -> dict:
    """Aria's expert fields under the reader's names, ``AriaTextConfig``'s defaults where the file is silent."""
    t = text_fields(hf)
    return {**hf, "num_local_experts": t.int("moe_num_experts", default=8, minimum=1),
            "num_experts_per_tok": t.int("moe_topk", default=2, minimum=1),
            "num_shared_experts": t.int("moe_num_shared_experts", default=2)}


def to_config(hf: dict):
    t = text_fields(hf)
    if t.bool("mlp_bias", default=False):
        raise t._err("mlp_bias", "true is not supported (storelab's shared experts have no biases)")
    return _reader.to_config(DECL, _fields(hf))


FAMILY = Family(stores=DECL.stores, name=DECL.name, model_types=DECL.model_types, to_config=to_config,
                table=lambda hf, cfg, names: _reader.table(DECL, _fields(hf), cfg, names),
                ignored=lambda hf: DECL.ignored, runs=lambda hf: _reader.runs(DECL, hf))
