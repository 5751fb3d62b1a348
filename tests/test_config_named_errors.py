"""The reported mistyped and inconsistent configs (issue 38, items 2 and 9; issue 36, item 3): each refused
with a ``CheckpointError`` naming the file and the config's own field, or read as transformers reads it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from storelab.checkpoint import CheckpointError, read_model_config

FIXTURES = Path(__file__).parent / "fixtures" / "configs"
QWEN3_NEXT = "Qwen3-Next-80B-A3B-Thinking.json"
KIMI = "Kimi-Linear-48B-A3B-Instruct.json"


def _write(tmp_path: Path, fixture: str, **changes) -> Path:
    hf = json.loads((FIXTURES / fixture).read_text())
    for key, value in changes.items():
        d = hf
        *parents, last = key.split("__")
        for k in parents:
            d = d[k]
        d[last] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(hf))
    return path


REFUSED = [
    (QWEN3_NEXT, {"hidden_size": "64"}, "hidden_size: must be an integer, got '64'"),
    (QWEN3_NEXT, {"layer_types": ["linear_attention"] * 3}, "layer_types: has 3 entries, but num_hidden_layers is 48"),
    (QWEN3_NEXT, {"mlp_only_layers": [99]}, "mlp_only_layers[0]: must be a layer number in [0, 47]"),
    (QWEN3_NEXT, {"rms_norm_eps": 0}, "rms_norm_eps: must be a number > 0"),
    (QWEN3_NEXT, {"max_position_embeddings": "x"}, "max_position_embeddings: must be an integer, got 'x'"),
    (QWEN3_NEXT, {"rope_theta": "x"}, "rope_theta: must be a finite number, got 'x'"),
    (QWEN3_NEXT, {"decoder_sparse_step": 0}, "decoder_sparse_step: must be an integer >= 1"),
    (KIMI, {"linear_attn_config": [1, 2]}, "linear_attn_config: must be a JSON object"),
    (KIMI, {"linear_attn_config": "kda"}, "linear_attn_config: must be a JSON object"),
    (KIMI, {"linear_attn_config__head_dim": "128"}, "linear_attn_config.head_dim: must be an integer, got '128'"),
    (KIMI, {"linear_attn_config__kda_layers": [1, 2, 99]}, "linear_attn_config.kda_layers[2]: must be a layer number"),
    (KIMI, {"linear_attn_config__kda_layers": [1, 2, 4]}, "linear_attn_config.kda_layers: layer 4 is also in "
                                                          "linear_attn_config.full_attn_layers"),
    (KIMI, {"mlp_layer_types": ["dense"] * 3}, "mlp_layer_types: has 3 entries, but num_hidden_layers is 27"),
    (KIMI, {"layer_types": ["full_attention"] * 3}, "layer_types: has 3 entries, but num_hidden_layers is 27"),
    (KIMI, {"first_k_dense_replace": "1"}, "first_k_dense_replace: must be an integer, got '1'"),
    (KIMI, {"num_experts": "256"}, "num_experts: must be an integer, got '256'"),
    (KIMI, {"routed_scaling_factor": "x"}, "routed_scaling_factor: must be a finite number, got 'x'"),
    ("gemma-3-1b-it.json", {"query_pre_attn_scalar": 0}, "query_pre_attn_scalar: must be a number > 0, got 0"),
    ("gemma-3-1b-it.json", {"query_pre_attn_scalar": -4}, "query_pre_attn_scalar: must be a number > 0, got -4"),
    ("Qwen3.5-27B.json", {"text_config__rope_parameters__partial_rotary_factor": "x"},
     "text_config.rope_parameters.partial_rotary_factor: must be a finite number, got 'x'"),
    ("gpt-oss-20b.json", {"num_local_experts": 0}, "num_local_experts: must be an integer >= 1, got 0"),
    ("MiniMax-M2.7.json", {"num_local_experts": 0}, "num_local_experts: must be an integer >= 1, got 0"),
    ("DeepSeek-V3.json", {"rope_scaling__factor": "x"}, "rope_scaling.factor: must be a finite number, got 'x'"),
    ("DeepSeek-V4-Flash.json", {"head_dim": 0}, "head_dim: must be an integer >= 1, got 0"),
]


@pytest.mark.parametrize("fixture, changes, said", REFUSED, ids=[f"{f}-{list(c)[0]}" for f, c, _ in REFUSED])
def test_refused_naming_the_file_and_the_config_field(tmp_path, fixture, changes, said):
    path = _write(tmp_path, fixture, **changes)
    with pytest.raises(CheckpointError) as e:
        read_model_config(path)
    assert str(e.value).startswith(f"{path}: "), str(e.value)
    assert said in str(e.value), str(e.value)


def test_a_longer_layer_types_is_cut_to_the_layers(tmp_path):
    """As transformers does: entries past num_hidden_layers are not read."""
    hf = json.loads((FIXTURES / QWEN3_NEXT).read_text())
    types = ["linear_attention" if (i + 1) % 4 else "full_attention" for i in range(hf["num_hidden_layers"] + 5)]
    cfg = read_model_config(_write(tmp_path, QWEN3_NEXT, layer_types=types))
    assert cfg.n_layers == hf["num_hidden_layers"]
