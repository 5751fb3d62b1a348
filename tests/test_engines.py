"""Engine conventions (``storelab.models.engines``, ``storelab memory --engine``): llama.cpp's and vLLM's
rules against their published figures and against cases computed here by hand from the rules' source.

* llama.cpp's logs: Qwen3.5/3.6-27B, 16,384 MiB of f16 KV at 262,144 cells (4 sequences of 65,536),
  149.625 MiB of f32 R + S per sequence; Kimi-K2 (MLA), 4,392 MiB at 65,536 cells; Gemma-4-12B with
  ``-c 8192 -np 2``, 4,096 full and 1,536 SWA cells per sequence, 128 and 960 MiB.
* vLLM's DeepSeek-V4-Pro: 9.62 GiB of bf16 cache per sequence at 2^20 tokens.
* A hand-made hybrid (a window, a full cache, a Mamba-2 layer, a chunk) at L = 1,000, B = 2: llama.cpp's
  padding of n_ctx and of the SWA cache, vLLM's pages, its hybrid block size and padded state page.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from storelab.cli import app
from storelab.models.config import LayerConfig, ModelConfig
from storelab.models.engines import engine_layers, state_bytes
from storelab.models.memory_terms import GIB, MIB
from storelab.stores.attention import AttentionConfig, WindowConfig
from storelab.stores.chunked import ChunkedConfig
from storelab.stores.depth import ResidualConfig
from storelab.stores.ffn import FFNConfig
from storelab.stores.mamba2 import Mamba2Config
from tests.test_memory_terms import QWEN36_TEXT, V4_PRO

D = 64
ATT = dict(d_model=D, n_heads=4, head_dim=16, n_kv_heads=2)  # an entry: 2 heads x (16 + 16) numbers


def run(*args: str, ok: bool = True):
    r = CliRunner().invoke(app, list(args), env={"COLUMNS": "80"})
    if ok:
        assert r.exit_code == 0, r.output
    return r


def memory_doc(*args: str) -> dict:
    return json.loads(run("memory", *args, "--json").stdout)


def write(folder: Path, cfg: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def hybrid() -> ModelConfig:
    """Layer 0 a window of 100, 1 a full cache, 2 a Mamba-2 layer, 3 a chunk of 64."""
    tokens = [WindowConfig(**ATT, window=100), AttentionConfig(**ATT),
              Mamba2Config(d_model=D, n_heads=4, head_dim=16, d_state=8), ChunkedConfig(**ATT, chunk=64)]
    layers = [LayerConfig(token=t, channel=FFNConfig(d_model=D, d_ff=96), depth=ResidualConfig(d_model=D))
              for t in tokens]
    return ModelConfig(name="hybrid", d_model=D, vocab_size=64, layers=layers)


def mamba_numbers(m: Mamba2Config) -> int:
    """The state [H, P, N] and the convolution's last W - 1 inputs of C channels."""
    return m.n_heads * m.head_dim * m.d_state + (m.conv_kernel - 1) * m.conv_channels


# -- llama.cpp ----------------------------------------------------------------------------------------
def test_llama_cpp_qwen36_27b_log(tmp_path):
    from storelab.checkpoint import read_model_config

    folder = write(tmp_path / "Qwen3.6-27B", {"model_type": "qwen3_5", "text_config": QWEN36_TEXT})
    (rec,) = memory_doc("--checkpoint", str(folder), "--context", "65536", "--batch", "4",
                        "--engine", "llama.cpp")["models"]
    eng, rows = rec["engine"], rec["layers"]
    assert eng["name"] == "llama.cpp" and eng["cache_format"] == "fp16"             # type_k/type_v default
    assert eng["settings"]["n_ctx"] == 262144 and eng["settings"]["n_seq_max"] == 4
    kv = sum(r["engine_bytes"] for r in rows if r["kind"] == "attention")
    rs = sum(r["engine_bytes"] for r in rows if r["kind"] == "gated_deltanet")
    assert kv == 16384 * MIB                                                          # the log's KV, f16
    assert rs == 4 * 149.625 * MIB                                                    # R + S in f32, 4 seqs
    assert eng["total_bytes"] == kv + rs
    assert all("4 x 65,536 cells" in r["engine_rule"] for r in rows if r["kind"] == "attention")   # per stream
    unified = engine_layers(read_model_config(folder), 65536, batch=4, engine="llama.cpp", kv_unified=True)
    assert unified["total_bytes"] == kv + rs and "1 x 262,144 cells" in unified["layers"][3]["rule"]
    # the state stays f32 whatever --state-dtype says (llama.cpp creates r and s as GGML_TYPE_F32)
    bf = memory_doc("--checkpoint", str(folder), "--context", "65536", "--batch", "4", "--engine", "llama.cpp",
                    "--state-dtype", "bf16")["models"][0]["engine"]["total_bytes"]
    assert bf == eng["total_bytes"]


def test_llama_cpp_mla_log(tmp_path):
    """A published llama.cpp log (ik_llama.cpp's sweep-bench of Kimi-K2-Instruct-0905, deepseek2, -c 65536
    -ctk f16): "KV self size = 4392.00 MiB, c^KV (f16): 4392.00 MiB, kv^T: not used": MLA keeps its latent
    and rotary key (512 + 64) per cell, no V. Kimi-K2-Instruct's config.json as published (fixture)."""
    folder = tmp_path / "Kimi-K2"
    folder.mkdir()
    (folder / "config.json").write_text((Path(__file__).parent / "fixtures" / "configs" /
                                         "Kimi-K2-Instruct.json").read_text())
    doc = memory_doc("--checkpoint", str(folder), "--context", "65536", "--engine", "llama.cpp")
    eng = doc["models"][0]["engine"]
    assert eng["total_bytes"] == 4392 * MIB == 61 * (512 + 64) * 2 * 65536
    padded = memory_doc("--checkpoint", str(folder), "--context", "65000", "--engine", "llama.cpp")["models"][0]
    assert padded["engine"]["settings"]["n_ctx"] == 65024                               # pad(65,000, 256)
    assert padded["engine"]["total_bytes"] == 61 * 576 * 2 * 65024


def test_llama_cpp_swa_log():
    """A published llama-server log (Gemma-4-12B, ``-c 8192 -np 2``, f16): "creating non-SWA KV cache, size =
    4096 cells ... size = 128.00 MiB (4096 cells, 8 layers, 2/2 seqs)", "creating SWA KV cache, size = 1536
    cells ... size = 960.00 MiB (1536 cells, 40 layers, 2/2 seqs)". The layers as its GGUF states them: 48,
    every 6th full attention with 1 KV head of 512, the others a window of 1,024 with 8 KV heads of 256."""
    res, ffn = ResidualConfig(d_model=3840), FFNConfig(d_model=3840, d_ff=15360)
    full = AttentionConfig(d_model=3840, n_heads=16, head_dim=512, n_kv_heads=1)
    swa = WindowConfig(d_model=3840, n_heads=16, head_dim=256, n_kv_heads=8, window=1024)
    layers = [LayerConfig(token=full if i % 6 == 5 else swa, channel=ffn, depth=res) for i in range(48)]
    cfg = ModelConfig(name="gemma-4-12b", d_model=3840, vocab_size=262144, layers=layers)
    rec = engine_layers(cfg, 4096, batch=2, engine="llama.cpp")                       # -c 8192 -np 2
    kinds = [lay.token.KIND for lay in cfg.layers]
    assert sum(r["bytes"] for r, k in zip(rec["layers"], kinds) if k == "attention") == 128 * MIB
    assert sum(r["bytes"] for r, k in zip(rec["layers"], kinds) if k == "window") == 960 * MIB
    assert "2 x 1,536 cells" in rec["layers"][0]["rule"] and "2 x 4,096 cells" in rec["layers"][5]["rule"]


def test_llama_cpp_padding_by_hand():
    cfg = hybrid()
    entry = 2 * (16 + 16) * 2                                                          # f16 K and V
    m = cfg.layers[2].token
    # one stream per sequence (the default): n_ctx = pad(2 x 1000, 256) = 2,048, n_ctx_seq = pad(2048 / 2, 256)
    # = 1,024 cells each; a window pad(min(1024, 100 + 512), 256) = 768 cells each, a chunk pad(64 + 512) = 768
    got = [r["bytes"] for r in engine_layers(cfg, 1000, batch=2, engine="llama.cpp")["layers"]]
    assert got == [2 * 768 * entry, 2 * 1024 * entry, 2 * mamba_numbers(m) * 4, 2 * 768 * entry]
    odd = engine_layers(cfg, 300, batch=3, engine="llama.cpp")                        # n_ctx pad(900) = 1,024
    assert odd["layers"][1]["bytes"] == 3 * 512 * entry                               # pad(1024 // 3, 256) each
    # one unified stream: n_ctx cells; a window pad(min(2048, 100 x 2 + 512), 256) = 768 cells for both
    n_ctx = 2048
    got = [r["bytes"] for r in engine_layers(cfg, 1000, batch=2, engine="llama.cpp", kv_unified=True)["layers"]]
    assert got == [768 * entry, n_ctx * entry, 2 * mamba_numbers(m) * 4, 768 * entry]
    unified = engine_layers(cfg, 1000, batch=4, engine="llama.cpp", kv_unified=True)["layers"][0]["bytes"]
    assert unified == 1024 * entry                                                    # pad(100 x 4 + 512, 256)
    full = engine_layers(cfg, 1000, batch=2, engine="llama.cpp", swa_full=True)["layers"]
    assert full[0]["bytes"] == 2 * 1024 * entry and "swa_full" in full[0]["rule"]
    # a window longer than the context: the SWA cache is no bigger than n_ctx
    small = engine_layers(cfg, 100, batch=1, engine="llama.cpp", n_ubatch=2048)
    assert small["settings"]["n_ctx"] == 256 and small["layers"][0]["bytes"] == 256 * entry
    q8 = engine_layers(cfg, 1000, batch=2, engine="llama.cpp", cache="q8_0")["layers"][1]["bytes"]
    assert q8 == n_ctx * 2 * 32 / 32 * 34                                              # 2 blocks of 34 B per cell


# -- vLLM ---------------------------------------------------------------------------------------------
def test_vllm_pages_and_hybrid_block_by_hand():
    cfg = hybrid()
    m = cfg.layers[2].token
    entry = 2 * (16 + 16) * 2                                                          # bf16 K and V
    state = m.n_heads * m.head_dim * m.d_state * 4 + (m.conv_kernel - 1) * m.conv_channels * 2  # f32, bf16 inputs
    rec = engine_layers(cfg, 1000, batch=2, engine="vllm", max_num_batched_tokens=256)
    block = 16 * -(-state // (16 * entry))                                             # the hybrid block
    assert state > 16 * entry and rec["settings"]["block_size"] == block == 32
    assert rec["settings"]["state_page_bytes"] == block * entry
    got = [r["bytes"] for r in rec["layers"]]
    window = (-(-min(100 - 1 + 256, 1000) // block) + 1) * block                      # 416 tokens
    full = -(-1000 // block) * block                                                   # 1,024
    chunk = -(-min(64 + 256, 1000) // block) * block                                   # 320
    assert got == [2 * window * entry, 2 * full * entry, 2 * block * entry, 2 * chunk * entry]
    assert "padded to the attention page" in rec["layers"][2]["rule"]
    # no recurrent layer: pages of 16 and nothing padded
    plain = ModelConfig(name="plain", d_model=D, vocab_size=64, layers=[cfg.layers[0], cfg.layers[1]])
    rec = engine_layers(plain, 1000, batch=1, engine="vllm")
    assert rec["settings"]["block_size"] == 16
    assert [r["bytes"] for r in rec["layers"]] == [(63 + 1) * 16 * entry, 1008 * entry]  # W - 1 + M > L


def test_short_convolution_is_state_in_both_engines():
    """LFM2's short convolution: llama.cpp keeps its W - 1 inputs as an f32 r row per sequence, vLLM as a
    MambaSpec page, padded to the attention page in a hybrid."""
    from storelab.stores.short_conv import ShortConvConfig

    conv = ShortConvConfig(d_model=D, conv_kernel=3)
    res = ResidualConfig(d_model=D)
    cfg = ModelConfig(name="lfm", d_model=D, vocab_size=64,
                      layers=[LayerConfig(token=conv, channel=FFNConfig(d_model=D, d_ff=96), depth=res),
                              LayerConfig(token=AttentionConfig(**ATT), channel=FFNConfig(d_model=D, d_ff=96),
                                          depth=res)])
    llama = engine_layers(cfg, 500, batch=3, engine="llama.cpp", state="bf16")["layers"][0]
    assert llama["bytes"] == 3 * 2 * D * 4 and "r + s rows in f32" in llama["rule"]      # f32 whatever asked
    vllm = engine_layers(cfg, 500, batch=3, engine="vllm", state="bf16")
    assert vllm["settings"]["block_size"] == 16 and vllm["layers"][0]["bytes"] == 3 * 16 * 128  # padded page
    assert vllm["layers"][1]["bytes"] == 3 * 512 * 128                                   # 500 in pages of 16


def fixture(tmp_path: Path, name: str) -> Path:
    """A published config.json (tests/fixtures/configs, SOURCES.md) in a folder of its own."""
    folder = tmp_path / name
    folder.mkdir()
    (folder / "config.json").write_text((Path(__file__).parent / "fixtures" / "configs" / f"{name}.json").read_text())
    return folder


@pytest.mark.parametrize("name,state,block,padding", [
    ("Qwen3.5-0.8B-Base", None, 544, 2.64),        # mamba_ssm_dtype float32 in its config
    ("Qwen3.5-27B", None, 784, None),
    ("Qwen3-Next-80B-A3B-Thinking", None, 544, 1.49),  # no mamba_ssm_dtype: the model's bf16
])
def test_vllm_hybrid_block_logs(tmp_path, name, state, block, padding):
    """vLLM's logs: "Setting attention block size to 544 tokens to ensure that attention page size is >=
    mamba page size", "Padding mamba page size by 2.64% (1.49%) ..." (Qwen3.5-0.8B, Qwen3-Next-80B), and
    784 for Qwen3.5-27B: GDN pages of the convolution's 3 inputs in bf16 and the state in the config's
    mamba_ssm_dtype, attention pages of 16-token multiples."""
    rec = memory_doc("--checkpoint", str(fixture(tmp_path, name)), "--context", "4096", "--engine", "vllm")
    eng = rec["models"][0]["engine"]
    assert eng["settings"]["block_size"] == block
    rules = [r["engine_rule"] for r in rec["models"][0]["layers"] if r["kind"] == "gated_deltanet"]
    own = int(rules[0].split("its ")[1].split(" B")[0].replace(",", ""))
    assert own < eng["settings"]["state_page_bytes"] <= own + 16 * eng["settings"]["state_page_bytes"] / block
    if padding is not None:
        assert round(100 * (eng["settings"]["state_page_bytes"] - own) / own, 2) == padding


def test_vllm_state_formats(tmp_path):
    """Qwen3.6-27B as storelab writes it (no dtype named): bf16 convolution inputs, the states in
    --state-dtype when given."""
    folder = write(tmp_path / "q", QWEN36_TEXT)
    conv = 3 * (2 * 16 * 128 + 48 * 128)                                               # W - 1 inputs of C
    per_token = 4 * 256 * 2 * 2                                                        # bf16 K and V
    for asked, page in (("f32", 48 * 128 * 128 * 4 + conv * 2), ("bf16", 48 * 128 * 128 * 2 + conv * 2)):
        rec = memory_doc("--checkpoint", str(folder), "--context", "4096", "--engine", "vllm",
                         "--state-dtype", asked)["models"][0]
        block = 16 * -(-page // (16 * per_token))
        assert rec["engine"]["settings"]["block_size"] == block and rec["engine"]["state_format"] == (
            "fp32" if asked == "f32" else "bf16")
        att = [r for r in rec["layers"] if r["kind"] == "attention"]
        assert all(r["engine_bytes"] == -(-4096 // block) * block * per_token for r in att)
    bare = memory_doc("--checkpoint", str(folder), "--context", "4096", "--engine", "vllm")["models"][0]
    assert bare["engine"]["state_format"] == "bf16"                                   # the model's, 'auto'
    out = run("memory", "--checkpoint", str(folder), "--engine", "vllm").stdout
    assert max(len(x) for x in out.splitlines()) <= 80 and "states bf16" in out


def test_vllm_deepseek_v4_pro(tmp_path):
    from storelab.checkpoint import read_model_config

    folder = write(tmp_path / "V4-Pro", V4_PRO)
    cfg = read_model_config(folder)
    L = 1 << 20
    rec = engine_layers(cfg, L, engine="vllm", cache="bf16")
    terms = [s.memory_terms(cache="bf16", state="fp32") for lay in cfg.layers for s in lay.stores().values()]
    per_token, fixed = sum(t.per_token for t in terms), sum(t.per_sequence for t in terms)
    assert rec["total_bytes"] == pytest.approx(L * per_token + fixed, abs=len(cfg.layers))  # whole pages at 2^20
    assert round(L * per_token / GIB, 2) == 9.62                                      # vLLM: 9.62 GiB
    assert all("pages of 16" in r["rule"] for r in rec["layers"])
    # a length that is not a whole number of pages is rounded up to one: 1,000 tokens take 1,008
    short = engine_layers(cfg, 1000, engine="vllm", cache="bf16")["total_bytes"]
    assert short == pytest.approx(1008 * per_token + fixed, abs=len(cfg.layers))


# -- transformers, ideal, the command -------------------------------------------------------------------
def test_transformers_and_ideal_rules():
    cfg = hybrid()
    entry = 2 * (16 + 16) * 4
    rec = engine_layers(cfg, 300, batch=3, engine="transformers", cache="fp32")
    assert rec["layers"][0]["bytes"] == 3 * (300 * entry + 8)                          # the prefill's storage
    assert rec["layers"][3]["bytes"] == 3 * (300 * entry + 8)
    assert rec["total_bytes"] == 3 * sum(state_bytes(cfg, 300, engine="transformers", dtype="fp32").values())
    ideal = engine_layers(cfg, 300, batch=3, engine="ideal", cache="fp32")
    assert ideal["layers"][0]["bytes"] == 3 * 100 * entry and ideal["layers"][1]["bytes"] == 3 * 300 * entry


def test_command_states_the_engine(tmp_path):
    folder = write(tmp_path / "q", QWEN36_TEXT)
    out = run("memory", "--checkpoint", str(folder), "--context", "65536").stdout
    assert "engine: ideal" in out
    out = run("memory", "--checkpoint", str(folder), "--context", "65536", "--batch", "4",
              "--engine", "llama.cpp").stdout
    assert "engine llama.cpp, f16 caches: 16.584 GiB (16,982.5 MiB)" in out and "n_ctx 262,144" in out
    assert max(len(x) for x in out.splitlines()) <= 80
    for engine in ("transformers", "llama.cpp", "vllm"):  # every zoo model, every store kind, in 80 columns
        out = run("memory", "--engine", engine, "--budget", "1TiB").stdout
        assert max(len(x) for x in out.splitlines()) <= 80 and f"engine {engine}, " in out
    doc = memory_doc("--checkpoint", str(folder), "--engine", "vllm")
    assert doc["schema_version"] == 3
    rec = doc["models"][0]
    assert rec["engine"]["total_bytes"] == sum(r["engine_bytes"] for r in rec["layers"])
    ideal = memory_doc("--checkpoint", str(folder))["models"][0]
    assert all(r["engine_bytes"] == r["total_bytes"] for r in ideal["layers"])
    r = run("memory", "--checkpoint", str(folder), "--engine", "sglang", ok=False)
    assert r.exit_code == 2 and "engine: unknown 'sglang'" in r.output


def test_engine_json_matches_its_schema(tmp_path):
    from tests.test_memory_schema import SCHEMA, validate

    folder = write(tmp_path / "q", QWEN36_TEXT)
    for engine in ("ideal", "transformers", "llama.cpp", "vllm"):
        validate(memory_doc("--checkpoint", str(folder), "--context", "1000", "--engine", engine), SCHEMA)


# -- formats from the folder ------------------------------------------------------------------------------
KV_FP8 = {"quant_method": "compressed-tensors",
          "kv_cache_scheme": {"num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False,
                              "symmetric": True}}


def quantized_folder(folder: Path, quantization_config: dict | None, base: dict | None = None
                     ) -> tuple[Path, dict[str, int]]:
    """Qwen3.6-27B's config with a small set of tensors as quantized releases store them: an fp8 weight with
    its fp32 block scale, an expert of packed fp4 (two e2m1 codes per int8) with its U8 exponent scales
    (1 x 32 blocks), a bf16 embedding (storelab.checkpoint.quantized reads these layouts)."""
    import torch
    from safetensors.torch import save_file

    cfg = {**(base or QWEN36_TEXT), **({"quantization_config": quantization_config} if quantization_config else {})}
    write(folder, cfg)
    tensors = {"layers.0.w.weight": torch.zeros(64, 256).to(torch.float8_e4m3fn),
               "layers.0.w.weight_scale_inv": torch.ones(1, 2),
               "layers.0.experts.0.w1.weight": torch.zeros(64, 128, dtype=torch.int8),     # 256 fp4 per row
               "layers.0.experts.0.w1.weight_scale_inv": torch.full((64, 8), 127, dtype=torch.uint8),
               "embed.weight": torch.zeros(100, 64, dtype=torch.bfloat16)}
    save_file(tensors, str(folder / "model.safetensors"))
    return folder, {"F8_E4M3": 64 * 256, "F32": 2 * 4, "I8": 64 * 128, "U8": 64 * 8, "BF16": 100 * 64 * 2}


def test_cache_format_from_the_config(tmp_path):
    folder, _ = quantized_folder(tmp_path / "fp8kv", KV_FP8)
    rec = memory_doc("--checkpoint", str(folder), "--context", "1000")["models"][0]
    assert rec["cache_format"] == "fp8" and rec["cache_format_source"] == "quantization_config.kv_cache_scheme"
    assert rec["total"]["bytes_per_token"] == 16 * 4 * 256 * 2 * 1                   # one byte per number
    given = memory_doc("--checkpoint", str(folder), "--context", "1000", "--cache-dtype", "f16")["models"][0]
    assert given["cache_format"] == "fp16" and "cache_format_source" not in given     # the flag wins
    wrapped = write(tmp_path / "wrapped", {"model_type": "qwen3_5", "text_config": {
        **QWEN36_TEXT, "quantization_config": {"quant_algo": "FP8", "kv_cache_quant_algo": "NVFP4"}}})
    rec = memory_doc("--checkpoint", str(wrapped), "--context", "1000")["models"][0]
    assert (rec["cache_format"], rec["cache_format_source"]) == (
        "fp4", "text_config.quantization_config.kv_cache_quant_algo")
    plain = write(tmp_path / "plain", {**QWEN36_TEXT, "quantization_config": {"quant_method": "fp8",
                                                                              "weight_block_size": [128, 128]}})
    rec = memory_doc("--checkpoint", str(plain), "--context", "1000")["models"][0]
    assert rec["cache_format"] == "published" and "cache_format_source" not in rec  # fp8 weights, cache unsaid
    int8 = write(tmp_path / "int8", {**QWEN36_TEXT, "quantization_config": {
        "kv_cache_scheme": {"num_bits": 8, "type": "int"}}})
    r = run("memory", "--checkpoint", str(int8), ok=False)
    assert r.exit_code == 2 and "quantization_config.kv_cache_scheme: 8-bit int caches" in r.output


# a model whose parameters these few tensors can hold (about 44k parameters in 38k bytes): a published config
# beside them is refused as another model's weights (tests/test_bad_inputs_more.py)
TINY_LLAMA = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 100,
              "max_position_embeddings": 4_000_000}


def test_budget_takes_the_weights_from_the_headers(tmp_path):
    from tests.test_memory_schema import SCHEMA, validate

    folder, held = quantized_folder(tmp_path / "q", KV_FP8, TINY_LLAMA)
    doc = memory_doc("--checkpoint", str(folder), "--budget", "40000", "--context", "1000")  # a few tokens' room
    validate(doc, SCHEMA)
    rec = doc["models"][0]
    bud, tot = rec["budget"], rec["total"]
    assert bud["weights_format"] == "folder" and bud["weights_by_dtype"] == held
    assert bud["weights_bytes"] == sum(held.values()) == 64 * 256 + 8 + 64 * 128 + 512 + 12800
    room = 40000 - bud["weights_bytes"]
    assert {f["fits"] for f in bud["longest_context"]} == {True, False}
    for f in (f for f in bud["longest_context"] if f["fits"]):
        b, L = f["batch"], f["context"]
        assert b * (tot["bytes_per_token"] * L + tot["bytes_per_sequence_full"]) <= room
        assert b * (tot["bytes_per_token"] * (L + 1) + tot["bytes_per_sequence_full"]) > room
    # --weights-dtype asks what-if: parameters x that format, the headers aside
    asked = memory_doc("--checkpoint", str(folder), "--budget", "1TiB", "--weights-dtype", "fp8")
    asked = asked["models"][0]["budget"]
    assert asked["weights_format"] == "fp8" and asked["weights_bytes"] == asked["stored_params"]
    out = run("memory", "--checkpoint", str(folder), "--budget", "1GiB").stdout
    assert "parameters, as stored" in out
    # a config.json alone: parameters x bf16, as before
    alone = write(tmp_path / "alone", QWEN36_TEXT)
    bud = memory_doc("--checkpoint", str(alone), "--budget", "1TiB")["models"][0]["budget"]
    assert bud["weights_format"] == "bf16" and bud["weights_bytes"] == 2 * bud["stored_params"]


# -- transformers' cache of the linear-attention families, measured ------------------------------------------
def _held_bytes(past) -> int:
    """Bytes of every tensor transformers' cache holds, each storage once, including those its linear-attention
    layers keep in dicts (``conv_states``, ``recurrent_states``)."""
    import torch

    def tensors(v):
        if isinstance(v, torch.Tensor):
            yield v
        elif isinstance(v, dict):
            for x in v.values():
                yield from tensors(x)
        elif isinstance(v, (list, tuple)):
            for x in v:
                yield from tensors(x)

    seen, total = set(), 0
    for layer in past.layers:
        for v in vars(layer).values():
            for t in tensors(v):
                key = t.untyped_storage().data_ptr()
                if t.numel() and key not in seen:
                    seen.add(key)
                    total += t.untyped_storage().nbytes()
    return total


@pytest.mark.parametrize("model_type", ["qwen3_5_text", "kimi_linear"])
def test_transformers_rule_equals_its_linear_attention_cache(model_type, tmp_path):
    """Gated DeltaNet (qwen3_5) and KDA (kimi_linear) with attention: after a prefill of T tokens, the
    ``transformers`` rule equals the bytes of transformers' own cache (fp32): the state, and the
    convolution's whole kernel of W inputs (``LinearAttentionLayer.conv_states``), one more than the ideal."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from storelab.checkpoint import read_model_config
    from tests.test_checkpoint import FAMILIES

    torch.manual_seed(0)
    hf_cfg = AutoConfig.for_model(model_type, **FAMILIES[model_type])
    hf = AutoModelForCausalLM.from_config(hf_cfg).eval()
    hf_cfg.save_pretrained(tmp_path)
    cfg = read_model_config(tmp_path)
    for T in (2, 5, 17):                                                               # below, at, over W
        with torch.no_grad():
            past = hf(torch.randint(3, 100, (1, T)), use_cache=True).past_key_values
        assert sum(state_bytes(cfg, T, engine="transformers", dtype="fp32").values()) == _held_bytes(past), T
        assert sum(state_bytes(cfg, T, engine="ideal", dtype="fp32").values()) < _held_bytes(past)


def test_engine_options(tmp_path):
    folder = write(tmp_path / "q", QWEN36_TEXT)
    base = ("--checkpoint", str(folder), "--context", "4096")
    eng = memory_doc(*base, "--engine", "llama.cpp", "--engine-option", "kv_unified=true",
                     "--engine-option", "n_ubatch=2048")["models"][0]["engine"]
    assert eng["settings"]["kv_unified"] is True and eng["settings"]["n_ubatch"] == 2048
    eng = memory_doc(*base, "--engine", "vllm", "--engine-option", "model_dtype=float16")["models"][0]["engine"]
    assert eng["settings"]["model_dtype"] == "fp16" and eng["state_format"] == "fp16"   # 'auto' follows it
    for args, match in ((["--engine", "llama.cpp", "--engine-option", "block_size=32"],
                         "engine option: 'block_size=32' is not KEY=VALUE with a key of llama.cpp"),
                        (["--engine", "llama.cpp", "--engine-option", "n_ubatch=0"],
                         "engine option n_ubatch: must be a whole number from 1 to 2,147,483,647"),
                        (["--engine", "llama.cpp", "--engine-option", "swa_full=maybe"],
                         "engine option swa_full: must be true or false"),
                        (["--engine-option", "n_ubatch=512"], "key of ideal (known: none)")):
        r = run("memory", *base, *args, ok=False)
        assert r.exit_code == 2 and match in r.output, r.output
