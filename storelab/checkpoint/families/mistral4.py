"""Mistral Small 4 (Mistral AI, 2026; ``mistral4``): DeepSeek-V3's decoder with softmax experts.

* multi-head latent attention on every layer (MLA, DeepSeek-V2, arXiv 2405.04434; transformers'
  ``DeepseekV3Attention`` names): a low-rank query (``q_lora_rank``), the latent and one rotary key kept per
  token, RoPE on interleaved pairs (``rope_interleave``), YaRN (``rope_parameters``; its mscale folded into the
  logits' scale as DeepSeek-V3 does);
* the queries times 1 + beta log(1 + floor(p / ``original_max_position_embeddings``)) with beta
  ``rope_parameters.llama_4_scaling_beta`` (after Scalable-Softmax, arXiv 2501.19399; Ministral 3's): storelab's
  MLA has no such temperature, so a config with beta > 0 is accounted and refused for running (``runs``),
  naming the field; it is 1 below the pretraining length;
* ``first_k_dense_replace`` dense SwiGLU layers, then ``n_routed_experts`` experts chosen by softmax scores
  (no choice bias), the top ``num_experts_per_tok`` renormalised (``norm_topk_prob``) and times
  ``routed_scaling_factor``, beside ``n_shared_experts`` shared experts; group-limited choice
  (``topk_group`` < ``n_group``) scores a group by its two best softmax scores, where storelab's softmax groups
  take the best one: refused, naming ``n_group`` (the release uses one group).

Parameters per layer: DeepSeek-V3's (``deepseek_v3.py``); the state is the latent and the rotary key
(``kv_lora_rank`` + ``qk_rope_head_dim`` numbers a token).
"""

from __future__ import annotations

from storelab.checkpoint.families import _reader
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Decl, Fields, text_fields
from storelab.checkpoint.families.deepseek_v3 import mla, mla_table

__all__ = ["FAMILY"]


def mistral4_mla(t: Fields, i: int, kind: str, decl: Decl, D: int, eps: float):
    n_group = t.int("n_group", default=1, minimum=1)
    if n_group > 1 and t.int("topk_group", default=n_group, minimum=1) < n_group:
        raise t._err("n_group", f"{n_group} groups with topk_group < n_group: Mistral 4 scores a group by its two "
                                "best softmax scores, storelab's softmax groups by the best one")
    return mla(t, i, kind, decl, D, eps)


DECL = Decl(stores=("mla", "ffn", "moe", "residual"), name="mistral4", model_types=("mistral4",),
            title="Mistral Small 4 (checkpoint)", router="softmax", token=mistral4_mla, token_table=mla_table)


def runs(hf: dict) -> None:
    _reader.runs(DECL, hf)
    t = text_fields(hf)
    rp = t.sub("rope_parameters", "rope_scaling", default={})
    if rp.float("llama_4_scaling_beta", default=0.0, minimum=0.0) > 0:
        raise rp._err("llama_4_scaling_beta", "> 0 scales the queries by position, which storelab's MLA does not "
                                              "(accounting reads it; loading weights does not)")


FAMILY = Family(stores=DECL.stores, name=DECL.name, model_types=DECL.model_types,
                to_config=lambda hf: _reader.to_config(DECL, hf),
                table=lambda hf, cfg, names: _reader.table(DECL, hf, cfg, names),
                ignored=lambda hf: DECL.ignored, runs=runs)
