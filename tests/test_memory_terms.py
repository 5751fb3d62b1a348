"""Memory from a real checkpoint's config.json, in two terms, against the engines' published figures.

The config files are written here from public sizes (nothing is downloaded, no weights exist):

* llama.cpp's log for Qwen3.6-27B (Qwen3.5-27B's architecture: 64 layers, every 4th full attention
  with 4 KV heads of 256, the other 48 Gated DeltaNet with 16 key and 48 value heads of 128, conv 4):
  16,384 MiB of f16 KV for 262,144 cells; 598.5 MiB of fp32 recurrent state for 4 sequences.
* vLLM's DeepSeek-V4-Pro: 9.62 GiB per sequence at 2^20 tokens in bf16.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from storelab.cli import app
from storelab.models.memory_terms import GIB, MIB, longest_contexts, parse_size

QWEN36_TEXT = {"model_type": "qwen3_5_text", "hidden_size": 5120, "num_hidden_layers": 64,
               "num_attention_heads": 24, "num_key_value_heads": 4, "head_dim": 256, "intermediate_size": 17408,
               "vocab_size": 248320, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
               "linear_key_head_dim": 128, "linear_value_head_dim": 128, "linear_conv_kernel_dim": 4,
               "full_attention_interval": 4, "max_position_embeddings": 262144,
               "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25,
                                   "mrope_section": [11, 11, 10], "mrope_interleaved": True}}
V4_PRO = {"model_type": "deepseek_v4", "num_hidden_layers": 61, "hidden_size": 7168, "vocab_size": 129280,
          "num_attention_heads": 128, "num_key_value_heads": 1, "head_dim": 512, "qk_rope_head_dim": 64,
          "q_lora_rank": 1536, "o_groups": 16, "o_lora_rank": 1024, "sliding_window": 128,
          "index_n_heads": 64, "index_head_dim": 128, "index_topk": 1024,
          "compress_ratios": [128, 128] + [4 if i % 2 == 0 else 128 for i in range(2, 61)],
          "n_routed_experts": 384, "num_experts_per_tok": 6, "moe_intermediate_size": 3072, "num_hash_layers": 3,
          "routed_scaling_factor": 2.5, "hc_mult": 4, "hc_sinkhorn_iters": 20, "max_position_embeddings": 1 << 20}


def write(folder, cfg: dict):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def run(*args: str, ok: bool = True):
    r = CliRunner().invoke(app, list(args), env={"COLUMNS": "80"})
    if ok:
        assert r.exit_code == 0, r.output
    return r


def memory_json(*args: str) -> list[dict]:
    """The records of ``storelab memory --json`` (docs/memory.schema.json), one per model."""
    doc = json.loads(run("memory", *args, "--json").stdout)
    assert doc["schema_version"] == 3
    return doc["models"]


@pytest.fixture
def qwen36(tmp_path):
    """Qwen3.6-27B as its multimodal wrapper writes it (the text model under ``text_config``)."""
    return write(tmp_path / "Qwen3.6-27B", {"model_type": "qwen3_5", "tie_word_embeddings": False,
                                            "text_config": QWEN36_TEXT})


def test_qwen36_27b_matches_llama_cpp_log(qwen36):
    (rec,) = memory_json("--checkpoint", str(qwen36), "--cache-dtype", "f16", "--context", "262144", "--batch", "4")
    tot = rec["total"]
    assert rec["batch"] == 4
    assert tot["bytes_per_token"] * 262144 == 16384 * MIB                 # llama.cpp: KV f16, 262,144 cells
    assert tot["bytes_per_sequence"] == 149.625 * MIB                     # fp32 R + S per sequence
    assert 4 * tot["bytes_per_sequence"] == 598.5 * MIB                   # 4 sequences
    assert tot["total_bytes"] == 4 * 16384 * MIB + 598.5 * MIB
    rows = rec["layers"]
    att = [r for r in rows if r["kind"] == "attention"]
    gdn = [r for r in rows if r["kind"] == "gated_deltanet"]
    assert [r["layer"] for r in att] == list(range(3, 64, 4)) and len(gdn) == 48
    assert all(r["bytes_per_token"] == 4 * 256 * 2 * 2 and r["bytes_per_sequence"] == 0 for r in att)
    assert all(r["bytes_per_token"] == 0 and r["token_format"] == "fp32" for r in gdn)


def test_config_json_file_and_text_layout_agree(qwen36, tmp_path):
    text = write(tmp_path / "text", QWEN36_TEXT)
    a = memory_json("--checkpoint", str(qwen36 / "config.json"), "--context", "1000")[0]["total"]
    b = memory_json("--checkpoint", str(text), "--context", "1000")[0]["total"]
    assert (a["bytes_per_token"], a["bytes_per_sequence"]) == (b["bytes_per_token"], b["bytes_per_sequence"])
    assert a["bytes_per_token"] == 16 * 4 * 256 * 2 * 2                  # bf16 with no flags


def test_state_dtype_and_llama_cpp_block_formats(qwen36):
    base = ("--checkpoint", str(qwen36), "--context", "4096")
    bf16 = memory_json(*base, "--state-dtype", "bf16")[0]["total"]
    assert bf16["bytes_per_sequence"] == 149.625 * MIB / 2
    per_token = {f: memory_json(*base, "--cache-dtype", f)[0]["total"]["bytes_per_token"] for f in ("f32", "q8_0", "q4_0", "fp8")}
    kv = 16 * 4 * 256 * 2                                                  # numbers per token
    assert per_token == {"f32": 4 * kv, "q8_0": kv / 32 * 34, "q4_0": kv / 32 * 18, "fp8": kv}


def test_qwen36_readable_at_80_columns(qwen36):
    r = run("memory", "--checkpoint", str(qwen36), "--cache-dtype", "f16", "--context", "262144", "--batch", "4")
    lines = r.stdout.splitlines()
    assert max(len(x) for x in lines) <= 80
    text = r.stdout
    assert "48 of 64: all but every 4th" in text and "16 of 64: every 4th" in text
    assert "149.625 MiB" in text and "598.5 MiB" in text and "64 GiB (65,536 MiB)" in text


def test_deepseek_v4_pro_matches_vllm(tmp_path):
    folder = write(tmp_path / "DeepSeek-V4-Pro", V4_PRO)
    tot = memory_json("--checkpoint", str(folder), "--cache-dtype", "bf16", "--context", str(1 << 20))[0]["total"]
    # 30 CSA layers: a 1,024-byte entry and a 256-byte index key per 4 tokens; 31 HCA: 1,024 per 128
    assert tot["bytes_per_token"] == 30 * (1024 + 256) / 4 + 31 * 1024 / 128
    assert round(tot["bytes_per_token"] * (1 << 20) / GIB, 2) == 9.62      # vLLM: 9.62 GiB per sequence
    # fixed: the 61 window rings of 128 entries, and the compressors' open pools (fp32, at their fullest)
    assert tot["bytes_per_sequence"] > 61 * 128 * 1024
    assert abs(tot["total_bytes"] / GIB - 9.62) / 9.62 < 0.003


def test_zoo_models_default_to_published_formats():
    flash = memory_json("deepseek-v4.1-flash", "--context", "1000000")[0]
    assert flash["cache_format"] == "published" and flash["total"]["cache_bytes_per_token"] == 890   # no flags
    pro = memory_json("deepseek-v4-pro", "--context", "1000000")[0]["total"]
    assert pro["cache_bytes_per_token"] == 30 * 584 / 4 + 31 * 584 / 128                 # fp8 mixed entries
    assert pro["bytes_per_token"] == pro["cache_bytes_per_token"] + 30 * 132 / 4         # fp8 index keys


def test_budget_gives_the_longest_context_per_batch(qwen36):
    (rec,) = memory_json("--checkpoint", str(qwen36), "--budget", "24GiB", "--weights-dtype", "q4_0",
                         "--cache-dtype", "f16")
    tot, bud = rec["total"], rec["budget"]
    room = 24 * GIB - bud["weights_bytes"]
    assert bud["weights_bytes"] == pytest.approx(bud["stored_params"] * 18 / 32, abs=1)
    for f in bud["longest_context"]:
        b, L = f["batch"], f["context"]
        if f["fits"]:
            assert b * (tot["bytes_per_token"] * L + tot["bytes_per_sequence_full"]) <= room
            assert b * (tot["bytes_per_token"] * (L + 1) + tot["bytes_per_sequence_full"]) > room
    assert longest_contexts(0, 10, budget=100, weights=50, batches=[1])[0]["context"] is None   # nothing grows
    assert longest_contexts(5, 10, budget=100, weights=200, batches=[1])[0]["fits"] is False


def test_models_checkpoint_counts_parameters(qwen36):
    recs = json.loads(run("models", "--checkpoint", str(qwen36), "--json").stdout)
    (p,) = [r["params"] for r in recs]
    emb = 248320 * 5120
    assert p["stored"] == p["active"] and p["active"] - p["active_without_embedding"] == 2 * emb
    assert 26.5e9 < p["stored"] < 27.5e9
    assert "embedding and the LM head" in run("models", "--checkpoint", str(qwen36)).stdout


@pytest.mark.parametrize("args,match", [
    (["--cache-dtype", "int3"], "cache dtype: unknown 'int3'"),
    (["--state-dtype", "fp8"], "state dtype: unknown 'fp8'"),
    (["--budget", "24 GiBs"], "budget: cannot read '24 GiBs'"),
    (["--budget", "-3GB"], "budget"),
    (["--batch", "0"], "batch: must be > 0"),
])
def test_bad_options_are_named(qwen36, args, match):
    r = run("memory", "--checkpoint", str(qwen36), *args, ok=False)
    assert r.exit_code == 2 and match in r.output, r.output


def test_checkpoint_errors_are_named(tmp_path):
    r = run("memory", "--checkpoint", str(tmp_path / "nothing"), ok=False)
    assert r.exit_code == 2 and "no such folder or file" in r.output
    bad = write(tmp_path / "odd", {"model_type": "gpt_lol"})
    r = run("memory", "--checkpoint", str(bad), ok=False)
    assert r.exit_code == 2 and "model_type 'gpt_lol' is not supported" in r.output


def test_plot_reports_only_what_it_wrote(tmp_path):
    r = run("memory", "qwen3.8", "--plot", "--out", str(tmp_path / "figure"))
    assert (tmp_path / "figure.png").is_file() and (tmp_path / "figure.json").is_file()
    assert f"wrote {tmp_path / 'figure.png'}" in r.stdout.replace("\n", "")
    r = run("memory", "qwen3.8", "--plot", "--out", str(tmp_path / "figure.txt"), ok=False)
    assert r.exit_code == 2 and "'.txt'" in r.output and not (tmp_path / "figure.txt").exists()


def test_parse_size():
    assert parse_size("24GiB") == 24 * GIB == parse_size("24 g") and parse_size("80GB") == 80 * 10**9
    assert parse_size("512MiB") == 512 * MIB and parse_size("4096") == 4096


# -- the stores' side: arguments checked, two terms agreeing with the footprint ---------------------
def _zoo_stores():
    from storelab.zoo import load_zoo, zoo_names

    seen = {}
    for n in zoo_names():
        for lay in load_zoo(n).layers:
            for st in [*lay.stores().values(), lay.depth]:
                seen.setdefault((st.KIND, repr(st)), st)
    return list(seen.values())


def test_footprint_checks_its_arguments():
    kinds = set()
    for st in _zoo_stores():
        kinds.add(st.KIND)
        with pytest.raises(ValueError, match=r"context: must be a whole number of tokens >= 0, got -5"):
            st.footprint(-5)
        with pytest.raises(ValueError, match=r"dtype: unknown entry format 'int3' .*accepted: fp32, bf16"):
            st.footprint(10, dtype="int3")
    assert {"attention", "window", "gated_deltanet", "kda", "csa", "hca", "mla", "dsa", "msa", "moe"} <= kinds


def test_terms_agree_with_the_footprint():
    """Per token: the footprint's growth past every window; at L the two terms hold at least the
    footprint (the open pools are counted at their fullest), exactly so for every store without one."""
    L = 3 << 20
    for st in _zoo_stores():
        for fmt in ("fp32", "bf16", "q8_0"):
            t = st.memory_terms(cache=fmt, state="fp32" if fmt == "fp32" else "bf16")
            a, b = st.footprint(L, dtype=fmt).state_bytes, st.footprint(2 * L, dtype=fmt).state_bytes
            assert t.per_token == pytest.approx((b - a) / L, rel=1e-12), (st.KIND, fmt)
            if fmt == "fp32":
                pools = st.KIND in ("csa", "hca")
                assert t.at(L) >= a if pools else t.at(L) == pytest.approx(a, rel=1e-12), (st.KIND, t, a)
    with pytest.raises(ValueError, match="state dtype: unknown 'fp8'"):
        _zoo_stores()[0].memory_terms(state="fp8")


def _family_types():
    from tests.test_checkpoint import FAMILIES

    return list(FAMILIES)


@pytest.mark.parametrize("model_type", _family_types())
def test_every_family_from_its_config_alone(model_type, tmp_path):
    """transformers writes the tiny config.json (no model, no weights); ``memory --checkpoint`` reads it
    through the family's own translation, the one ``load`` uses."""
    from transformers import AutoConfig

    from storelab.checkpoint import CheckpointError, load, read_model_config
    from storelab.checkpoint.families import family_for
    from tests.test_checkpoint import FAMILIES

    AutoConfig.for_model(model_type, **FAMILIES[model_type]).save_pretrained(tmp_path)
    hf = json.loads((tmp_path / "config.json").read_text())
    cfg = read_model_config(tmp_path)
    assert cfg.layers == family_for(hf).to_config(hf).layers
    tot = memory_json("--checkpoint", str(tmp_path), "--context", "4096")[0]["total"]
    assert tot["layers"] == cfg.n_layers and tot["bytes_per_token"] > 0
    assert tot["total_bytes"] == tot["bytes_per_token"] * 4096 + tot["bytes_per_sequence"]
    assert json.loads(run("models", "--checkpoint", str(tmp_path), "--json").stdout)[0]["params"]["stored"] > 0
    with pytest.raises(CheckpointError, match="a config.json alone is enough for accounting"):
        load(tmp_path)


def test_layer_lists_are_summarised():
    from storelab.report.memory_text import layers_text

    assert layers_text(list(range(3, 92, 4)), 92) == "23 of 92: every 4th"
    assert layers_text([i for i in range(92) if i % 4 != 3], 92) == "69 of 92: all but every 4th"
    assert layers_text([*range(3, 92, 4), 92], 93) == "24 of 93: every 4th and the last"
    assert layers_text(list(range(2, 61, 2)), 61) == "30 of 61: every 2nd from 2"
    assert layers_text([2, 8, 14], 40) == "3 of 40: 2, 8, 14"
    long = layers_text([i for i in range(70) if i % 7], 70)
    assert len(long) <= 32 and long.endswith(", ..") and long.startswith("60 of 70: 1-6, 8-13")


def test_every_zoo_model_fits_80_columns():
    out = run("memory", "--budget", "1TiB", "--weights-dtype", "fp4").stdout
    assert max(len(x) for x in out.splitlines()) <= 80
    assert "DeepSeek-V4.1-Flash" in out and "the global cache: 890 B" in out
