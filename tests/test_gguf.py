"""GGUF files of the plain decoders (``storelab/checkpoint/gguf/archs.py``) against transformers 5.23's tiny models:
each tiny model is written as a GGUF the way llama.cpp's converter writes it (``tests/gguf_writer.py``), then

* logits: storelab's load of the F32 GGUF equals transformers' logits of the original model (fp32);
* transformers' own GGUF reader (``from_pretrained(folder, gguf_file=...)``) of a Q8_0 file gives the logits
  storelab gives for that file, where transformers reads the architecture;
* header: ``read_model_config`` of the GGUF counts the parameters transformers' model holds, reading no tensor;
* names: every rule's GGUF name is one gguf-py lists for the architecture, and gguf-py maps the rule's
  transformers name onto it;
* bad input: truncated file, wrong magic, unknown tensor type, missing metadata key, bytes past the end, an
  unknown architecture, a missing shard, an unread tensor; each a CheckpointError naming the file and key.
"""

from __future__ import annotations

import os
import struct

import gguf
import pytest
import torch
from gguf.constants import MODEL_ARCH_NAMES, TENSOR_NAMES

from storelab.checkpoint import CheckpointError, load, read_model_config
from storelab.checkpoint.config_only import read_hf_config
from storelab.checkpoint.gguf import GGUF_ARCHS, gguf_stored_bytes, is_gguf, read_header
from storelab.checkpoint.loader import plan
from storelab.models.accounting import count_params
from tests.family_harness import ids_of, tiny_hf
from tests.gguf_writer import ARCH_OF, write_gguf
from tests.helpers import assert_close

os.environ.setdefault("USE_HUB_KERNELS", "0")

COMMON = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
              intermediate_size=96, bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=512)
MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
# Gemma: head_dim = query_pre_attn_scalar = 256, the one setting llama.cpp (1/sqrt(head_dim)) and transformers'
# GGUF reader (the config's default 256) agree on
GEMMA = dict(head_dim=256, query_pre_attn_scalar=256, sliding_window=8)

# GGUF architecture -> (transformers model_type, tiny settings)
CASES = {
    "llama": ("llama", dict(COMMON, head_dim=16)),
    "qwen2": ("qwen2", COMMON),
    "qwen3": ("qwen3", dict(COMMON, head_dim=128)),  # transformers reads no head_dim for qwen3: its default
    "qwen2moe": ("qwen2_moe", dict(COMMON, **MOE, shared_expert_intermediate_size=32, norm_topk_prob=False)),
    "qwen3moe": ("qwen3_moe", dict(COMMON, **MOE, head_dim=16, norm_topk_prob=True)),
    "gemma2": ("gemma2", dict(COMMON, **GEMMA, attn_logit_softcapping=50.0, final_logit_softcapping=30.0)),
    "gemma3": ("gemma3_text", dict(COMMON, **GEMMA, num_hidden_layers=6)),
    "lfm2": ("lfm2", dict(COMMON, num_hidden_layers=4, layer_types=["conv", "full_attention", "conv", "full_attention"],
                          block_multiple_of=32)),
    "gpt-oss": ("gpt_oss", dict(COMMON, head_dim=16, num_local_experts=4, num_experts_per_tok=2, intermediate_size=32,
                                sliding_window=8, rope_parameters={"rope_type": "default", "rope_theta": 150000.0})),
    "mamba": ("mamba", dict(hidden_size=64, num_hidden_layers=2, vocab_size=128, state_size=8, conv_kernel=4,
                            expand=2, time_step_rank=8, bos_token_id=1, eos_token_id=2, pad_token_id=0)),
}
# where transformers 5.23's GGUF reader reads llama.cpp's file whole (not: gpt-oss, its processor looks for
# ``ffn_*_projs`` tensors, which llama.cpp's converter does not write; qwen2moe / qwen3moe, it reads no expert
# width (``expert_feed_forward_length``) and builds its config's default 1408 / 768)
TRANSFORMERS_READS = ("llama", "qwen2", "qwen3", "gemma2", "gemma3", "lfm2", "mamba")

_built: dict = {}


def tiny(arch: str):
    if arch not in _built:
        mt, settings = CASES[arch]
        _built[arch] = tiny_hf(mt, settings)
    return _built[arch]


def logits(model, ids):
    with torch.no_grad():
        out = model(ids)
    return out[0] if isinstance(out, tuple) else out.logits


@pytest.mark.parametrize("arch", list(CASES))
def test_logits_equal_transformers(arch, tmp_path):
    hf = tiny(arch)
    path = tmp_path / "tiny.gguf"
    write_gguf(hf, arch, path)
    assert is_gguf(path)
    ours = load(path)
    ids = ids_of(21)
    ref = logits(hf, ids)
    assert_close(logits(ours, ids), ref, atol=1e-5 * ref.abs().max().item(), what=f"{arch} GGUF logits")
    assert ours.checkpoint["gguf"]["architecture"] == arch


@pytest.mark.parametrize("arch", TRANSFORMERS_READS)
def test_logits_equal_transformers_gguf_reader(arch, tmp_path):
    from transformers import AutoModelForCausalLM

    path = tmp_path / "tiny-q8.gguf"
    write_gguf(tiny(arch), arch, path, qtype=gguf.GGMLQuantizationType.Q8_0)
    assert "Q8_0" in gguf_stored_bytes(path)
    theirs = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32).eval()
    ids = ids_of(21)
    ref = logits(theirs, ids)
    assert_close(logits(load(path), ids), ref, atol=1e-5 * ref.abs().max().item(), what=f"{arch} Q8_0 GGUF logits")


@pytest.mark.parametrize("arch", list(CASES))
def test_header_counts_the_model(arch, tmp_path, monkeypatch):
    hf = tiny(arch)
    path = tmp_path / "tiny.gguf"
    write_gguf(hf, arch, path)
    import storelab.checkpoint.gguf.tensors as tensors

    monkeypatch.setattr(tensors, "read_tensor", lambda *a: pytest.fail("a tensor was read for the header"))
    cfg = read_model_config(path)
    held = {t.data_ptr(): t.numel() for t in hf.state_dict().values() if t.dtype.is_floating_point}
    assert count_params(cfg).stored == sum(held.values())
    d, file = read_hf_config(path)
    assert d["model_type"] == CASES[arch][0] and file == path
    assert {p.device.type for p in plan(path).model.parameters()} == {"meta"}


def _base(name: str) -> str:
    return name.removesuffix(".weight").removesuffix(".bias")


@pytest.mark.parametrize("arch", list(ARCH_OF))
def test_rule_names_are_gguf_pys(arch):
    """Each rule's GGUF names are gguf-py's (``TENSOR_NAMES``), and where gguf-py's ``TensorNameMap`` maps the
    rule's transformers name, it maps it onto the rule's GGUF name."""
    mt, settings = CASES[arch]
    from transformers import AutoConfig

    c = AutoConfig.for_model(mt, **settings).to_dict()
    c.setdefault("num_key_value_heads", c.get("num_attention_heads"))
    known = set(TENSOR_NAMES.values())
    name_map = gguf.get_tensor_name_map(ARCH_OF[arch], 2)
    for r in GGUF_ARCHS[arch].rules(c):
        for p in r.gguf:
            assert _base(p) in known, (arch, p)
        if len(r.gguf) == 1:
            mapped = name_map.get_name(r.hf.format(bid=0), try_suffixes=(".weight", ".bias"))
            assert mapped is None or _base(mapped) == _base(r.gguf[0].format(bid=0)), (arch, r.hf, mapped)


def test_split_gguf_and_a_missing_shard(tmp_path):
    hf = tiny("llama")
    write_gguf(hf, "llama", tmp_path / "tiny.gguf", split_max_tensors=8)
    files = sorted(p.name for p in tmp_path.iterdir())
    assert len(files) > 2 and files[0] == f"tiny-00001-of-{len(files):05d}.gguf"
    first = tmp_path / files[0]
    ids = ids_of(9)
    assert_close(logits(load(first), ids), logits(hf, ids), atol=1e-5 * logits(hf, ids).abs().max().item())
    assert len(read_header(tmp_path / files[1]).files) == len(files)
    (tmp_path / files[-1]).unlink()
    with pytest.raises(CheckpointError, match=files[-1]):
        read_model_config(first)


def _file(tmp_path, **kw):
    path = tmp_path / "tiny.gguf"
    write_gguf(tiny("qwen2"), "qwen2", path, **kw)
    return path


def test_bad_inputs(tmp_path):
    path = _file(tmp_path)
    raw = path.read_bytes()
    before = sorted(p.name for p in tmp_path.iterdir())

    bad = tmp_path / "magic.gguf"
    bad.write_bytes(b"GGUX" + raw[4:])
    with pytest.raises(CheckpointError, match="magic.gguf.*not a GGUF file"):
        read_model_config(bad)

    for cut in (10, 200, len(raw) // 8):
        short = tmp_path / f"cut{cut}.gguf"
        short.write_bytes(raw[:cut])
        with pytest.raises(CheckpointError, match=f"cut{cut}.gguf.*truncated"):
            load(short)

    short = tmp_path / "data.gguf"        # the header whole, the last tensor's bytes cut off
    short.write_bytes(raw[:-64])
    with pytest.raises(CheckpointError, match="data.gguf: tensor .* lie past the end"):
        read_model_config(short)

    h = read_header(path)                 # a tensor of an unknown GGML type: patch its u32 type
    name = next(iter(h.tensors)).encode()
    at = raw.index(name) + len(name)
    n_dims = struct.unpack_from("<I", raw, at)[0]
    typ = at + 4 + 8 * n_dims
    unknown = tmp_path / "type.gguf"
    unknown.write_bytes(raw[:typ] + struct.pack("<I", 99) + raw[typ + 4:])
    with pytest.raises(CheckpointError, match=f"type.gguf: tensor '{name.decode()}': unknown GGML tensor type 99"):
        read_model_config(unknown)

    key = b"qwen2.block_count"            # a missing metadata key: rename it
    renamed = tmp_path / "key.gguf"
    renamed.write_bytes(raw.replace(key, b"qwen2.block_cXunt"))
    with pytest.raises(CheckpointError, match="key.gguf: metadata key 'qwen2.block_count' missing"):
        read_model_config(renamed)

    arch = tmp_path / "arch.gguf"         # an architecture storelab does not read (same length: "qwen9")
    arch.write_bytes(raw.replace(b"qwen2", b"qwen9"))
    with pytest.raises(CheckpointError, match="arch.gguf: general.architecture 'qwen9' is not read .*llama"):
        read_model_config(arch)

    after = sorted(p.name for p in tmp_path.iterdir())
    assert set(before) <= set(after) and all(p.endswith(".gguf") for p in after)


def test_unread_tensor_and_missing_piece_are_named(tmp_path):
    hf = tiny("qwen3moe")
    path = tmp_path / "drop.gguf"
    write_gguf(hf, "qwen3moe", path, drop=("blk.1.ffn_up_exps.weight",))
    with pytest.raises(CheckpointError, match="drop.gguf: tensor 'blk.1.ffn_up_exps.weight' missing"):
        load(path)

    extra = tmp_path / "extra.gguf"
    w = gguf.GGUFWriter(str(extra), "qwen2")
    src = read_header(_file(tmp_path))
    for k, v in src.meta.items():
        if k.startswith("qwen2."):
            w.add_uint32(k, v) if isinstance(v, int) else w.add_float32(k, v)
    w.add_tensor("token_embd.weight", torch.zeros(128, 64).numpy())
    w.add_tensor("blk.0.attn_rot_embd.weight", torch.zeros(4).numpy())
    w.write_header_to_file(), w.write_kv_data_to_file(), w.write_tensors_to_file(), w.close()
    with pytest.raises(CheckpointError, match="extra.gguf: tensor 'blk.0.attn_rot_embd.weight': no rule"):
        plan(extra)


def test_arch_names_are_llama_cpps():
    assert set(GGUF_ARCHS) >= set(ARCH_OF)
    assert set(ARCH_OF) <= set(MODEL_ARCH_NAMES.values())
