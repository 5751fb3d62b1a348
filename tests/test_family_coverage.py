"""Every causal-LM model type of transformers 5.23 (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``) is in ``storelab
families``: read by a family (accounted, and run where its stores exist, or refused for running by name), or
refused by name with the reason (``storelab/checkpoint/families/unread.py``), or named below as not a
decoder (an encoder or an encoder-decoder that transformers also exposes with a causal-LM head).

So is every model type of its image-text and multimodal LM mappings (``MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES``,
``MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES``): a wrapper is read as its text decoder (``wrappers.py``) or refused
naming both model types, a multimodal decoder of its own is read or refused by name, and the rest are named in
``MULTIMODAL_NOT_DECODERS``; transformers' default config of each is read, or refused naming its model type.
"""

from __future__ import annotations

import json

import pytest

from storelab.checkpoint.config_only import read_model_config
from storelab.checkpoint.families import FAMILIES
from storelab.checkpoint.families.unread import REASONS
from storelab.checkpoint.shards import CheckpointError

transformers = pytest.importorskip("transformers")

_ENC_DEC = "an encoder-decoder: its causal-LM head is the decoder half, which reads the encoder's states"
_ENCODER = "a bidirectional encoder (BERT family) whose causal-LM head serves encoder-decoder set-ups"
NOT_DECODERS = {
    **dict.fromkeys(("bart", "bigbird_pegasus", "blenderbot", "blenderbot-small", "marian", "mbart", "mvp", "pegasus",
                     "plbart", "prophetnet", "whisper", "trocr", "musicgen", "musicgen_melody",
                     "moss_transcribe_diarize"), _ENC_DEC),
    **dict.fromkeys(("bert", "bert-generation", "big_bird", "camembert", "data2vec-text", "electra", "ernie",
                     "megatron-bert", "rembert", "roberta", "roberta-prelayernorm", "roc_bert", "roformer",
                     "xlm-roberta", "xlm-roberta-xl", "xmod", "xlm"), _ENCODER),
    "xlnet": "a permutation language model with two attention streams, not a left-to-right decoder",
    "reformer": "LSH and axial-position attention over chunked buckets, not a left-to-right decoder cache",
}


_MM_ENC_DEC = "an encoder-decoder over image or document features (its text half reads the encoder's states)"
MULTIMODAL_NOT_DECODERS = {
    **dict.fromkeys(("florence2", "pix2struct", "udop", "t5gemma2", "vision-encoder-decoder"), _MM_ENC_DEC),
    "blip": "a BERT-style text decoder with cross-attention to the image in every layer (captioning), not a causal LM",
    "diffusion_gemma": "a diffusion language model: tokens denoised in parallel with bidirectional attention",
    "pi0": "a vision-language-action policy: an action expert decodes continuous actions by flow matching",
    "kyutai_speech_to_text": "a streaming speech-to-text model over audio codec tokens (Moshi's depth decoding)",
}


def _multimodal_types() -> set[str]:
    from transformers.models.auto.modeling_auto import (MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES,
                                                        MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES)

    return set(MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES) | set(MODEL_FOR_MULTIMODAL_LM_MAPPING_NAMES)


def _causal_types() -> set[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def _read_types() -> set[str]:
    return {t for f in FAMILIES if f.name != "unread" for t in f.model_types}


def test_every_causal_lm_type_is_covered():
    causal = _causal_types()
    missing = sorted(causal - _read_types() - set(REASONS) - set(NOT_DECODERS))
    assert not missing, f"causal-LM model types of transformers in no family, no refusal and no exclusion: {missing}"


def test_lists_are_honest():
    """No model type both read and refused; the exclusions are transformers' own causal-LM types; every reason
    says something."""
    read = _read_types()
    assert not read & set(REASONS), sorted(read & set(REASONS))
    assert not read & set(NOT_DECODERS), sorted(read & set(NOT_DECODERS))
    assert set(NOT_DECODERS) <= _causal_types()
    assert all(len(why) > 20 for why in {**REASONS, **NOT_DECODERS}.values())


def test_coverage_count():
    """Most of transformers' decoders are read (a floor that only rises as families are added)."""
    causal = _causal_types() - set(NOT_DECODERS)
    read = causal & _read_types()
    assert len(read) >= 50, f"{len(read)} of {len(causal)} decoder model types read"


@pytest.mark.parametrize("model_type", sorted(REASONS))
def test_unread_refused_by_name(model_type, tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type, "hidden_size": 64}))
    with pytest.raises(CheckpointError, match=f"model_type: '{model_type}' is not read by storelab yet: .+") as e:
        read_model_config(tmp_path)
    assert str(tmp_path) in str(e.value)


def test_every_multimodal_type_is_covered():
    missing = sorted(_multimodal_types() - _read_types() - set(REASONS) - set(NOT_DECODERS)
                     - set(MULTIMODAL_NOT_DECODERS))
    assert not missing, f"image-text / multimodal model types in no family, no refusal and no exclusion: {missing}"
    read = _read_types()
    assert not read & set(MULTIMODAL_NOT_DECODERS) and not set(REASONS) & set(MULTIMODAL_NOT_DECODERS)
    assert set(MULTIMODAL_NOT_DECODERS) <= _multimodal_types()


def test_multimodal_coverage_count():
    """Most wrappers and multimodal decoders read their defaults (a floor that only rises)."""
    from transformers import AutoConfig

    n = 0
    for mt in sorted(_multimodal_types() & _read_types()):
        try:
            read_model_config(_write(AutoConfig.for_model(mt).to_dict()))
            n += 1
        except CheckpointError:
            pass
    assert n >= 50, f"{n} image-text / multimodal model types read from transformers' default config"


def _write(hf: dict):
    import tempfile
    from pathlib import Path

    d = Path(tempfile.mkdtemp())
    (d / "config.json").write_text(json.dumps(hf))
    return d


@pytest.mark.parametrize("model_type", sorted(_multimodal_types() - set(MULTIMODAL_NOT_DECODERS) - set(NOT_DECODERS)))
def test_multimodal_default_read_or_refused_by_name(model_type, tmp_path):
    """transformers' default config of each: read, or refused with a reason naming the model type (a wrapper's
    refusal names its text model too)."""
    from transformers import AutoConfig

    (tmp_path / "config.json").write_text(json.dumps(AutoConfig.for_model(model_type).to_dict()))
    try:
        read_model_config(tmp_path)
    except CheckpointError as e:
        msg = str(e)
        assert str(tmp_path) in msg and "is not supported (supported:" not in msg, msg
        if model_type in REASONS or "wraps the text model" in msg:
            assert repr(model_type) in msg, msg
