"""Remote-code releases read by existing families (issue 36, item 1): Hunyuan-A13B-Instruct's ``hunyuan`` config
(``hunyuan.py``) and MiMo-V2.5's ``mimo_v2`` config (``mimo_v2_flash.py``), each from its published config.json.

* Hunyuan ``hunyuan``: parameters against Tencent's 80B total / 13B active; the KV cache by hand; the remote field
  names held to transformers' ``hunyuan_v1_moe`` (a tiny model saved under the remote config's field names, its
  experts per expert as the remote file stores them: logits equal, prefill-then-step, counts); ``use_cla`` refused
  by name.
* MiMo-V2.5 ``mimo_v2``: the text model's parameters against its published tensor list (the shapes and counts of a
  safetensors listing of the release), its KV cache by hand (9 full layers of 4 key/value heads, 39 window layers
  of 8 holding 128 tokens), its per-layer fields read where transformers' Flash config fixes them; running refused
  naming the fused qkv projection.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from storelab.checkpoint import load
from storelab.checkpoint.config_only import read_model_config
from storelab.checkpoint.shards import CheckpointError
from storelab.cli import app
from storelab.models.accounting import count_params
from tests.family_harness import check_counts, check_logits, tiny_hf

FIXTURES = Path(__file__).parent / "fixtures" / "configs"
HUNYUAN, MIMO = FIXTURES / "Hunyuan-A13B-Instruct.json", FIXTURES / "MiMo-V2.5.json"


def _memory(path: Path, context: int = 8192) -> dict:
    r = CliRunner().invoke(app, ["memory", "--checkpoint", str(path), "--context", str(context), "--json"])
    assert r.exit_code == 0, r.output
    return json.loads(r.output)["models"][0]


@pytest.mark.parametrize("path", [HUNYUAN, MIMO], ids=lambda p: p.stem)
def test_cli_models_and_memory_exit_0(path):
    for extra in ((), ("--json",)):
        r = CliRunner().invoke(app, ["models", "--checkpoint", str(path), *extra], env={"COLUMNS": "300"})
        assert r.exit_code == 0, r.output
    _memory(path)


# -- Hunyuan-A13B (remote ``hunyuan``) -------------------------------------------------------------------------
def test_hunyuan_a13b_read_as_published():
    """32 layers of GQA (32 query heads, 8 key/value, 128 wide, q/k norms after RoPE), 64 experts of 3072 (top 8)
    and one shared MLP of 3072 on every layer, tied embeddings of 128,167: 80.39B stored, 12.75B active (Tencent:
    80B total, 13B active)."""
    cfg = read_model_config(HUNYUAN)
    a, m = cfg.layers[0].token, cfg.layers[0].channel
    assert (a.n_heads, a.n_kv_heads, a.head_dim, a.qk_norm, a.qk_norm_scope) == (32, 8, 128, True, "head_after_rope")
    assert (m.n_experts, m.top_k, m.d_expert, m.shared_width, m.norm_topk_prob) == (64, 8, 3072, 3072, True)
    assert cfg.tie_embeddings and cfg.vocab_size == 128167
    D, I, V, E = 4096, 3072, 128167, 64
    attn = D * (32 + 2 * 8) * 128 + 32 * 128 * D + 2 * 128
    per_layer = attn + E * 3 * D * I + E * D + 3 * D * I + 2 * D
    pa = count_params(cfg)
    assert pa.stored == 32 * per_layer + V * D + D
    assert pa.active == 32 * (attn + 8 * 3 * D * I + E * D + 3 * D * I + 2 * D) + V * D + D
    assert abs(pa.stored / 1e9 - 80) < 0.5 and abs(pa.active / 1e9 - 13) < 0.3


def test_hunyuan_kv_cache_by_hand():
    """32 layers x 8 key/value heads x 128 x (key + value) x 2 bytes (bf16) = 131,072 B per token: 1 GiB at 8,192."""
    out = _memory(HUNYUAN)
    assert out["engine"]["total_bytes"] == 32 * 8 * 128 * 2 * 2 * 8192 == 2**30


@pytest.mark.parametrize("field,value", [("use_cla", True), ("use_mla", True)])
def test_hunyuan_refuses_by_name(tmp_path, field, value):
    hf = json.loads(HUNYUAN.read_text())
    hf[field] = value
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(CheckpointError, match=field):
        read_model_config(tmp_path)


def test_hunyuan_dense_remote_without_qk_norm():
    """``num_experts`` 1: the dense MLP; ``use_qk_norm`` absent: no q/k norms (the remote file's defaults)."""
    hf = dict(json.loads(HUNYUAN.read_text()), num_experts=1, use_mixed_mlp_moe=False)
    hf.pop("use_qk_norm")
    from storelab.checkpoint.families.hunyuan import FAMILY

    cfg = FAMILY.to_config(hf)
    assert {lay.channel.KIND for lay in cfg.layers} == {"ffn"} and not cfg.layers[0].token.qk_norm


TINY = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
            vocab_size=128, intermediate_size=32, num_experts=4, moe_topk=[2, 1, 2], max_position_embeddings=256,
            bos_token_id=1, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def remote_hunyuan(tmp_path_factory):
    """transformers' tiny hunyuan_v1_moe, saved as the remote release would be: its config in the remote field
    names (``model_type`` "hunyuan", head_dim from hidden / heads, ``use_qk_norm``, ``use_mixed_mlp_moe``,
    ``num_shared_expert``), its experts split per expert."""
    hf = tiny_hf("hunyuan_v1_moe", TINY)
    n, I = TINY["num_hidden_layers"], TINY["intermediate_size"]
    tensors = {}
    for k, v in hf.state_dict().items():
        if k.endswith("mlp.experts.gate_up_proj"):
            for j in range(v.shape[0]):
                tensors[k.replace("gate_up_proj", f"{j}.gate_proj.weight")] = v[j, :I]
                tensors[k.replace("gate_up_proj", f"{j}.up_proj.weight")] = v[j, I:]
        elif k.endswith("mlp.experts.down_proj"):
            for j in range(v.shape[0]):
                tensors[k.replace("down_proj", f"{j}.down_proj.weight")] = v[j]
        else:
            tensors[k] = v
    config = {k: v for k, v in TINY.items() if k != "head_dim"}
    config.update(model_type="hunyuan", architectures=["HunYuanMoEV1ForCausalLM"], use_qk_norm=True,
                  use_mixed_mlp_moe=True, num_shared_expert=[1] * n, moe_intermediate_size=[I] * n, use_cla=False,
                  rms_norm_eps=hf.config.rms_norm_eps, rope_theta=10000.0)
    folder = tmp_path_factory.mktemp("hunyuan_remote")
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return hf, folder


def test_remote_hunyuan_logits_equal_transformers(remote_hunyuan):
    check_logits(*remote_hunyuan, what="hunyuan (remote names)")


def test_remote_hunyuan_counts(remote_hunyuan):
    check_counts(*remote_hunyuan)


# -- MiMo-V2.5 (remote ``mimo_v2``) ----------------------------------------------------------------------------
# the text model's tensors of the release (name: shape, count), as its safetensors listing gives them
# (gogongxt/python scripts/models/mimo_v2.5.md); FP8 scales, MTP, vision, audio and speech tensors left out
MIMO_TENSORS = {
    "lm_head.weight": ((152576, 4096), 1), "model.embed_tokens.weight": ((152576, 4096), 1),
    "full self_attn.qkv_proj.weight": ((13568, 4096), 9), "window self_attn.qkv_proj.weight": ((14848, 4096), 39),
    "self_attn.o_proj.weight": ((4096, 8192), 48), "self_attn.attention_sink_bias": ((64,), 39),
    "input_layernorm.weight": ((4096,), 48), "post_attention_layernorm.weight": ((4096,), 48),
    "layer 0 mlp.{gate,up,down}_proj.weight": ((16384, 4096), 3),
    "mlp.experts.j.{gate,up,down}_proj.weight": ((2048, 4096), 47 * 256 * 3),
    "mlp.gate.weight": ((256, 4096), 47), "mlp.gate.e_score_correction_bias": ((256,), 47),
    "model.norm.weight": ((4096,), 1),
}


def test_mimo_v25_read_as_published():
    cfg = read_model_config(MIMO)
    full = [i for i, lay in enumerate(cfg.layers) if lay.token.KIND == "attention"]
    assert full == [0, 5, 11, 17, 23, 29, 35, 41, 47]
    f, w = cfg.layers[0].token, cfg.layers[1].token
    assert (f.n_heads, f.n_kv_heads, f.head_dim, f.v_head_dim, f.rope_theta, f.sink) == (64, 4, 192, 128, 1e7, False)
    assert (w.n_heads, w.n_kv_heads, w.window, w.rope_theta, w.sink) == (64, 8, 128, 1e4, True)
    assert f.partial_rotary == w.partial_rotary == 0.334 and f.value_scale == 0.707
    assert cfg.layers[0].channel.KIND == "ffn" and {lay.channel.KIND for lay in cfg.layers[1:]} == {"moe"}
    held = sum(torch.Size(shape).numel() * count for shape, count in MIMO_TENSORS.values())
    assert count_params(cfg).stored == held == 308_778_780_864


def test_mimo_v25_kv_cache_by_hand():
    """9 full layers x 4 key/value heads x (192 key + 128 value) x 2 bytes x 8,192 tokens, plus 39 window layers
    x 8 heads x 320 x 2 bytes x the 128 tokens they keep."""
    out = _memory(MIMO)
    assert out["engine"]["total_bytes"] == 9 * 4 * 320 * 2 * 8192 + 39 * 8 * 320 * 2 * 128 == 214_302_720


def test_mimo_v25_reads_its_own_rope_where_flash_fixes_it():
    """The same file as mimo_v2_flash (transformers' reading) keeps transformers' fixed 5,000,000 base; as mimo_v2
    it reads the file's 10,000,000."""
    hf = json.loads(MIMO.read_text())
    from storelab.checkpoint.families.mimo_v2_flash import FAMILY

    flash = FAMILY.to_config(dict(hf, model_type="mimo_v2_flash"))
    assert flash.layers[0].token.rope_theta == 5e6 and FAMILY.to_config(hf).layers[0].token.rope_theta == 1e7


def test_mimo_v25_running_refused_by_name(tmp_path):
    from storelab.checkpoint.families.mimo_v2_flash import FAMILY

    with pytest.raises(CheckpointError, match="attention_projection_layout"):
        FAMILY.runs(json.loads(MIMO.read_text()))
    FAMILY.runs(json.loads((FIXTURES / "MiMo-V2-Flash.json").read_text()))  # Flash still runs


def test_mimo_v25_layer_pattern_must_be_0_or_1(tmp_path):
    hf = json.loads(MIMO.read_text())
    hf["hybrid_layer_pattern"][3] = 2
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(CheckpointError, match=r"hybrid_layer_pattern\[3\]"):
        read_model_config(tmp_path)


def test_loaded_remote_hunyuan_is_a_model(remote_hunyuan):
    """Loading the remote folder builds the family's stores (no experts missing from the per-expert names)."""
    model = load(remote_hunyuan[1])
    assert sum(p.numel() for p in model.parameters()) > 0
