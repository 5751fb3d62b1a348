"""The remote-code decoders transformers 5.23 does not ship, each held to the transformers family its layout
repacks: ``chatglm`` (ChatGLM2/3, GLM-4 remote code) to ``glm``, ``qwen`` (the first Qwen) to ``qwen2`` without
GQA, ``internlm2`` to ``llama`` with its q/k/v packed per key/value group, ``internlm`` (v1) to ``llama`` with
biases on the attention.

A tiny random transformers model is written under the remote code's tensor names with a config.json in its field
names; storelab loads the folder: logits equal transformers' (fp32 and bf16), a chunked prefill then single steps
equal one pass, parameters from config.json alone equal the saved tensors, cache bytes equal transformers'. The
published configs (tests/fixtures/configs) are read with their KV cache counted by hand, and the fields no release
has are refused by name.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

from storelab.checkpoint import CheckpointError, load
from storelab.checkpoint.config_only import read_model_config
from storelab.cli import app
from storelab.models.accounting import count_params
from storelab.models.engines import state_bytes
from tests.family_harness import check_bf16, check_cache, check_counts, check_logits, tiny_hf

FIXTURES = Path(__file__).parent / "fixtures" / "configs"
BASE = dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
            intermediate_size=48, max_position_embeddings=256, bos_token_id=1, eos_token_id=2, pad_token_id=0,
            tie_word_embeddings=False)


def write(folder: Path, config: dict, tensors: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: v.detach().contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return folder


# -- ChatGLM2/3, GLM-4 remote code <- transformers' glm ---------------------------------------------------------
def chatglm_of(hf) -> tuple[dict, dict]:
    c, sd = hf.config, hf.state_dict()
    config = dict(model_type="chatglm", architectures=["ChatGLMModel"], num_layers=c.num_hidden_layers,
                  hidden_size=c.hidden_size, num_attention_heads=c.num_attention_heads, kv_channels=c.head_dim,
                  multi_query_attention=True, multi_query_group_num=c.num_key_value_heads,
                  ffn_hidden_size=c.intermediate_size, padded_vocab_size=c.vocab_size, vocab_size=c.vocab_size,
                  layernorm_epsilon=c.rms_norm_eps, rope_ratio=c.rope_parameters["rope_theta"] / 10000.0,
                  add_qkv_bias=True, add_bias_linear=False, rmsnorm=True, post_layer_norm=True, original_rope=True,
                  apply_residual_connection_post_layernorm=False, seq_length=256, tie_word_embeddings=False)
    t = {"transformer.embedding.word_embeddings.weight": sd["model.embed_tokens.weight"],
         "transformer.encoder.final_layernorm.weight": sd["model.norm.weight"],
         "transformer.output_layer.weight": sd["lm_head.weight"]}
    for i in range(c.num_hidden_layers):
        a, m = f"transformer.encoder.layers.{i}", f"model.layers.{i}"
        for kind in ("weight", "bias"):
            t[f"{a}.self_attention.query_key_value.{kind}"] = torch.cat(
                [sd[f"{m}.self_attn.{p}_proj.{kind}"] for p in "qkv"], 0)
        t[f"{a}.self_attention.dense.weight"] = sd[f"{m}.self_attn.o_proj.weight"]
        t[f"{a}.mlp.dense_h_to_4h.weight"] = sd[f"{m}.mlp.gate_up_proj.weight"]  # gate rows, then up rows
        t[f"{a}.mlp.dense_4h_to_h.weight"] = sd[f"{m}.mlp.down_proj.weight"]
        t[f"{a}.input_layernorm.weight"] = sd[f"{m}.input_layernorm.weight"]
        t[f"{a}.post_attention_layernorm.weight"] = sd[f"{m}.post_attention_layernorm.weight"]
    return config, t


# -- Qwen (the first) <- transformers' qwen2 without GQA --------------------------------------------------------
def qwen_of(hf) -> tuple[dict, dict]:
    c, sd = hf.config, hf.state_dict()
    config = dict(model_type="qwen", architectures=["QWenLMHeadModel"], hidden_size=c.hidden_size,
                  num_attention_heads=c.num_attention_heads, num_hidden_layers=c.num_hidden_layers,
                  kv_channels=c.hidden_size // c.num_attention_heads, intermediate_size=2 * c.intermediate_size,
                  layer_norm_epsilon=c.rms_norm_eps, rotary_emb_base=c.rope_parameters["rope_theta"], rotary_pct=1.0,
                  no_bias=True, scale_attn_weights=True, seq_length=256, max_position_embeddings=256,
                  use_dynamic_ntk=True, use_logn_attn=True, vocab_size=c.vocab_size, tie_word_embeddings=False)
    t = {"transformer.wte.weight": sd["model.embed_tokens.weight"], "transformer.ln_f.weight": sd["model.norm.weight"],
         "lm_head.weight": sd["lm_head.weight"]}
    for i in range(c.num_hidden_layers):
        a, m = f"transformer.h.{i}", f"model.layers.{i}"
        for kind in ("weight", "bias"):
            t[f"{a}.attn.c_attn.{kind}"] = torch.cat([sd[f"{m}.self_attn.{p}_proj.{kind}"] for p in "qkv"], 0)
        t[f"{a}.attn.c_proj.weight"] = sd[f"{m}.self_attn.o_proj.weight"]
        t[f"{a}.mlp.w1.weight"] = sd[f"{m}.mlp.up_proj.weight"]      # w1(x) * silu(w2(x))
        t[f"{a}.mlp.w2.weight"] = sd[f"{m}.mlp.gate_proj.weight"]
        t[f"{a}.mlp.c_proj.weight"] = sd[f"{m}.mlp.down_proj.weight"]
        t[f"{a}.ln_1.weight"] = sd[f"{m}.input_layernorm.weight"]
        t[f"{a}.ln_2.weight"] = sd[f"{m}.post_attention_layernorm.weight"]
    return config, t


# -- InternLM2 <- transformers' llama, q/k/v packed per key/value group ---------------------------------------------
def internlm2_of(hf, *, model_type: str = "internlm2") -> tuple[dict, dict]:
    c, sd = hf.config, hf.state_dict()
    H, G = c.num_attention_heads, c.num_key_value_heads
    K, r = c.hidden_size // H, H // G
    bias = bool(c.attention_bias)
    config = dict(model_type=model_type, architectures=["InternLM2ForCausalLM"], hidden_size=c.hidden_size,
                  num_hidden_layers=c.num_hidden_layers, num_attention_heads=H, num_key_value_heads=G,
                  intermediate_size=c.intermediate_size, rms_norm_eps=c.rms_norm_eps,
                  rope_theta=c.rope_parameters["rope_theta"], rope_scaling=None, bias=bias, hidden_act="silu",
                  max_position_embeddings=256, vocab_size=c.vocab_size, tie_word_embeddings=False)
    t = {"model.tok_embeddings.weight": sd["model.embed_tokens.weight"], "model.norm.weight": sd["model.norm.weight"],
         "output.weight": sd["lm_head.weight"]}

    def packed(kind: str) -> torch.Tensor:  # per group g: its r query heads, its key head, its value head
        q, k, v = (sd[f"{m}.self_attn.{p}_proj.{kind}"] for p in "qkv")
        tail = q.shape[1:]
        return torch.cat([q.reshape(G, r * K, *tail), k.reshape(G, K, *tail), v.reshape(G, K, *tail)], 1) \
            .reshape(G * (r + 2) * K, *tail)

    for i in range(c.num_hidden_layers):
        a, m = f"model.layers.{i}", f"model.layers.{i}"
        for kind in ("weight", "bias") if bias else ("weight",):
            t[f"{a}.attention.wqkv.{kind}"] = packed(kind)
            t[f"{a}.attention.wo.{kind}"] = sd[f"{m}.self_attn.o_proj.{kind}"]
        for theirs, ours in (("w1", "gate_proj"), ("w3", "up_proj"), ("w2", "down_proj")):
            t[f"{a}.feed_forward.{theirs}.weight"] = sd[f"{m}.mlp.{ours}.weight"]
        t[f"{a}.attention_norm.weight"] = sd[f"{m}.input_layernorm.weight"]
        t[f"{a}.ffn_norm.weight"] = sd[f"{m}.post_attention_layernorm.weight"]
    return config, t


# -- InternLM (v1) <- transformers' llama: the same names, ``bias`` for attention_bias ----------------------------
def internlm_of(hf) -> tuple[dict, dict]:
    c = hf.config
    config = dict(model_type="internlm", architectures=["InternLMForCausalLM"], hidden_size=c.hidden_size,
                  num_hidden_layers=c.num_hidden_layers, num_attention_heads=c.num_attention_heads,
                  num_key_value_heads=c.num_key_value_heads, intermediate_size=c.intermediate_size,
                  rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_parameters["rope_theta"], bias=True,
                  hidden_act="silu", max_position_embeddings=256, vocab_size=c.vocab_size, tie_word_embeddings=False)
    return config, dict(hf.state_dict())


# name -> (transformers model type, its tiny settings, the repacking)
TINY = {
    "chatglm": ("glm", dict(BASE, head_dim=16, attention_bias=True,
                             rope_parameters=dict(rope_type="default", rope_theta=500000.0, partial_rotary_factor=0.5)),
                chatglm_of),
    "qwen": ("qwen2", dict(BASE, num_key_value_heads=4, rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
             qwen_of),
    "internlm2": ("llama", dict(BASE, attention_bias=True, rope_parameters=dict(rope_type="default",
                                                                                rope_theta=1000000.0)), internlm2_of),
    "internlm2_nobias": ("llama", dict(BASE, num_attention_heads=8, attention_bias=False,
                                       rope_parameters=dict(rope_type="default", rope_theta=10000.0)), internlm2_of),
    "internlm2_early": ("llama", dict(BASE, rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
                        lambda hf: internlm2_of(hf, model_type="internlm")),
    "internlm": ("llama", dict(BASE, num_key_value_heads=4, attention_bias=True,
                               rope_parameters=dict(rope_type="default", rope_theta=10000.0)), internlm_of),
}
_BUILT: dict = {}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    def get(name: str):
        if name not in _BUILT:
            mt, settings, repack = TINY[name]
            hf = tiny_hf(mt, settings)
            config, tensors = repack(hf)
            _BUILT[name] = (hf, write(tmp_path_factory.mktemp(name), config, tensors))
        return _BUILT[name]

    yield get
    _BUILT.clear()


@pytest.mark.parametrize("name", list(TINY))
def test_logits_equal_transformers(name, saved):
    check_logits(*saved(name), what=name)


@pytest.mark.parametrize("name", ["chatglm", "qwen", "internlm2", "internlm"])
def test_bf16_logits(name, saved):
    check_bf16(*saved(name), what=name)


@pytest.mark.parametrize("name", list(TINY))
def test_config_counts_equal_transformers(name, saved):
    check_counts(*saved(name))


@pytest.mark.parametrize("name", ["chatglm", "qwen", "internlm2"])
def test_memory_equals_transformers_cache(name, saved):
    check_cache(*saved(name), 17)


def test_config_read(saved):
    """Each family's fields as its remote code means them."""
    glm = read_model_config(saved("chatglm")[1])
    a = glm.layers[0].token
    assert (a.n_heads, a.n_kv_heads, a.head_dim, a.partial_rotary, a.rope_interleaved, a.qkv_bias, a.out_bias) == (
        4, 2, 16, 0.5, True, True, False)
    assert a.rope_theta == 500000.0 and glm.context == 256 and glm.layers[0].channel.d_ff == 48
    qw = read_model_config(saved("qwen")[1])
    a = qw.layers[0].token
    assert (a.n_kv_heads, a.qkv_bias, a.out_bias, qw.layers[0].channel.d_ff, qw.context) == (4, True, False, 48, 256)
    lm2 = read_model_config(saved("internlm2")[1])
    assert lm2.layers[0].token.qkv_bias and lm2.layers[0].token.out_bias  # ``bias`` on wqkv and wo
    assert not read_model_config(saved("internlm2_nobias")[1]).layers[0].token.qkv_bias
    lm1 = read_model_config(saved("internlm")[1])
    assert lm1.layers[0].token.qkv_bias and lm1.layers[0].token.out_bias  # ``bias`` on all four projections


# -- the published configs --------------------------------------------------------------------------------------
# (file, layers, KV heads, head size, stored parameters counted by hand)
PUBLISHED = [
    # ChatGLM2-6B: 28 layers, 2 KV groups of 128; per layer 4096*(32 + 4)*128 + 36*128 (qkv + bias) + 4096*4096
    # (dense) + 3*4096*13696 (MLP) + 2*4096 (norms); embedding and output 2*65024*4096; final norm 4096
    ("chatglm2-6b", 28, 2, 128, 28 * (4096 * 36 * 128 + 36 * 128 + 4096 * 4096 + 3 * 4096 * 13696 + 2 * 4096)
     + 2 * 65024 * 4096 + 4096),
    # Qwen-7B: 32 layers, 32 KV heads of 128; c_attn 4096*3*4096 + 3*4096, c_proj 4096*4096, MLP 3*4096*(22016/2)
    ("Qwen-7B", 32, 32, 128, 32 * (4096 * 3 * 4096 + 3 * 4096 + 4096 * 4096 + 3 * 4096 * 11008 + 2 * 4096)
     + 2 * 151936 * 4096 + 4096),
    # InternLM-20B: 60 layers, 40 KV heads of 128, no biases (``bias`` false)
    ("internlm-20b", 60, 40, 128, 60 * (4 * 5120 * 5120 + 3 * 5120 * 13824 + 2 * 5120) + 2 * 103168 * 5120 + 5120),
]


@pytest.mark.parametrize("stem,layers,kv_heads,head,params", PUBLISHED, ids=[p[0] for p in PUBLISHED])
def test_published_config_by_hand(stem, layers, kv_heads, head, params):
    cfg = read_model_config(FIXTURES / f"{stem}.json")
    assert count_params(cfg).stored == params
    per_token = layers * kv_heads * head * 2 * 2  # keys and values, bf16
    assert state_bytes(cfg, 8192, dtype="bf16") == {"attention": 8192 * per_token}


def test_published_kv_bytes_by_hand():
    """ChatGLM2-6B keeps 28 x 2 x 128 x 2 x 2 = 28,672 bytes a token in bf16 (GQA of 2 groups); Qwen-7B 32 x 32 x
    128 x 2 x 2 = 524,288 (no GQA); InternLM-20B 60 x 40 x 128 x 2 x 2 = 1,228,800."""
    for stem, want in (("chatglm2-6b", 28_672), ("Qwen-7B", 524_288), ("internlm-20b", 1_228_800)):
        assert state_bytes(read_model_config(FIXTURES / f"{stem}.json"), 1, dtype="bf16") == {"attention": want}


@pytest.mark.parametrize("stem", [p[0] for p in PUBLISHED])
def test_cli_on_published(stem):
    path = str(FIXTURES / f"{stem}.json")
    r = CliRunner().invoke(app, ["models", path])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(app, ["memory", path, "--context", "8192", "--json"])
    assert r.exit_code == 0, r.output
    json.loads(r.output)


# -- refusals -----------------------------------------------------------------------------------------------------
def _published(stem: str) -> dict:
    return json.loads((FIXTURES / f"{stem}.json").read_text())


@pytest.mark.parametrize("stem,field,value", [
    ("chatglm2-6b", "rmsnorm", False), ("chatglm2-6b", "add_bias_linear", True),
    ("chatglm2-6b", "apply_residual_connection_post_layernorm", True), ("chatglm2-6b", "post_layer_norm", False),
    ("chatglm2-6b", "position_encoding_2d", True), ("Qwen-7B", "no_bias", False),
    ("Qwen-7B", "scale_attn_weights", False), ("Qwen-7B", "intermediate_size", 22017)])
def test_refused_by_name(stem, field, value, tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(dict(_published(stem), **{field: value})))
    with pytest.raises(CheckpointError, match=field) as e:
        read_model_config(path)
    assert str(path) in str(e.value)


def test_internlm2_dynamic_rope_accounted_not_loaded(saved, tmp_path):
    """InternLM2.5's ``rope_scaling`` {"type": "dynamic"} is accounted; loading refuses it by name."""
    _, folder = saved("internlm2")
    cfg = json.loads((folder / "config.json").read_text())
    d = tmp_path / "dyn"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(dict(cfg, rope_scaling={"type": "dynamic", "factor": 2.0})))
    (d / "model.safetensors").symlink_to(folder / "model.safetensors")
    assert read_model_config(d).n_layers == 3
    with pytest.raises(CheckpointError, match="rope_scaling"):
        load(d)
