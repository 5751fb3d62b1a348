"""The essay's models read as their publishers ship them: the released config.json files in
tests/fixtures/configs (copied verbatim; SOURCES.md says from where) through
``read_model_config`` and the CLI (``storelab models / memory --checkpoint FILE --json``).

Parameter counts are compared with the publishers' figures: the essay's table as
shared/reference/models.md gives it (within 3 %, the zoo's tolerance), and, where a public
report lists the released weights' shapes (the same source as the config), with the count of
those weights, which the accounting must reproduce to the parameter or explain.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from storelab.checkpoint.config_only import read_hf_config, read_model_config
from storelab.cli import app
from storelab.models.accounting import count_params
from storelab.zoo import load_zoo

CONFIGS = Path(__file__).resolve().parent / "fixtures" / "configs"
PUBLISHED = ["Kimi-K3", "MiniMax-M3", "DeepSeek-V4-Flash", "DeepSeek-V4-Pro"]
TOLERANCE = 0.03  # as tests/test_accounting.py and the zoo's notes hold the seven to their figures

# The essay's table (shared/reference/models.md): stored and active parameters.
ESSAY = {"Kimi-K3": (2.8e12, 104e9), "MiniMax-M3": (428e9, 23e9), "DeepSeek-V4-Pro": (1.6e12, 49e9)}


def _read(name: str):
    return read_model_config(CONFIGS / f"{name}.json")


@pytest.mark.parametrize("name", PUBLISHED)
def test_the_published_config_reads(name):
    cfg = _read(name)
    assert cfg.name == name and cfg.n_layers == json.loads((CONFIGS / f"{name}.json").read_text()).get(
        "num_hidden_layers", cfg.n_layers)
    assert count_params(cfg).stored > 1e11


@pytest.mark.parametrize("name", PUBLISHED)
@pytest.mark.parametrize("command", ["models", "memory"])
def test_the_cli_reads_the_published_config(name, command):
    r = CliRunner().invoke(app, [command, "--checkpoint", str(CONFIGS / f"{name}.json"), "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    rows = data["models"] if isinstance(data, dict) else data   # memory's document keeps its rows under "models"
    assert {row.get("name") or row.get("model") for row in rows} == {name}


@pytest.mark.parametrize("name", sorted(ESSAY))
def test_parameters_against_the_essay(name):
    cfg = _read(name)
    pa = count_params(cfg)
    stored, active = ESSAY[name]
    assert abs(pa.stored / stored - 1) < TOLERANCE, f"{name}: stored {pa.stored / 1e9:.1f}B vs {stored / 1e9:.0f}B"
    # MiniMax's 23B leaves the embedding and LM head out (the zoo file's note); the others count them
    ours = pa.active - (pa.by_part["embedding"] + pa.by_part["lm_head"] if name == "MiniMax-M3" else 0)
    assert abs(ours / active - 1) < TOLERANCE, f"{name}: active {ours / 1e9:.1f}B vs {active / 1e9:.0f}B"


# -- the released weights, as the report beside each config lists them (gogongxt/python, SOURCES.md) -----
def test_minimax_m3_counts_the_released_weights_exactly():
    """The report counts 427,040,140,160 numbers in MiniMax-M3's weights (all bf16/fp32, none packed): the
    text model we build plus the vision part we count apart (its shapes below, from the same report)."""
    from storelab.checkpoint.families.minimax_m3_vl import vision_params

    hf, _ = read_hf_config(CONFIGS / "MiniMax-M3.json")
    H, I = 1280, 5120
    layer = 4 * (H * H + H) + (I * H + I) + (H * I + H) + 4 * H   # q/k/v/out_proj, fc1, fc2, two LayerNorms
    shapes = 32 * layer + H * 3 * 2 * 14 * 14 + 2 * H             # 32 layers, patch_embedding, pre_layrnorm
    shapes += 6144 * 1280 + 6144 + 6144 * 6144 + 6144             # multi_modal_projector.linear_1, linear_2
    shapes += 6144 * 24576 + 6144 + 6144 * 6144 + 6144            # patch_merge_mlp.linear_1, linear_2
    assert vision_params(hf) == shapes
    assert count_params(_read("MiniMax-M3")).stored + shapes == 427_040_140_160
    assert f"{shapes:,}" in _read("MiniMax-M3").notes


def test_kimi_k3_counts_the_released_weights():
    """The report counts 1,503,647,073,024 numbers in Kimi K3's weights, with the routed experts in MXFP4:
    two weights per uint8 (w1, w3 [3072, 1792], w2 [3584, 1536]) plus one uint8 scale per 32 ([3072, 112],
    [3584, 96]), in 92 layers of 896 experts. Unpacked, less the vision part, that is the text model."""
    from storelab.checkpoint.families.kimi_linear import vision_params

    hf, _ = read_hf_config(CONFIGS / "Kimi-K3.json")
    block = 4608 * 1024 + 1024 * 1536 + 4096 * 1024 + 1024 * 4096 + 2 * 1024   # wqkv, wo, fc0, fc1, norm0/1
    vision = 27 * block + 1024 + 64 * 64 * 1024 + 1024 * 3 * 14 * 14              # final norm, pos_emb, patch
    vision += 4096 * 4096 + 7168 * 4096 + 7168                                     # mm_projector proj.0, .2, norm
    assert vision_params(hf) == vision
    experts = 92 * 896
    packed, scales = 2 * 3072 * 1792 + 3584 * 1536, 2 * 3072 * 112 + 3584 * 96
    text = 1_503_647_073_024 + experts * (packed - scales) - vision
    ours = count_params(_read("Kimi-K3")).stored
    # 16,544 short: the released A_log is [128] per KDA layer (ours [96], one per head: 69 x 32) and the
    # first sublayer's AttnRes query and norm exist in the weights (ours has none: one source, 2 x 7168)
    assert text - ours == 69 * 32 + 2 * 7168


def test_kimi_k3_reads_its_published_fields():
    cfg = _read("Kimi-K3")
    kinds = [lay.token.KIND for lay in cfg.layers]
    assert [i + 1 for i, k in enumerate(kinds) if k == "mla"] == [*range(4, 93, 4), 93]
    kda, mla, moe = cfg.layers[0].token, cfg.layers[3].token, cfg.layers[1].channel
    assert (kda.n_heads, kda.head_k_dim, kda.gate_rank, kda.gate_lower_bound, kda.full_rank_output_gate) == (
        96, 128, 128, -5.0, True)
    assert (mla.use_rope, mla.output_gate, mla.q_lora_rank, mla.kv_lora_rank) == (False, True, 1536, 512)
    assert (moe.n_experts, moe.top_k, moe.latent_dim, moe.n_shared, moe.d_expert) == (896, 16, 3584, 2, 3072)
    assert cfg.layers[0].depth.KIND == "attnres" and cfg.layers[0].depth.group_size == 12
    assert cfg.layers[0].channel.d_ff == 33792 and cfg.context == 1_048_576


def test_kimi_k3_running_is_refused_by_name():
    """SiTU-GLU has no storelab activation: the config is read for accounting, the weights are not loaded."""
    from storelab.checkpoint.families import family_for
    from storelab.checkpoint.shards import CheckpointError

    hf, _ = read_hf_config(CONFIGS / "Kimi-K3.json")
    fam = family_for(hf)
    fam.to_config(hf)  # accounted
    with pytest.raises(CheckpointError, match="hidden_act: 'situ'"):
        fam.runs(hf)


@pytest.mark.parametrize("name", ["DeepSeek-V4-Flash", "DeepSeek-V4-Pro"])
def test_v4_releases_yarn_is_accounted_and_refused_for_running(name):
    """The releases put YaRN on the compressed layers' RoPE (rope_scaling); storelab's compressed stores run
    plain RoPE: the config is accounted, and loading it to run is refused naming the field."""
    from storelab.checkpoint.families import family_for
    from storelab.checkpoint.shards import CheckpointError

    hf, _ = read_hf_config(CONFIGS / f"{name}.json")
    fam = family_for(hf)
    assert fam.to_config(hf).layers[-1].token.rope_theta == hf["compress_rope_theta"]
    with pytest.raises(CheckpointError, match="rope_scaling.type: 'yarn' is not supported"):
        fam.runs(hf)
    plain = {k: v for k, v in hf.items() if k != "rope_scaling"}
    fam.runs(plain)
    assert fam.to_config(plain) == fam.to_config(hf)


def test_kda_full_rank_output_gate_is_the_low_rank_one_at_full_rank():
    """Kimi K3's g_proj: with W_g = W_gb W_ga the store gives the low-rank store's output exactly."""
    from storelab.stores.recurrent import KDAConfig

    kw = dict(d_model=16, n_heads=2, head_k_dim=4, chunk_size=4, gate_rank=4)
    low, full = KDAConfig(**kw), KDAConfig(**kw, full_rank_output_gate=True)
    torch.manual_seed(0)
    a, b = low.build().double(), full.build().double()
    state = {k: v for k, v in a.state_dict().items() if not k.startswith("g_")}
    state["g_proj.weight"] = a.g_b_proj.weight @ a.g_a_proj.weight
    b.load_state_dict(state)
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    with torch.no_grad():
        assert torch.allclose(a(x)[0], b(x)[0], atol=1e-12)
    for cfg, m in ((low, a), (full, b)):
        assert cfg.num_params().stored == sum(p.numel() for p in m.parameters())
    assert full.num_params().stored - low.num_params().stored == 16 * 8 - (16 * 4 + 4 * 8)


def test_minimax_m3_text_config_reads_like_the_wrapper():
    """A text-only ``minimax_m3`` config (the wrapper's text fields at the top level) is the same model."""
    hf, _ = read_hf_config(CONFIGS / "MiniMax-M3.json")
    from storelab.checkpoint.families import family_for

    text = {**hf["text_config"], "model_type": "minimax_m3"}
    fam = family_for(text)
    assert fam.to_config(text).layers == _read("MiniMax-M3").layers
    nested = {"model_type": "minimax_m3", "text_config": hf["text_config"]}
    assert fam.to_config(nested).layers == _read("MiniMax-M3").layers


def test_v4_pro_agrees_with_the_zoo():
    """The zoo's hand-written DeepSeek-V4-Pro counts what its published config says."""
    ours, theirs = count_params(_read("DeepSeek-V4-Pro")), count_params(load_zoo("deepseek-v4-pro"))
    assert (ours.stored, ours.active) == (theirs.stored, theirs.active)


def test_minimax_m3_reads_the_released_flat_rope_fields():
    """The release gives rope_theta 5e6 and partial_rotary_factor 0.5 (rotary_dim 64) as flat fields."""
    for lay in _read("MiniMax-M3").layers:
        assert (lay.token.rope_theta, lay.token.partial_rotary, lay.token.head_dim) == (5e6, 0.5, 128)


def test_deepseek_v4_flash_window_only_layers():
    """V4-Flash's compress_ratios: 0 on layers 0 and 1 (window only), then 4 / 128 alternating; the
    44th entry is the MTP layer's. Window-only layers use the plain "main" RoPE (rope_theta 10000), the
    compressed ones compress_rope_theta 160000; a window-only layer is an HCA layer less its compressor."""
    cfg = _read("DeepSeek-V4-Flash")
    kinds = [lay.token.KIND for lay in cfg.layers]
    assert kinds[:2] == ["v4_window"] * 2 and kinds[2:] == ["csa", "hca"] * 20 + ["csa"]
    win, hca = cfg.layers[0].token, cfg.layers[3].token
    assert (win.rope_theta, hca.rope_theta, win.window, win.n_heads, win.o_groups) == (10000, 160000, 128, 64, 8)
    compressor = 2 * 4096 * hca.head_dim + hca.pool * hca.head_dim + hca.head_dim   # wkv, wgate, ape, norm
    assert hca.num_params().stored - win.num_params().stored == compressor
    terms = win.memory_terms(cache="fp8")
    assert terms.per_token == 0 and terms.per_sequence == 128 * 584


def _v4_release_names(hf: dict) -> set[str]:
    """The tensor names of a DeepSeek-V4 release, as the weight reports list them (SOURCES.md): no
    ``model.`` prefix, ``attn.kv_norm``, a compressor on compressed layers only (none where the ratio is 0),
    an indexer on ratio-4 layers, a hash table in the first ``num_hash_layers`` and a routing bias after."""
    names = {"embed.weight", "head.weight", "norm.weight", "hc_head_base", "hc_head_fn", "hc_head_scale"}
    for i, ratio in enumerate(hf["compress_ratios"][:hf["num_hidden_layers"]]):
        L = f"layers.{i}"
        names |= {f"{L}.{n}" for n in ("attn.attn_sink", "attn.kv_norm.weight", "attn.q_norm.weight",
                                       "attn.wkv.weight", "attn.wo_a.weight", "attn.wo_b.weight", "attn.wq_a.weight",
                                       "attn.wq_b.weight", "attn_norm.weight", "ffn_norm.weight", "ffn.gate.weight",
                                       *(f"hc_{s}_{p}" for s in ("attn", "ffn") for p in ("base", "fn", "scale")),
                                       *(f"ffn.shared_experts.w{j}.weight" for j in (1, 2, 3)))}
        names |= {f"{L}.ffn.experts.{e}.w{j}.weight" for e in range(hf["n_routed_experts"]) for j in (1, 2, 3)}
        names.add(f"{L}.ffn.gate.tid2eid" if i < hf["num_hash_layers"] else f"{L}.ffn.gate.bias")
        compressors = ["attn.compressor"] * (ratio > 0) + ["attn.indexer.compressor"] * (ratio == 4)
        names |= {f"{L}.{c}.{n}" for c in compressors for n in ("ape", "norm.weight", "wgate.weight", "wkv.weight")}
        if ratio == 4:
            names |= {f"{L}.attn.indexer.weights_proj.weight", f"{L}.attn.indexer.wq_b.weight"}
    return names


@pytest.mark.parametrize("name", ["DeepSeek-V4-Flash", "DeepSeek-V4-Pro"])
def test_the_v4_table_names_only_released_tensors(name):
    """Every tensor our model of a published V4 config needs comes from a tensor its release has."""
    from storelab.checkpoint.families import family_for

    hf, _ = read_hf_config(CONFIGS / f"{name}.json")
    names = _v4_release_names(hf)
    fam = family_for(hf)
    tab = fam.table(hf, fam.to_config(hf), names)
    missing = sorted({n for src in tab.values() for n in src.names} - names)
    assert not missing, missing[:5]
    layer0_pools = any(k.startswith("blocks.0.token.pooler.") for k in tab)
    assert layer0_pools == (name == "DeepSeek-V4-Pro")  # V4-Pro's layer 0 is HCA; V4-Flash's is window-only
