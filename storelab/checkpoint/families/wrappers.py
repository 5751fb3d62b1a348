"""Multimodal wrappers whose decoder is a text model storelab reads: LLaVA, Qwen2-VL, InternVL, Idefics,
PaliGemma, Aya Vision, LFM2-VL, the speech-to-text wrappers (Voxtral, Qwen2-Audio, Granite Speech) and the
like (transformers' ``MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES`` and ``MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES``).

Such a wrapper is a vision or audio tower, a projector into the text model's embedding space, and a decoder
whose config is the wrapper's ``text_config``. Text tokens pass through the decoder alone, so the decoder is
the model storelab reads, accounts and runs: the family of the ``text_config``'s ``model_type`` (or of the
wrapper's default text model when the file names none, as transformers' config class does) reads it, and
the towers are named in the model's notes, counted where ``towers.py`` has a counter, else "not counted".

* ``WRAPPERS``: per wrapper ``model_type``, the text model transformers builds when ``text_config`` names
  no ``model_type``, and whether its embeddings are tied when the file says nothing. transformers ties them
  by the wrapper's own ``tie_word_embeddings`` only (``PreTrainedModel.get_expanded_tied_weights_keys``),
  the text config's is not read: a wrapper class without the field (Qwen2-Audio, Voxtral) never ties;
* ``TEXT_ALIASES``: a wrapper's text model type that is another family's decoder for text tokens.
  Qwen2-VL's and Qwen2.5-VL's text models are Qwen2's (q/k/v biases, GQA, SwiGLU) with multimodal RoPE
  (M-RoPE, arXiv 2409.12191): a text token has the same temporal, height and width index, so its rotation
  is plain RoPE over the whole head;
* a wrapper whose text model no family reads is refused naming both model types and the reason.

Names: the text family's (``model.language_model.layers.i.*``, ``lm_head.weight``); every other tensor
(``model.vision_tower``, ``model.multi_modal_projector``, ``model.audio_tower``, ...) is left out.
"""

from __future__ import annotations

import dataclasses

from storelab.checkpoint import towers
from storelab.checkpoint.families._family import Family
from storelab.checkpoint.families._reader import Fields
from storelab.checkpoint.shards import CheckpointError

__all__ = ["FAMILY", "WRAPPERS", "TEXT_ALIASES", "text_type"]

# wrapper model_type -> (its default text model_type, tie_word_embeddings when the file says nothing)
WRAPPERS: dict[str, tuple[str, bool]] = {
    # image-text wrappers
    "aya_vision": ("cohere2", True),
    "cohere2_vision": ("cohere2", True),
    "cosmos3_omni": ("qwen3_vl_text", False),
    "deepseek_vl": ("llama", True),
    "deepseek_vl_hybrid": ("llama", True),
    "exaone4_5": ("exaone4", False),
    "fast_vlm": ("qwen2", False),
    "idefics2": ("mistral", False),
    "idefics3": ("llama", False),
    "internvl": ("qwen2", True),
    "janus": ("llama", True),
    "lfm2_vl": ("lfm2", True),
    "lfm3_vl": ("lfm3", True),
    "lighton_ocr": ("qwen3", True),
    "llava": ("llama", False),
    "llava_next": ("llama", False),
    "llava_next_video": ("llama", False),
    "llava_onevision": ("qwen2", False),
    "minicpm_ocr": ("qwen3_5_text", True),
    "minicpmv4_6": ("qwen3_5_text", False),
    "minicpmv4_7": ("qwen3_5_text", False),
    "nemotron_h_omni": ("nemotron_h", False),
    "ovis2": ("qwen2", True),
    "paligemma": ("gemma", True),
    "perception_lm": ("llama", False),
    "pp_chart2table": ("qwen2", True),
    "qianfan_ocr": ("qwen3", False),
    "qwen2_vl": ("qwen2_vl_text", False),
    "qwen2_5_vl": ("qwen2_5_vl_text", False),
    "shieldgemma2": ("gemma3_text", True),
    "smolvlm": ("llama", False),
    "video_llama_3": ("qwen2", False),
    "video_llava": ("llama", False),
    "vipllava": ("llama", False),
    # speech-to-text wrappers: an audio encoder whose states enter a decoder-only text model
    "fun_asr_nano": ("qwen3", True),
    "glmasr": ("llama", True),
    "granite_speech": ("granite", True),
    "granite_speech_plus": ("granite", True),
    "nemo_speechlm": ("nemotron_h", False),
    "qwen2_audio": ("qwen2", False),
    "qwen3_asr": ("qwen3", True),
    "vibevoice_asr": ("qwen2", False),
    "voxtral": ("llama", False),
    # wrappers whose text model is not read (refused naming both types)
    "aria": ("aria_text", False),
    "blip-2": ("opt", False),
    "instructblip": ("opt", False),
    "instructblipvideo": ("opt", False),
    "cohere_compass": ("cohere_compass_text", False),
    "hyperclovax_vision_v2": ("hyperclovax", True),
    "inkling2": ("inkling2_text", False),
    "inkling_mm_model": ("inkling_text", False),
    "glm4v": ("glm4v_text", False),
    "glm46v": ("glm4v_text", False),
    "glmga": ("glm4v_text", False),
    "glm4v_moe": ("glm4v_moe_text", False),
    "glm_ocr": ("glm_ocr_text", False),
    "ernie4_5_vl_moe": ("ernie4_5_vl_moe_text", True),
    "paddleocr_vl": ("paddleocr_vl_text", True),
    "hunyuan_vl": ("hunyuan_vl_text", True),
    "granite4_vision": ("granite4_vision_text", False),
    "granite_docling": ("granite_docling_text", True),
    "deepseek_ocr2": ("deepseek_ocr2_text", False),
    "cosmos3_edge": ("cosmos3_edge_text", False),
    "molmo2": ("molmo2_text", False),
    "muse_spark": ("muse_spark_text", False),
    "unlimited_ocr": ("unlimited_ocr_text", False),
    "voxtral_realtime": ("voxtral_realtime_text", True),
    "pp_formulanet": ("pp_formulanet_text", False),
    "qwen2_5_omni_thinker": ("qwen2_5_omni_text", False),
    "qwen3_omni_moe_thinker": ("qwen3_omni_moe_text", False),
}

# a wrapper's text model type -> the model type of the family that reads it (see the module's docstring)
TEXT_ALIASES: dict[str, str] = {"qwen2_vl_text": "qwen2", "qwen2_5_vl_text": "qwen2"}

_MROPE_UNCOMPARED = ("its text model's modeling file (multimodal RoPE over a decoder of its own) is not yet compared "
                     "with storelab's stores")
# why a text model type no family reads is not read (types in unread.REASONS give that reason)
TEXT_REASONS: dict[str, str] = {
    **dict.fromkeys(("glm4v_text", "glm4v_moe_text", "glm_ocr_text", "hunyuan_vl_text", "paddleocr_vl_text",
                     "qwen2_5_omni_text", "qwen3_omni_moe_text", "cosmos3_edge_text", "unlimited_ocr_text",
                     "deepseek_ocr2_text", "granite4_vision_text", "granite_docling_text", "molmo2_text",
                     "muse_spark_text", "voxtral_realtime_text", "pp_formulanet_text"), _MROPE_UNCOMPARED),
    "ernie4_5_vl_moe_text": "separate text and vision experts chosen by each token's modality: no moe store does",
}

_TEXT_KEYS = ("text_config", "language_config", "llm_config")


def text_type(hf: dict) -> tuple[str, str]:
    """(the text model's own model_type, the model_type of the family that reads it)."""
    mt = hf.get("model_type")
    top = Fields(hf)
    key = top.key(*_TEXT_KEYS)
    given = top.sub(key).str("model_type", default=None) if key else None
    own = given or WRAPPERS[mt][0]
    return own, TEXT_ALIASES.get(own, own)


def _text_family(hf: dict) -> tuple[Family, dict]:
    """The family of the decoder and the config it reads: the ``text_config`` as a text model's own config.json
    (the text model's type, the tie transformers applies)."""
    from storelab.checkpoint.families import FAMILIES
    from storelab.checkpoint.families.unread import REASONS

    mt = hf.get("model_type")
    own, reads = text_type(hf)
    fam = next((f for f in FAMILIES if reads in f.model_types and f.name not in ("unread", "wrappers")), None)
    if fam is None:
        why = REASONS.get(own) or TEXT_REASONS.get(own) or "no storelab family reads it"
        raise CheckpointError(f"config.json: model_type: {mt!r} wraps the text model {own!r}, which is not read by "
                              f"storelab yet: {why}")
    top = Fields(hf)
    key = top.key(*_TEXT_KEYS)
    text = dict(top.sub(key).d) if key else {}
    text["model_type"] = reads
    text["tie_word_embeddings"] = top.bool("tie_word_embeddings", default=WRAPPERS[mt][1])
    if own in TEXT_ALIASES:
        text = _plain_rope(text)
    return fam, text


def _named(hf: dict, e: CheckpointError) -> CheckpointError:
    """The text family's error with the field named where the wrapper's file has it (``text_config.hidden_size``)."""
    key = Fields(hf).key(*_TEXT_KEYS)
    msg = str(e)
    if key and msg.startswith("config.json: ") and not msg.startswith("config.json: model_type"):
        msg = f"config.json: {key}." + msg[len("config.json: "):]
    return CheckpointError(msg)


def _plain_rope(text: dict) -> dict:
    """M-RoPE's scaling entry (``"type": "mrope"`` with its ``mrope_section``) as plain RoPE: equal for text tokens."""
    out = dict(text)
    for key in ("rope_scaling", "rope_parameters"):
        rp = out.get(key)
        if isinstance(rp, dict) and (rp.get("type") == "mrope" or rp.get("rope_type") == "mrope"):
            out[key] = {k: v for k, v in rp.items() if k not in ("type", "rope_type", "mrope_section")}
            out[key]["rope_type"] = "default"
    return out


def to_config(hf: dict):
    fam, text = _text_family(hf)
    try:
        cfg = fam.to_config(text)
    except CheckpointError as e:
        raise _named(hf, e) from None
    found = towers.parts(hf, cfg)
    others = [f"{k} ({v.get('model_type') or k}), not built, not counted" for k, v in hf.items()
              if k.endswith("_config") and isinstance(v, dict) and k not in _TEXT_KEYS + ("vision_config", "audio_config")
              and k != "quantization_config"]
    notes = "; ".join(x for x in (towers.note(found), *others,
                                  f"the projector of {hf.get('model_type')!r}: not built, not counted") if x)
    return dataclasses.replace(cfg, notes="; ".join(x for x in (cfg.notes, notes) if x))


# where a wrapper keeps its text model -> where a text model's own checkpoint keeps it
_TEXT_PREFIXES = (("model.language_model.", "model."), ("model.text_model.", "model."), ("language_model.", ""))


def _as_text(names: set[str]) -> dict[str, str]:
    """The text model's tensors under a text checkpoint's names -> their names in the wrapper's file (LLaVA's
    ``model.language_model.``, Idefics3's ``model.text_model.``, Nemotron-H Omni's ``language_model.``)."""
    for pre, to in _TEXT_PREFIXES:
        if any(n.startswith(pre) for n in names):
            out = {n: n for n in names if n.startswith("lm_head.")}
            out.update({to + n[len(pre):]: n for n in names if n.startswith(pre)})
            return out
    return {n: n for n in names}


def table(hf: dict, cfg, names: set[str]) -> dict:
    """The text family's table over the text model's tensors, named back as the wrapper's file names them."""
    fam, text = _text_family(hf)
    back = _as_text(names)
    tab = fam.table(text, cfg, set(back))
    return {ours: dataclasses.replace(src, names=tuple(back.get(n, n) for n in src.names)) for ours, src in tab.items()}


def ignored(hf: dict) -> tuple[str, ...]:
    """Every tensor outside the language model and its head (towers, projectors, generation heads)."""
    _text_family(hf)
    return (r"^(?!model\.language_model\.|model\.text_model\.|language_model\.|lm_head\.)",)


def runs(hf: dict) -> None:
    fam, text = _text_family(hf)
    try:
        fam.runs(text)
    except CheckpointError as e:
        raise _named(hf, e) from None


FAMILY = Family(name="wrappers", model_types=tuple(WRAPPERS), to_config=to_config, table=table, ignored=ignored,
                runs=runs, stores=("any",),
                oracle="transformers 5.23: the text model's parameters of each wrapper's default config; logits of "
                       "tiny LLaVA and Qwen2.5-VL models on text tokens")
