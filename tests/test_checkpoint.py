"""Checkpoints: tiny random transformers models saved with save_pretrained, loaded by storelab.

Per family: logits on a random prompt agree within 1e-4 (fp32), greedy generation of 16 tokens
gives the same ids, and so does decoding with our per-layer states after a chunked prefill.
Then our own save/load round trip, sharding, meta-device loading, and the errors.
"""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from storelab.checkpoint import SUPPORTED, CheckpointError, load, save
from storelab.models.model import generate
from tests.helpers import assert_close

COMMON = dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
              bos_token_id=1, eos_token_id=2, pad_token_id=0)

# the tiny settings of shared/reference/oracles.md, per model_type
FAMILIES = {
    "mimo_v2_flash": dict(COMMON, intermediate_size=96, head_dim=24, v_head_dim=16, n_routed_experts=4,
                          num_experts_per_tok=2, moe_intermediate_size=32, sliding_window=9),
    "minimax_m3_vl_text": dict(COMMON, intermediate_size=32, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
                               dense_intermediate_size=96, shared_intermediate_size=32, index_n_heads=2,
                               index_head_dim=16, index_block_size=8, index_topk_blocks=2, index_local_blocks=1,
                               layer_types=["full_attention", "minimax_m3_sparse", "full_attention",
                                            "minimax_m3_sparse"],
                               mlp_layer_types=["dense", "sparse", "sparse", "sparse"]),
    "qwen3_next": dict(COMMON, intermediate_size=96, head_dim=16, num_experts=4, num_experts_per_tok=2,
                       moe_intermediate_size=32, shared_expert_intermediate_size=32, linear_conv_kernel_dim=4,
                       linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
                       linear_num_value_heads=4, mlp_only_layers=[1]),
    "qwen3_5_moe_text": dict(COMMON, head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                             shared_expert_intermediate_size=32, linear_conv_kernel_dim=4, linear_key_head_dim=16,
                             linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4),
    "qwen3_5_text": dict(COMMON, intermediate_size=96, head_dim=16, linear_conv_kernel_dim=4, linear_key_head_dim=16,
                         linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4),
    "kimi_linear": dict(COMMON, num_key_value_heads=4, intermediate_size=96, kv_lora_rank=16, q_lora_rank=None,
                        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, num_experts=4,
                        num_experts_per_token=2, moe_intermediate_size=32, num_shared_experts=1,
                        linear_attn_config=dict(head_dim=16, num_heads=4, short_conv_kernel_size=4,
                                                kda_layers=[1, 2, 3], full_attn_layers=[4])),
    # 8 index heads (oracles.md: 2): with 2, a score is exactly 0 (both ReLUs clipped) for a quarter of
    # the pairs, and which of the tied zeros torch.topk keeps differs between the two implementations
    "glm_moe_dsa": dict(COMMON, num_key_value_heads=4, intermediate_size=96, kv_lora_rank=16, q_lora_rank=24,
                        qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, index_topk=8, index_head_dim=16,
                        index_n_heads=8, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                        n_group=1, topk_group=1, first_k_dense_replace=1, index_topk_freq=2,
                        index_skip_topk_offset=2),
    "deepseek_v4": dict(COMMON, num_key_value_heads=1, head_dim=32, q_lora_rank=24, o_groups=2, o_lora_rank=16,
                        index_n_heads=8, index_head_dim=16, index_topk=4, sliding_window=8,
                        compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8},
                        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1, moe_intermediate_size=32,
                        hc_mult=2, hc_sinkhorn_iters=5),
}

PROMPT_LEN, NEW_TOKENS, CHUNK = 21, 16, 5


def tiny_hf(model_type: str, **overrides):
    """A tiny random transformers model. Tensors that start constant (norms at 0 or 1, biases, sinks,
    routing biases, DeepSeek-V4's pooling biases) are perturbed so that a wrong mapping shows in the
    logits, and DeepSeek-V4's hash table (zeros) gets distinct random experts per token."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(model_type, **{**FAMILIES[model_type], **overrides})
    hf = AutoModelForCausalLM.from_config(cfg).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, t in hf.state_dict().items():  # saved tensors only (not the rotary caches)
            if t.dtype.is_floating_point and (t.dim() == 1 or bool((t == t.flatten()[0]).all())):
                t.add_(0.1 * torch.randn(t.shape, generator=g))
            elif name.endswith("tid2eid"):
                E = hf.config.n_routed_experts
                t.copy_(torch.stack([torch.randperm(E, generator=g)[: t.shape[1]] for _ in range(t.shape[0])]))
    hf.generation_config.eos_token_id = None
    return hf


def prompt(vocab: int = 128) -> torch.Tensor:
    return torch.randint(3, vocab, (1, PROMPT_LEN), generator=torch.Generator().manual_seed(7))


_BUILT: dict = {}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """model_type -> (transformers model, folder it was saved to); each built once per module."""

    def get(model_type: str):
        if model_type not in _BUILT:
            hf = tiny_hf(model_type)
            d = tmp_path_factory.mktemp(model_type)
            hf.save_pretrained(d)
            _BUILT[model_type] = (hf, d)
        return _BUILT[model_type]

    yield get
    _BUILT.clear()


@pytest.fixture(scope="module")
def mimo_dir(saved):
    return saved("mimo_v2_flash")[1]


# ----------------------------------------------------------------------------- families
@pytest.mark.parametrize("model_type", list(FAMILIES))
def test_family_matches_transformers(model_type, saved, tmp_path):
    hf, folder = saved(model_type)
    ours = load(folder)
    ids = prompt()
    with torch.no_grad():
        ref = hf(ids).logits
        got, _ = ours(ids)
    assert_close(got, ref, atol=1e-4, what=f"{model_type} logits")
    ref_ids = hf.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False)[:, PROMPT_LEN:]
    got_ids, _ = generate(ours, ids, NEW_TOKENS)
    assert got_ids.tolist() == ref_ids.tolist(), f"{model_type}: greedy ids differ"
    chunked_ids, cache = generate(ours, ids, NEW_TOKENS, chunk=CHUNK)
    assert chunked_ids.tolist() == ref_ids.tolist(), f"{model_type}: chunked prefill + decode ids differ"
    assert len(cache) == ours.cfg.n_layers
    save(ours, tmp_path / "ours")  # our own format gives the same logits back
    with torch.no_grad():
        assert torch.equal(load(tmp_path / "ours")(ids)[0], got), f"{model_type}: logits after our save/load"


def test_supported_lists_every_family():
    import storelab

    for mt in [*FAMILIES, "qwen3_5_moe", "qwen3_5", "minimax_m3_vl", "storelab"]:
        assert mt in SUPPORTED
    from storelab.checkpoint import source

    # storelab.load takes any model argument (a repo id, a zoo name too) and hands folders to this load
    assert storelab.load is source.load and storelab.save is save


def test_tied_embeddings(tmp_path):
    hf = tiny_hf("mimo_v2_flash", tie_word_embeddings=True)
    hf.save_pretrained(tmp_path / "hf")
    ours = load(tmp_path / "hf")
    assert ours.lm_head.weight is ours.embed.weight
    ids = prompt()
    with torch.no_grad():
        assert_close(ours(ids)[0], hf(ids).logits, atol=1e-4, what="tied mimo logits")
    save(ours, tmp_path / "ours")
    assert "lm_head.weight" not in load_file(tmp_path / "ours" / "model.safetensors")
    back = load(tmp_path / "ours")
    assert back.lm_head.weight is back.embed.weight


# ----------------------------------------------------------------------------- our format
def test_save_writes_one_file_and_config(mimo_dir, tmp_path):
    model = load(mimo_dir)
    files = save(model, tmp_path / "ours")
    assert {f.name for f in files} == {"model.safetensors", "config.json"}
    cfg = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert cfg["model_type"] == "storelab" and len(cfg["model"]["layers"]) == 4
    with pytest.raises(ValueError, match="meta"):
        save(load(mimo_dir, device="meta"), tmp_path / "meta")


def test_adapters_survive_save(saved, tmp_path):
    hf, folder = saved("minimax_m3_vl_text")
    model = load(folder)
    save(model, tmp_path / "ours")
    cfg = json.loads((tmp_path / "ours" / "config.json").read_text())
    assert cfg["adapters"][0]["kind"] == "clamped_swiglu"
    back = load(tmp_path / "ours")
    ids = prompt()
    with torch.no_grad():
        assert_close(back(ids)[0], hf(ids).logits, atol=1e-4, what="minimax after our save")


def test_sharded_save_and_hf_shards(saved, mimo_dir, tmp_path):
    model = load(mimo_dir)
    files = save(model, tmp_path / "ours", max_shard_bytes=60_000)
    shards = [f for f in files if f.suffix == ".safetensors"]
    assert len(shards) > 2 and (tmp_path / "ours" / "model.safetensors.index.json").exists()
    ids = prompt()
    with torch.no_grad():
        assert torch.equal(load(tmp_path / "ours")(ids)[0], model(ids)[0])
    hf = saved("mimo_v2_flash")[0]
    hf.save_pretrained(tmp_path / "hf", max_shard_size="40KB")
    assert (tmp_path / "hf" / "model.safetensors.index.json").exists()
    with torch.no_grad():
        assert_close(load(tmp_path / "hf")(ids)[0], hf(ids).logits, atol=1e-4, what="HF shards")


def test_dtype_argument(mimo_dir):
    model = load(mimo_dir, dtype="bf16")
    assert model.embed.weight.dtype == torch.bfloat16
    with pytest.raises(CheckpointError, match="dtype"):
        load(mimo_dir, dtype="int7")


def test_meta_device_reads_no_weights(mimo_dir, monkeypatch):
    import storelab.checkpoint.shards as shards

    def no_read(*a, **k):
        raise AssertionError("a weight was read")

    monkeypatch.setattr(shards.Shards, "read", no_read)
    model = load(mimo_dir, device="meta")
    assert all(p.device.type == "meta" for p in model.parameters())
    from storelab.models.accounting import analytic_state_bytes  # accounting works on the config alone

    assert analytic_state_bytes(model.cfg, [64] * model.cfg.n_layers, dtype="bf16")


# ----------------------------------------------------------------------------- errors
def _rewrite(folder, edit):
    path = folder / "model.safetensors"
    tensors = load_file(path)
    edit(tensors)
    save_file(tensors, path, metadata={"format": "pt"})


def _copy(src, dst):
    import shutil

    shutil.copytree(src, dst)
    return dst


def test_truncated_shard(mimo_dir, tmp_path):
    d = _copy(mimo_dir, tmp_path / "c")
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match=r"model\.safetensors.*truncated"):
        load(d)


def test_wrong_dtype(mimo_dir, tmp_path):
    d = _copy(mimo_dir, tmp_path / "c")
    name = "model.layers.0.self_attn.q_proj.weight"
    _rewrite(d, lambda t: t.__setitem__(name, t[name].to(torch.int32)))
    with pytest.raises(CheckpointError, match=rf"{name}.*model\.safetensors.*dtype I32"):
        load(d)


def test_missing_tensor(mimo_dir, tmp_path):
    d = _copy(mimo_dir, tmp_path / "c")
    name = "model.layers.2.post_attention_layernorm.weight"
    _rewrite(d, lambda t: t.pop(name))
    with pytest.raises(CheckpointError, match=rf"missing tensor '{name}'.*blocks\.2\.norm_channel\.weight"):
        load(d)


def test_unexpected_and_misshaped_tensor(mimo_dir, tmp_path):
    d = _copy(mimo_dir, tmp_path / "c")
    _rewrite(d, lambda t: t.__setitem__("model.layers.0.extra.weight", torch.zeros(3)))
    with pytest.raises(CheckpointError,
                       match=r"unexpected tensor 'model\.layers\.0\.extra\.weight' in model\.safetensors"):
        load(d)
    d = _copy(mimo_dir, tmp_path / "s")
    name = "model.layers.1.self_attn.k_proj.weight"
    _rewrite(d, lambda t: t.__setitem__(name, t[name][:-1]))
    with pytest.raises(CheckpointError, match=rf"mis-shaped tensor '{name}' in model\.safetensors shape \[95, 64\]"):
        load(d)


def test_unknown_family(mimo_dir, tmp_path):
    d = _copy(mimo_dir, tmp_path / "c")
    cfg = json.loads((d / "config.json").read_text())
    cfg["model_type"] = "llama_9000"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"'llama_9000' is not supported \(supported: .*mimo_v2_flash"):
        load(d)


def test_not_a_checkpoint(tmp_path):
    with pytest.raises(CheckpointError, match="config.json"):
        load(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "mimo_v2_flash"}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80")
    with pytest.raises(CheckpointError, match="pickle files are never read"):
        load(tmp_path)


# ----------------------------------------------------------------------------- quantized, zoo, CLI
def _quantize_fp8(w: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    O, I = w.shape
    blocks = w.reshape(O // block, block, I // block, block)
    scale = blocks.abs().amax(dim=(1, 3)) / 448.0                       # [O/b, I/b]
    q = (blocks / scale[:, None, :, None]).reshape(O, I).to(torch.float8_e4m3fn)
    return q, scale


def test_fp8_block_quantized_weight(mimo_dir, tmp_path):
    d = _copy(mimo_dir, tmp_path / "c")
    name = "model.layers.0.self_attn.q_proj.weight"
    w = load_file(d / "model.safetensors")[name]
    q, scale = _quantize_fp8(w, 32)

    def edit(t):
        t[name], t[name + "_scale_inv"] = q, scale

    _rewrite(d, edit)
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "weight_block_size": [32, 32]}
    (d / "config.json").write_text(json.dumps(cfg))
    model = load(d)
    want = (q.float().reshape(3, 32, 2, 32) * scale[:, None, :, None]).reshape(96, 64)
    assert torch.equal(model.blocks[0].token.q_proj.weight, want)
    assert_close(model.blocks[0].token.q_proj.weight, w, atol=0.07 * w.abs().max().item(), what="fp8 round trip")
    _rewrite(d, lambda t: t.pop(name + "_scale_inv"))
    with pytest.raises(CheckpointError, match=rf"{name}.*F8_E4M3 but no scale tensor"):
        load(d)


@pytest.mark.parametrize("name", ["mimo-v2.6-pro", "kimi-k3", "qwen3.8", "glm-5.3", "deepseek-v4-pro",
                                  "minimax-m3"])  # deepseek-v4.1-flash: its tiny forward alone takes ~10 s
def test_zoo_models_round_trip(name, tmp_path):
    from storelab.models.model import Model
    from storelab.zoo import load_zoo

    cfg = load_zoo(name, tiny=True)
    torch.manual_seed(0)
    model = Model(cfg).eval()
    save(model, tmp_path)
    back = load(tmp_path)
    ids = torch.randint(0, cfg.vocab_size, (1, 12), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        assert torch.equal(back(ids)[0], model(ids)[0])


def test_save_command(tmp_path):
    from typer.testing import CliRunner

    from storelab.cli import app

    res = CliRunner().invoke(app, ["save", "minimax-m3", str(tmp_path / "m"), "--tiny", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert {f["name"] for f in out["files"]} == {"model.safetensors", "config.json"}
    assert load(tmp_path / "m").cfg.name == out["model"]
    res = CliRunner().invoke(app, ["save", str(tmp_path / "m"), str(tmp_path / "again"), "--checkpoint", "--json"])
    assert res.exit_code == 0, res.output
    res = CliRunner().invoke(app, ["save", str(tmp_path / "nothing"), str(tmp_path / "x"), "--checkpoint"])
    assert res.exit_code == 2 and "config.json" in res.output


# ----------------------------------------------------------------------------- configs as released
LEGACY = {  # keys transformers derives on load, replaced by what a released config.json says instead
    "mimo_v2_flash": ({"layer_types", "mlp_layer_types", "rope_parameters", "sliding_window"},
                      {"sliding_window_size": 8}),
    "qwen3_next": ({"layer_types"}, {"full_attention_interval": 4}),
    "glm_moe_dsa": ({"indexer_types"}, {"index_topk_pattern": "FFSF"}),
    "deepseek_v4": ({"layer_types", "mlp_layer_types", "compress_rates", "rope_parameters", "partial_rotary_factor"},
                    {"compress_rate_csa": 4, "compress_rate_hca": 8, "qk_rope_head_dim": 4, "num_hash_layers": 3}),
}


@pytest.mark.parametrize("model_type", list(LEGACY))
def test_released_config_keys(model_type, saved):
    from storelab.checkpoint.families import family_for

    folder = saved(model_type)[1]
    hf = json.loads((folder / "config.json").read_text())
    drop, add = LEGACY[model_type]
    released = {**{k: v for k, v in hf.items() if k not in drop}, **add}
    fam = family_for(hf)
    assert fam.to_config(released) == fam.to_config(hf)


@pytest.mark.parametrize("model_type,vl_type,vision", [
    ("minimax_m3_vl_text", "minimax_m3_vl", "model.vision_tower.blocks.0.weight"),
    ("qwen3_5_moe_text", "qwen3_5_moe", "model.visual.blocks.0.weight"),
    ("qwen3_5_text", "qwen3_5", "model.visual.blocks.0.weight"),
])
def test_vision_language_checkpoint_text_part(model_type, vl_type, vision, saved, tmp_path):
    """A VL checkpoint: the text config under ``text_config``, the text weights under
    ``model.language_model.``, a vision tower beside them (ignored)."""
    hf, folder = saved(model_type)
    text = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({"model_type": vl_type, "text_config": text}))
    tensors = {(k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k): v
               for k, v in load_file(folder / "model.safetensors").items()}
    tensors[vision] = torch.zeros(2, 2)
    save_file(tensors, tmp_path / "model.safetensors", metadata={"format": "pt"})
    ids = prompt()
    with torch.no_grad():
        assert_close(load(tmp_path)(ids)[0], hf(ids).logits, atol=1e-4, what=f"{vl_type} text part")


def test_minimax_release_layout(saved, tmp_path):
    """MiniMax-M3 as released (the names transformers' conversion mapping for minimax_m3_vl reads):
    ``language_model.model.`` prefix, ``block_sparse_moe`` with per-expert w1/w3/w2 and a bare
    ``e_score_correction_bias``, ``index_*`` projections, unfused gate/up MLPs."""
    hf, folder = saved("minimax_m3_vl_text")
    text = json.loads((folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "minimax_m3_vl", "text_config": text}))
    out = {}
    for k, v in load_file(folder / "model.safetensors").items():
        k = k.replace("model.", "language_model.model.", 1).replace("lm_head", "language_model.lm_head")
        k = k.replace(".self_attn.indexer.", ".self_attn.index_")
        if k.endswith("experts.gate_up_proj"):
            base = k.replace(".mlp.experts.gate_up_proj", ".block_sparse_moe.experts")
            for e, w in enumerate(v):
                out[f"{base}.{e}.w1.weight"], out[f"{base}.{e}.w3.weight"] = w.chunk(2, 0)
        elif k.endswith("experts.down_proj"):
            base = k.replace(".mlp.experts.down_proj", ".block_sparse_moe.experts")
            out.update({f"{base}.{e}.w2.weight": w for e, w in enumerate(v)})
        elif k.endswith("gate_up_proj.weight"):
            g, u = v.chunk(2, 0)
            stem = k[: -len("gate_up_proj.weight")].replace(".mlp.shared_experts.", ".block_sparse_moe.shared_experts.")
            out[stem + "gate_proj.weight"], out[stem + "up_proj.weight"] = g, u
        elif ".mlp.gate." in k or ".mlp.shared_experts." in k:
            out[k.replace(".mlp.gate.e_score", ".block_sparse_moe.e_score").replace(".mlp.", ".block_sparse_moe.")] = v
        else:
            out[k] = v
    assert any(".index_q_proj." in k for k in out) and any(".w3." in k for k in out)
    save_file(out, tmp_path / "model.safetensors", metadata={"format": "pt"})
    ids = prompt()
    with torch.no_grad():
        assert_close(load(tmp_path)(ids)[0], hf(ids).logits, atol=1e-4, what="MiniMax release layout")


def test_deepseek_v4_release_layout(saved, tmp_path):
    """DeepSeek-V4 as released: no ``model.`` prefix, ``embed``/``head``, ``hc_head_*``, an MTP layer."""
    hf, folder = saved("deepseek_v4")
    (tmp_path / "config.json").write_text((folder / "config.json").read_text())
    out = {}
    for k, v in load_file(folder / "model.safetensors").items():
        k = k.removeprefix("model.").replace("embed_tokens.", "embed.").replace("hc_head.hc_", "hc_head_")
        out[k] = v
    out["mtp.0.emb.weight"] = torch.zeros(2)
    out["layers.4.attn_norm.weight"] = torch.zeros(2)  # the MTP block numbered after the last layer
    save_file(out, tmp_path / "model.safetensors", metadata={"format": "pt"})
    ids = prompt()
    with torch.no_grad():
        assert_close(load(tmp_path)(ids)[0], hf(ids).logits, atol=1e-4, what="DeepSeek-V4 release layout")


@pytest.mark.parametrize("model_type,change,match", [
    ("glm_moe_dsa", {"n_group": 3, "topk_group": 1}, r"n_group: must be >= 1 and divide n_experts"),
    ("deepseek_v4", {"layer_types": ["full_attention"] * 4}, r"layer_types\[0\]: 'full_attention'"),
    ("mimo_v2_flash", {"rope_parameters": {"full_attention": {"rope_type": "yarn", "factor": 4.0},
                                           "sliding_attention": {"rope_type": "default"}}},
     r"rope_parameters.full_attention.rope_type: 'yarn' is not supported"),
])
def test_unsupported_settings_are_named(model_type, change, match, saved, tmp_path):
    folder = saved(model_type)[1]
    d = _copy(folder, tmp_path / "c")
    cfg = {**json.loads((d / "config.json").read_text()), **change}
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=match):
        load(d)


def test_fp4_packed_expert_weight(mimo_dir, tmp_path):
    """DeepSeek-V4's expert format: int8 bytes holding two e2m1 codes, one power-of-two scale
    (an exponent byte) per 32 values of a row."""
    d = _copy(mimo_dir, tmp_path / "c")
    name = "model.layers.1.mlp.experts.0.gate_proj.weight"                  # [32, 64]
    g = torch.Generator().manual_seed(5)
    codes = torch.randint(0, 16, (32, 64), generator=g)
    exps = torch.randint(120, 130, (32, 2), generator=g, dtype=torch.uint8)
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8).view(torch.int8)
    lut = torch.tensor([0, .5, 1, 1.5, 2, 3, 4, 6, -0., -.5, -1, -1.5, -2, -3, -4, -6])
    want = lut[codes] * (2.0 ** (exps.float() - 127)).repeat_interleave(32, dim=1)

    def edit(t):
        t[name], t[name + "_scale_inv"] = packed, exps

    _rewrite(d, edit)
    model = load(d)
    assert torch.equal(model.blocks[1].channel.gate_up[0, :32], want)


def test_generate_command_with_checkpoint(saved):
    """``storelab generate --checkpoint``: the transformers model's greedy ids on the command's prompt."""
    from typer.testing import CliRunner

    from storelab.cli import app

    hf, folder = saved("mimo_v2_flash")
    res = CliRunner().invoke(app, ["generate", "--checkpoint", str(folder), "--prompt-len", "12", "--new-tokens", "6",
                                   "--chunk", "5", "--seed", "3", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    prompt_ids = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(3))  # the command's prompt
    # (an explicit mask: the prompt may hold the pad id 0, which generate would otherwise mask out)
    want = hf.generate(prompt_ids, attention_mask=torch.ones_like(prompt_ids), max_new_tokens=6,
                       do_sample=False)[0, 12:].tolist()
    assert out["tokens"] == want
    assert all(s["measured_bytes"] == s["analytic_bytes"] for s in out["state"])
