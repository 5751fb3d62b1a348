"""GGUF files of ``gemma4`` (``storelab/checkpoint/gguf/archs_gemma4.py``) against transformers 5.23's tiny
``gemma4_text`` models (``tests/test_family_gemma4.py``'s settings, no per-layer inputs): each is saved, written as a
GGUF the way llama.cpp's converter writes it (``write_gemma4`` below, mirroring ``conversion/gemma.py``
``Gemma4Model``: the GGUFWriter calls it makes, no norm shift, ``rope_freqs.weight`` for proportional RoPE, the
router's and experts' scales as ``.scale`` tensors, no ``attn_v`` under ``attention_k_eq_v``), and then

* header: ``read_model_config`` of the GGUF gives the folder's layer kinds, parameter count and llama.cpp memory;
* logits: storelab's load of the GGUF equals transformers' logits (fp32);
* llama.cpp memory by hand for the dense file (V kept beside K on the values-from-keys layers, the SWA cells);
* the Gemma 4 pieces that cannot be mapped back are refused naming their GGUF key or tensor.
"""

from __future__ import annotations

import os

import gguf
import numpy as np
import pytest
import torch
from gguf.constants import MODEL_ARCH, MODEL_TENSOR as T, TENSOR_NAMES

from storelab.checkpoint import CheckpointError, read_model_config
from storelab.checkpoint.gguf.registry import GGUF_ARCHS
from storelab.models.engines import engine_layers
from tests.family_harness import tiny_hf
from tests.gguf_harness import built_fixture, check_header, check_logits
from tests.test_family_gemma4 import TINY

os.environ.setdefault("USE_HUB_KERNELS", "0")

CASES = {name: TINY[name] for name in ("dense_k_eq_v", "moe")}


def _raw(kind: T, bid: int = -1, suffix: str = ".weight") -> str:
    return TENSOR_NAMES[kind].format(bid=bid) + suffix


def _meta(w: gguf.GGUFWriter, h: dict) -> None:
    """``TextModel`` -> ``Gemma3Model`` -> ``Gemma4Model.set_gguf_parameters`` on config.json ``h``, the keys in the
    order they win."""
    w.add_block_count(h["num_hidden_layers"])
    w.add_context_length(h["max_position_embeddings"])
    w.add_embedding_length(h["hidden_size"])
    w.add_feed_forward_length(h["intermediate_size"])
    w.add_head_count(h["num_attention_heads"])
    w.add_rope_freq_base(h["rope_parameters"]["full_attention"]["rope_theta"])
    w.add_rope_freq_base_swa(h["rope_parameters"]["sliding_attention"]["rope_theta"])
    w.add_layer_norm_rms_eps(h["rms_norm_eps"])
    if h.get("num_experts") is not None:
        w.add_expert_count(h["num_experts"])
    if h.get("top_k_experts") is not None:
        w.add_expert_used_count(h["top_k_experts"])
    if h.get("final_logit_softcapping"):
        w.add_final_logit_softcapping(h["final_logit_softcapping"])
    w.add_sliding_window(h["sliding_window"])
    w.add_shared_kv_layers(h["num_kv_shared_layers"])
    w.add_embedding_length_per_layer_input(h.get("hidden_size_per_layer_input") or 0)
    swa = [t == "sliding_attention" for t in h["layer_types"]]
    w.add_sliding_window_pattern(swa)
    w.add_key_length(h["global_head_dim"])
    w.add_value_length(h["global_head_dim"])
    w.add_key_length_swa(h["head_dim"])
    w.add_value_length_swa(h["head_dim"])
    if h.get("moe_intermediate_size") is not None:
        w.add_expert_feed_forward_length(h["moe_intermediate_size"])
    if h.get("num_global_key_value_heads") is not None:
        w.add_head_count_kv([h["num_key_value_heads"] if s else h["num_global_key_value_heads"] for s in swa])
    else:
        w.add_head_count_kv(h["num_key_value_heads"])
    w.add_rope_dimension_count(h["global_head_dim"])
    w.add_rope_dimension_count_swa(int(h["head_dim"] * h.get("partial_rotary_factor", 1.0)))


def _tensors(hf, h: dict) -> dict[str, torch.Tensor]:
    """``Gemma4Model.filter_tensors`` / ``modify_tensors`` / ``generate_extra_tensors``."""
    c = hf.config
    name_map = gguf.get_tensor_name_map(MODEL_ARCH.GEMMA4, c.num_hidden_layers)
    out: dict[str, torch.Tensor] = {}
    for name, w in hf.state_dict().items():
        w = w.detach().float().clone()
        bid = int(name.split(".")[2]) if ".layers." in name else -1
        if name == "lm_head.weight" and c.tie_word_embeddings:
            continue
        if name.endswith("router.scale"):
            out[_raw(T.FFN_GATE_INP, bid, ".scale")] = w
        elif name.endswith("router.per_expert_scale"):
            out[_raw(T.FFN_DOWN_EXP, bid, ".scale")] = w
        else:
            gname = name_map.get_name(name, try_suffixes=(".weight", ".bias"))
            assert gname is not None, name
            out[gname if gname.endswith((".weight", ".bias")) else gname + ".weight"] = w
    d = h["global_head_dim"]
    rot = int(d * h["rope_parameters"]["full_attention"]["partial_rotary_factor"] / 2)
    out[_raw(T.ROPE_FREQS)] = torch.tensor([1.0] * rot + [1e30] * (d // 2 - rot))
    return out


def write_gemma4(hf, settings: dict, path, *, meta: dict | None = None, drop: tuple[str, ...] = (),
                 replace: dict | None = None) -> None:
    """``hf`` as a gemma4 GGUF (F32), read as the converter reads Google's config.json: transformers 5.23 saves
    ``global_head_dim`` / ``num_global_key_value_heads`` as ``per_layer_config``, so the published names come from
    ``settings`` over the config's own fields. ``meta`` adds or overrides ``gemma4.*`` keys, ``drop`` / ``replace``
    tensors."""
    h = {**hf.config.to_dict(), **settings}
    w = gguf.GGUFWriter(str(path), "gemma4")
    w.add_name("tiny gemma4")
    w.add_tokenizer_model("llama")
    V = hf.config.vocab_size
    w.add_token_list([f"<t{i}>" for i in range(V)])
    w.add_token_scores([0.0] * V)
    w.add_token_types([gguf.TokenType.NORMAL] * V)
    w.add_bos_token_id(1), w.add_eos_token_id(2)
    _meta(w, h)
    for k, v in (meta or {}).items():
        key = f"gemma4.{k}"
        w.kv_data[0].pop(key, None)
        w.add_array(key, v) if isinstance(v, list) else w.add_uint32(key, v)
    for name, t in {**_tensors(hf, h), **(replace or {})}.items():
        if name not in drop:
            w.add_tensor(name, t.numpy().astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _make(name: str, folder):
    hf = tiny_hf("gemma4_text", CASES[name])
    hf.save_pretrained(folder)
    path = folder / f"{name}.gguf"
    write_gemma4(hf, CASES[name], path)
    return hf, path


built = built_fixture(_make)


@pytest.mark.parametrize("name", list(CASES))
def test_header(built, name):
    _, folder, path = built(name)
    check_header(folder, path)


@pytest.mark.parametrize("name", list(CASES))
def test_logits(built, name):
    hf, _, path = built(name)
    check_logits(hf, path, 21, f"gemma4 {name} GGUF logits")


def test_config_read(built):
    _, _, path = built("dense_k_eq_v")
    toks = [lay.token for lay in read_model_config(path).layers]
    assert [a.KIND for a in toks] == ["window", "window", "attention", "window", "attention"]
    glob, loc = toks[2], toks[0]
    assert (glob.head_dim, glob.n_kv_heads, glob.values_from_keys, glob.rope_theta) == (32, 1, True, 1e6)
    assert glob.rope_scaling["rope_type"] == "proportional" and glob.rope_scaling["partial_rotary_factor"] == 0.25
    assert (loc.head_dim, loc.n_kv_heads, loc.values_from_keys, loc.window, loc.rope_theta) == (16, 2, False, 5, 1e4)
    _, _, moe = built("moe")
    lay = read_model_config(moe).layers[2]
    assert lay.channel.KIND == "mlp_experts" and (lay.channel.n_experts, lay.channel.top_k) == (8, 2)
    assert not lay.token.values_from_keys and lay.token.n_kv_heads == 2


def test_rule_names_are_gguf_pys():
    """Each rule's GGUF name is gguf-py's, and where gguf-py maps the transformers name, onto the rule's name."""
    c = {"num_attention_heads": 4, "num_key_value_heads": 2}
    known = set(TENSOR_NAMES.values())
    name_map = gguf.get_tensor_name_map(MODEL_ARCH.GEMMA4, 2)
    allowed = {TENSOR_NAMES[k] for k in gguf.MODEL_TENSORS[MODEL_ARCH.GEMMA4]}
    for r in GGUF_ARCHS["gemma4"].rules(c):
        for p in r.gguf:
            base = p.rsplit(".", 1)[0]
            assert base in known, p
            assert base in allowed or base in (TENSOR_NAMES[T.FFN_GATE_EXP], TENSOR_NAMES[T.FFN_UP_EXP]), p
        if len(r.gguf) == 1 and r.fn is None:
            mapped = name_map.get_name(r.hf.format(bid=0), try_suffixes=(".weight", ".bias"))
            assert mapped is None or mapped.removesuffix(".weight") == r.gguf[0].format(bid=0).removesuffix(".weight")


def test_llama_cpp_memory_by_hand(built):
    """llama.cpp's gemma4 graph keeps V beside K on the values-from-keys layers (``Vcur`` = the raw key projection,
    RMS-normed; ``Kcur`` normed and rotated): f16 K + V of the full layers' 1 head of 32, the window layers' 2
    heads of 16. ``-c 10000 -np 2``: n_ctx = pad(10,000, 256) = 10,240, 5,120 cells per sequence on the full
    layers, pad(min(5120, 6 + 512), 256) = 768 on the window layers (n_swa = sliding_window 6)."""
    _, _, path = built("dense_k_eq_v")
    got = [r["bytes"] for r in engine_layers(read_model_config(path), 5000, batch=2, engine="llama.cpp")["layers"]]
    full, window = 2 * 5120 * (1 * 32 * 2) * 2, 2 * 768 * (2 * 16 * 2) * 2
    assert got == [window, window, full, window, full] == [196_608, 196_608, 1_310_720, 196_608, 1_310_720]


@pytest.mark.parametrize("meta, drop, match", [
    ({"embedding_length_per_layer_input": 8}, (), "gemma4.embedding_length_per_layer_input"),
    ({"attention.shared_kv_layers": 2}, (), "gemma4.attention.shared_kv_layers"),
    ({"feed_forward_length": [96, 96, 96, 192, 192]}, (), "gemma4.feed_forward_length"),
    ({"attention.sliding_window_pattern": [True, True, False, False, True]}, (), "a full-attention last layer"),
    ({"rope.dimension_count_swa": 8}, (), "gemma4.rope.dimension_count_swa"),
    ({}, ("blk.0.attn_v.weight",), "'blk.0.attn_v.weight' missing on a window layer"),
    ({}, ("blk.2.attn_v.weight",), r"full layers \[4\] hold attn_v and \[2\] do not"),
    ({}, ("rope_freqs.weight",), "tensor 'rope_freqs.weight' missing"),
])
def test_refused_by_name(built, tmp_path, meta, drop, match):
    """(The moe model: its full layers hold attn_v.)"""
    hf, _, _ = built("moe")
    path = tmp_path / "bad.gguf"
    write_gemma4(hf, CASES["moe"], path, meta=meta, drop=drop)
    with pytest.raises(CheckpointError, match=match):
        read_model_config(path)


def test_unknown_rope_factors_are_refused(built, tmp_path):
    hf, _, _ = built("moe")
    path = tmp_path / "bad.gguf"
    write_gemma4(hf, CASES["moe"], path, replace={"rope_freqs.weight": torch.tensor([1.0, 2.0] + [1e30] * 14)})
    with pytest.raises(CheckpointError, match="not Gemma 4's proportional RoPE factors"):
        read_model_config(path)


def test_missing_per_expert_scale_is_one(built, tmp_path):
    """A file without ``ffn_down_exps.scale`` (the converter's NVFP4 path folds it into the experts): scales of 1."""
    hf, _, _ = built("moe")
    ones = {n: torch.ones_like(b) for n, b in hf.named_parameters() if n.endswith("per_expert_scale")}
    path = tmp_path / "folded.gguf"
    with torch.no_grad():
        saved = {n: p.clone() for n, p in hf.named_parameters() if n in ones}
        for n, p in hf.named_parameters():
            if n in ones:
                p.copy_(ones[n])
        try:
            write_gemma4(hf, CASES["moe"], path, drop=tuple(_raw(T.FFN_DOWN_EXP, i, ".scale") for i in range(5)))
            check_logits(hf, path, 13, "gemma4 without per-expert scales")
        finally:
            for n, p in hf.named_parameters():
                if n in saved:
                    p.copy_(saved[n])


LLAMA_CPP = """
import sys, numpy as np, llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=int(sys.argv[2]), swa_full=False, flash_attn=True,
                      logits_all=True, n_threads=1, verbose=True)
ids = [int(x) for x in sys.argv[3].split(",")]
llm.eval(ids)
np.save(sys.argv[4], np.array(llm.scores[:len(ids)], dtype=np.float32))
"""


@pytest.mark.parametrize("name", list(CASES))
def test_llama_cpp_reads_the_file(built, tmp_path, name):
    """The oracle for the writer and for the memory rule: llama.cpp itself (llama-cpp-python's build) loads the file,
    its logits are transformers' (to its f16 KV cache's precision), and the KV caches it logs are storelab's
    llama.cpp figures, cells and MiB: with ``-c 1000``, n_ctx = 1,024 cells on the full layers, pad(min(1024,
    6 + 512), 256) = 768 on the window layers (``swa_full`` off), f16 K and V on every layer, the values-from-keys
    layers included. Flash attention on, as llama-server's default ``-fa auto`` resolves on CPU and CUDA: without it
    llama.cpp keeps V transposed and pads every layer's V to the widest layer's (``[TAG_V_CACHE_VARIABLE]``: the
    moe file's window layers to 2 x 32, the 31B's global layers to 16 x 256), which storelab's rule does not model."""
    import re
    import subprocess
    import sys

    pytest.importorskip("llama_cpp")
    hf, _, path = built(name)
    ids = [5, 17, 3, 99, 42, 7, 8, 120, 64, 33, 11, 12, 13]
    out = tmp_path / "logits.npy"
    run = subprocess.run([sys.executable, "-c", LLAMA_CPP, str(path), "1000", ",".join(map(str, ids)), str(out)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
    got = torch.from_numpy(np.load(out))
    assert (got - ref).abs().max() < 1e-2 * ref.abs().max(), "llama.cpp's logits of the GGUF"
    logged = [(int(c), int(n), float(mib)) for mib, c, n in
              re.findall(r"llama_kv_cache: size = +([\d.]+) MiB \( *(\d+) cells, +(\d+) layers", run.stderr)]
    cfg = read_model_config(path)
    rec = engine_layers(cfg, 1000, batch=1, engine="llama.cpp")["layers"]
    ours = []
    for kind, cells in (("attention", 1024), ("window", 768)):
        mine = [r["bytes"] for r, lay in zip(rec, cfg.layers) if lay.token.KIND == kind]
        ours.append((cells, len(mine), round(sum(mine) / 2**20, 2)))
    assert logged == ours
