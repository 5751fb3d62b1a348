"""Qwen3.5 / Qwen3.6 dense (0.8B to 27B; the family Lee et al. measured): Qwen3-Next's layers
with a dense SwiGLU MLP in every layer. Gated DeltaNet (arXiv 2412.06464) in three of every four
layers, gated full attention (arXiv 2505.06708) in every fourth (``full_attention_interval``).

Two layouts of config.json: ``qwen3_5_text`` (the text model alone) and ``qwen3_5``, the
multimodal wrapper, whose text model sits under ``text_config`` and whose weights sit under
``model.language_model.`` beside a vision tower (ignored, as are the MTP layers). Both are counted apart
from the config (``storelab.checkpoint.towers``: Qwen3.5-0.8B's published 873M = 752,393,024 in the text
model + 100,592,896 in the vision tower + 20,452,864 in its MTP layer), named in the model's notes and
shown by ``storelab models --checkpoint``.

The tensor names are Qwen3.5-MoE's (``storelab.checkpoint.families.qwen3_next`` gives the table):
``linear_attn.in_proj_qkv`` (q, k, v rows one after the other), ``in_proj_z``, ``in_proj_b``,
``in_proj_a``, ``conv1d``, ``A_log``, ``dt_bias``, ``norm`` and ``out_proj``; ``self_attn.{q,k,v,o}_proj``
(q_proj emits query and gate per head) with 1 + w ``q_norm``/``k_norm``; ``mlp.{gate,up,down}_proj``.

Published sizes, Qwen3.5-27B (= Qwen3.6-27B): 64 layers, hidden 5120, 24 query heads and 4 KV heads
of 256, Gated DeltaNet with 16 key and 48 value heads of 128, a convolution of 4, MLP 17,408, vocabulary
248,320. Its memory (``storelab memory --checkpoint``): 64 KiB of f16 KV per token in its 16 attention
layers, 149.625 MiB of fp32 recurrent state per sequence in its 48 Gated DeltaNet layers (llama.cpp's log).
"""

from __future__ import annotations

from storelab.checkpoint import towers
from storelab.checkpoint.families import qwen3_next
from storelab.checkpoint.families._family import Family, fixed
from storelab.checkpoint.families._reader import Fields, text_fields

NAME = "qwen3_5"
MODEL_TYPES = ("qwen3_5", "qwen3_5_text")


def text_config(hf: dict) -> Fields:
    """The text model's fields (a ``qwen3_5`` wrapper's ``text_config``)."""
    return text_fields(hf) if hf.get("model_type") == "qwen3_5" else Fields(hf)


def to_config(hf: dict):
    cfg = qwen3_next.build_config(hf, text_config(hf), title="Qwen3.5 (checkpoint)", model_type="qwen3_5_text")
    cfg.notes = towers.note(towers.parts(hf, cfg))   # the vision tower and MTP layers, counted apart
    return cfg


FAMILY = Family(stores=("gated_deltanet", "attention", "ffn", "moe", "residual"),
                name=NAME, model_types=MODEL_TYPES, to_config=to_config, table=qwen3_next.table,
                ignored=fixed(*qwen3_next.IGNORED))
