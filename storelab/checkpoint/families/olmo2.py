"""OLMo 2 (AllenAI, arXiv 2501.00656; ``olmo2``), OLMo 3 (``olmo3``) and FlexOlmo: Llama's decoder with the norms
moved after each mixer and a norm over the whole query and key projections; OLMoE (arXiv 2409.02060;
``olmoe``), the same q/k norms in a pre-norm mixture-of-experts decoder.

OLMo 2 and 3:

* post norms (``LayerConfig.norms = "post"``): x + norm(f(x)) around the attention and the MLP, no
  norm before either (``post_attention_layernorm``, ``post_feedforward_layernorm``), RMSNorms;
* one RMSNorm over all heads' query channels (H*K wide) and one over the keys' (G*K), applied to the
  projections before they are split into heads and rotated (``qk_norm_scope = "all"``);
* a SwiGLU MLP, no biases (``attention_bias`` false in the published files), untied embeddings;
* OLMo 3 only: sliding-window layers by ``layer_types`` (three sliding, the fourth full, when the file
  gives a ``sliding_window`` without them: ``Olmo3Config``'s default), each layer type with its own
  rope (``rope_parameters`` per type in v5 files). A v4 file's ``rope_scaling`` (YaRN in OLMo 3 7B /
  32B) belongs to the full-attention layers only: the sliding ones rotate plainly, as
  ``Olmo3Config.convert_rope_params_to_dict`` reads it.

OLMoE: pre norms (``input_layernorm``, ``post_attention_layernorm``), every layer's MLP ``num_experts``
SwiGLU experts ``intermediate_size`` wide (3-D ``gate_up_proj`` / ``down_proj``), ``num_experts_per_tok``
chosen by a softmax router, their weights renormalised only with ``norm_topk_prob`` (default false).
Its ``clip_qkv`` (q, k, v clamped to [-c, c]; null in OLMoE-1B-7B) is no option of storelab's attention:
accounting reads such a file, loading refuses it naming the field.

FlexOlmo (AllenAI, 2025; ``flex_olmo``): OLMo 2's post-norm layers and whole-projection q/k norms with OLMoE's
experts on every layer (``num_experts``, 7, of which ``num_experts_per_tok``, 5, by a softmax router, renormalised
only with ``norm_topk_prob``); ``rms_norm_eps`` 1e-6 and ``rope_theta`` 500,000 by default.

transformers' defaults where a file says nothing: ``rms_norm_eps`` 1e-5; ``rope_theta`` 10,000
(OLMo 2, OLMoE) and 500,000 (OLMo 3). Parameters per layer: the attention's D*(H + 2G)*K + H*K*D and its two
norms (H + G)*K, the MLP's 3*D*I, two d_model norms; the state is the attention's keys and values
(a window's W of them on the sliding layers). OLMoE's MLP: E experts' 3*D*I and the router's E*D.

Names (transformers' ``Olmo2ForCausalLM`` / ``Olmo3ForCausalLM`` / ``OlmoeForCausalLM``; ``a`` =
``model.layers.i``):

| ours                                 | transformers                          |
|--------------------------------------|---------------------------------------|
| blocks.i.norm_token                  | a.post_attention_layernorm (OLMoE: a.input_layernorm) |
| blocks.i.norm_channel                | a.post_feedforward_layernorm (OLMoE: a.post_attention_layernorm) |
| blocks.i.token.{q,k,v,o}_proj        | a.self_attn.{q,k,v,o}_proj            |
| blocks.i.token.q_norm / k_norm       | a.self_attn.q_norm / k_norm (H*K, G*K) |
| blocks.i.channel.{gate,up,down}_proj | a.mlp.{gate,up,down}_proj             |
| blocks.i.channel.router, gate_up, down | a.mlp.gate, a.mlp.experts.gate_up_proj / down_proj (OLMoE) |
| norm.weight                          | model.norm.weight                     |
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._common import layer_prefix, post_norm_entries
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import SLIDING, Decl, Fields, _attention

__all__ = ["FAMILY", "post_layers"]


def olmo_attention(t: Fields, i: int, kind: str, decl: Decl, D: int, eps: float):
    """The shared reader's attention with the q/k norms over the whole projections; a v4 file's
    ``rope_scaling`` kept off the sliding layers."""
    a = dataclasses.replace(_attention(t, i, kind, decl, D, eps), qk_norm_scope="all")
    if kind == SLIDING and t.has("rope_scaling") and not t.has("rope_parameters"):
        a = dataclasses.replace(a, rope_scaling=None)
    return a


DECLS = {
    "olmo2": Decl(name="olmo2", model_types=("olmo2",), title="OLMo 2 (checkpoint)", qk_norm=True, eps=1e-5,
                  token=olmo_attention),
    "olmo3": Decl(name="olmo3", model_types=("olmo3",), title="OLMo 3 (checkpoint)", qk_norm=True, eps=1e-5,
                  every=4, theta=500000.0, token=olmo_attention),
    "olmoe": Decl(name="olmoe", model_types=("olmoe",), title="OLMoE (checkpoint)", qk_norm=True, eps=1e-5,
                  norm_topk_default=False, token=olmo_attention),
    "flex_olmo": Decl(name="flex_olmo", model_types=("flex_olmo",), title="FlexOlmo (checkpoint)", qk_norm=True,
                      eps=1e-6, theta=500000.0, norm_topk_default=False, token=olmo_attention),
}
POST_NORMS = ("olmo2", "olmo3", "flex_olmo")  # OLMoE keeps Llama's pre norms


def post_layers(cfg):
    """The model with every layer's norms after its mixers (``norms = "post"``)."""
    return dataclasses.replace(cfg, layers=[dataclasses.replace(lay, norms="post") for lay in cfg.layers])


def _type(hf: dict) -> str:
    return Fields(hf).str("model_type")


def to_config(hf: dict):
    cfg = _reader.to_config(DECLS[_type(hf)], hf)
    return post_layers(cfg) if _type(hf) in POST_NORMS else cfg


def table(hf: dict, cfg, names: set[str]) -> dict:
    tab = _reader.table(DECLS[_type(hf)], hf, cfg, names)
    if _type(hf) in POST_NORMS:
        post_norm_entries(tab, cfg, prefix=layer_prefix(names)[0])
    return tab


def runs(hf: dict) -> None:
    """The reader's rope check; OLMoE's ``clip_qkv`` refused by name."""
    t = _reader.text_fields(hf)
    if t.has("clip_qkv"):
        raise t._err("clip_qkv", f"{t.float('clip_qkv')!r}: storelab's attention does not clamp q, k and v "
                                 "(accounting reads it; loading weights does not)")
    _reader.runs(DECLS[_type(hf)], hf)


FAMILY = Family(stores=("attention", "window", "ffn", "moe", "residual"),
                name="olmo2", model_types=tuple(DECLS), to_config=to_config, table=table,
                ignored=lambda hf: DECLS[_type(hf)].ignored, runs=runs)
