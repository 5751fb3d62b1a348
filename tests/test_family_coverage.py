"""Every causal-LM model type of transformers 5.23 (``MODEL_FOR_CAUSAL_LM_MAPPING_NAMES``) is in ``storelab
families``: read by a family (accounted, and run where its stores exist, or refused for running by name), or
refused by name with the reason (``storelab/checkpoint/families/unread.py``), or named below as not a
decoder (an encoder or an encoder-decoder that transformers also exposes with a causal-LM head).
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
