"""The fast decode step (``storelab.models.decode.Decoder``) against the general path (``model(ids, cache)``),
and the bf16 / int8 weights (``storelab.models.quant``) against fp32.

Exact: after the same prefill, each step's logits equal the general path's to fp32 rounding (2e-5 of the
logits' largest magnitude: the products' sums run in another order) and so does every tensor of the cache
afterwards; the counters (``seen``) are equal. On every tiny zoo model (full attention, windows with sinks,
MLA, DSA, recurrent stores, MoE, Engram, mHC: the layers the fast step does not compute run as the general
path runs them), on a tiny Llama and a Gemma 3 (windows and global layers, sandwich norms, q/k norms) saved
by transformers and read from their folders, and on a hybrid written here: Gated DeltaNet, a window of 4
(the ring buffer wraps during the steps) and full attention.

Quantised weights (tolerances stated): bf16 logits within 2 % and int8 within 8 % of the logits' scale of
fp32's, and the greedy tokens of a short prompt equal fp32's for bf16 (int8: at least 6 of 8 on the tiny
Llama, whose random weights have no margin to spare); the int8 matrix-vector kernel equals the dequantized
weight's product to fp32 rounding.
"""

from __future__ import annotations

import pytest
import torch

from storelab.models.config import LayerConfig, ModelConfig
from storelab.models.decode import Decoder
from storelab.models.model import Model, generate, prefill
from storelab.models.quant import QuantLinear, quantize_weights
from storelab.ops.matvec import RowSplit, matvec, pack
from storelab.state import _tensors
from storelab.stores import build_store
from storelab.zoo import load_zoo, zoo_names
from tests.helpers import assert_close

STEPS = 6
REL = 2e-5  # of the logits' largest magnitude


def _states(cache) -> dict:
    """Every tensor and counter of a cache by path (a row buffer's unfilled rows are not state)."""
    out = {}
    for i, lay in enumerate(cache):
        out[f"{i}.seen"] = lay.seen
        for slot in ("token", "channel", "lookup"):
            st = getattr(lay, slot)
            if st is None:
                continue
            out[f"{i}.{slot}.seen"] = getattr(st, "seen", None)
            for path, t in _tensors(st, f"{i}.{slot}", set()):
                if "._rows" not in path:
                    out[path] = t
    return out


def _compare(model: Model, prompt, *, steps: int = STEPS, chunk: int = 0, what: str = "") -> None:
    """Prefill, then ``steps`` tokens by the general path and by the Decoder; logits and states equal."""
    torch.manual_seed(0)
    with torch.no_grad():
        logits, ref_cache = prefill(model, prompt, chunk=chunk)
        _, fast_cache = prefill(model, prompt, chunk=chunk)
        dec = Decoder(model)
        tok = logits.argmax(-1, keepdim=True)
        for s in range(steps):
            ref = model(tok, ref_cache)[0][:, -1]
            got = dec.step(tok, fast_cache)
            assert_close(got, ref, atol=REL * ref.abs().max().item(), what=f"{what} step {s} logits")
            tok = ref.argmax(-1, keepdim=True)
    a, b = _states(ref_cache), _states(fast_cache)
    assert a.keys() == b.keys(), f"{what}: state fields differ"
    for k, v in a.items():
        if isinstance(v, torch.Tensor) and not v.is_floating_point():
            assert torch.equal(b[k], v), f"{what} {k}: differs"
        elif isinstance(v, torch.Tensor):
            assert_close(b[k], v, atol=REL * max(v.abs().max().item(), 1.0) if v.numel() else 0, what=f"{what} {k}")
        else:
            assert b[k] == v, f"{what} {k}: {b[k]} != {v}"


def _tiny(name: str) -> Model:
    torch.manual_seed(0)
    return Model(load_zoo(name, tiny=True)).eval()


@pytest.mark.parametrize("name", zoo_names())
def test_zoo_models_fast_step_equals_general_path(name):
    model = _tiny(name)
    prompt = torch.randint(0, model.cfg.vocab_size, (1, 11), generator=torch.Generator().manual_seed(1))
    _compare(model, prompt, chunk=4, what=name)


def _hybrid() -> Model:
    """Gated DeltaNet, a window of 4 with sinks (the ring wraps during the steps) and full GQA attention."""
    D = 32
    ffn = {"kind": "ffn", "d_model": D, "d_ff": 48}
    rec = build_store({"kind": "gated_deltanet", "d_model": D, "n_heads": 2, "head_k_dim": 8})
    win = build_store({"kind": "window", "d_model": D, "n_heads": 4, "n_kv_heads": 2, "head_dim": 8, "window": 4,
                       "sink": True, "qk_norm": True})
    full = build_store({"kind": "attention", "d_model": D, "n_heads": 4, "n_kv_heads": 1, "head_dim": 8,
                        "v_head_dim": 12, "qkv_bias": True})
    depth = build_store({"kind": "residual", "d_model": D})
    layers = [LayerConfig(token=t, channel=build_store(ffn), depth=depth) for t in (rec, win, full, win)]
    cfg = ModelConfig(name="hybrid", d_model=D, vocab_size=64, layers=layers)
    torch.manual_seed(0)
    model = Model(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # norms and sinks away from their initial ones, so each shows
            p.add_(0.1 * torch.randn_like(p))
    return model


def test_hybrid_with_recurrent_state_and_window_cache():
    model = _hybrid()
    dec = Decoder(model)
    assert dec.fast_layers() == 4  # the recurrent layer's store runs generically inside a fast layer
    prompt = torch.randint(0, 64, (1, 7), generator=torch.Generator().manual_seed(2))
    _compare(model, prompt, steps=9, chunk=3, what="hybrid")


def test_hybrid_from_an_empty_cache():
    """The first step of all (no prefill): every state made by the step itself."""
    model = _hybrid()
    with torch.no_grad():
        ref = model(torch.tensor([[5]]))[0][:, -1]
        got = Decoder(model).step(torch.tensor([[5]]), model.new_cache())
    assert_close(got, ref, atol=REL * ref.abs().max().item(), what="first step")


# -- models read from transformers folders -------------------------------------------------------------
TINY_HF = {
    "llama": dict(hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                  intermediate_size=96, vocab_size=128, max_position_embeddings=256, tie_word_embeddings=True),
    "gemma3_text": dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                        intermediate_size=96, vocab_size=128, max_position_embeddings=512, sliding_window=6,
                        query_pre_attn_scalar=24, sliding_window_pattern=2, rope_theta=10000.0,
                        rope_local_base_freq=100.0, bos_token_id=1, eos_token_id=2, pad_token_id=0),
}


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    from tests.family_harness import tiny_hf

    made = {}

    def get(model_type: str):
        if model_type not in made:
            d = tmp_path_factory.mktemp(model_type)
            tiny_hf(model_type, TINY_HF[model_type], perturb=0.3).save_pretrained(d)
            made[model_type] = d
        return made[model_type]
    return get


def _load(folder, **kw):
    from storelab.checkpoint import load

    return load(folder, dtype="fp32", **kw).eval()


@pytest.mark.parametrize("model_type", list(TINY_HF))
def test_hf_folder_fast_step_equals_general_path(model_type, hf_folder):
    model = _load(hf_folder(model_type))
    assert Decoder(model).fast_layers() == model.cfg.n_layers
    prompt = torch.randint(0, 128, (1, 10), generator=torch.Generator().manual_seed(3))
    _compare(model, prompt, steps=8, chunk=4, what=model_type)


def test_generate_fast_equals_general(hf_folder):
    model = _load(hf_folder("gemma3_text"))
    prompt = torch.randint(0, 128, (1, 9), generator=torch.Generator().manual_seed(4))
    fast, _ = generate(model, prompt, 10, chunk=4)
    slow, _ = generate(model, prompt, 10, chunk=4, fast=False)
    assert torch.equal(fast, slow)


def test_hf_folders_take_the_c_kernels_and_equal_torch_s_forms(hf_folder):
    """Where the C library is built (CI builds it), every attention layer of the tiny Llama and Gemma 3 reads through
    ``attend_one_f32`` and prepares q and k in one call, the norms are one call, and ``STORELAB_COMPILED=0``'s
    torch forms give the same logits (so the comparisons above ran the C kernels)."""
    from storelab.models import decode

    if decode._kernels() is None:
        pytest.skip("no C compiler here: the torch forms run (tested above)")
    for model_type in TINY_HF:
        model = _load(hf_folder(model_type))
        dec = Decoder(model)
        for lay in dec.layers:
            assert lay.token.attend_one is not None and lay.token.prepare is not None, model_type
        prompt = torch.randint(0, 128, (1, 10), generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            logits, c1 = prefill(model, prompt, chunk=4)
            _, c2 = prefill(model, prompt, chunk=4)
            tok = logits.argmax(-1, keepdim=True)
            got = dec.step(tok, c1)
            lib, decode._kernels = decode._kernels, lambda: None
            try:
                want = Decoder(model).step(tok, c2)
            finally:
                decode._kernels = lib
        assert_close(got, want, atol=REL * want.abs().max().item(), what=f"{model_type}: C kernels against torch's")


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("H, G, K, V, L, sinks, new", [(9, 3, 64, 64, 300, False, False), (4, 1, 16, 24, 70, True, True),
                                                       (6, 6, 8, 8, 1, True, False), (4, 2, 32, 32, 0, False, True),
                                                       (4, 2, 128, 128, 1000, True, True)])
def test_attend_one_equals_the_reference_softmax(H, G, K, V, L, sinks, new, threads):
    """The C read over strided cache views (a shared row buffer), GQA, K != V, sinks, a new entry not yet written,
    an empty cache, and scores far apart (the running max rescales): the reference softmax's output to fp32 rounding,
    on one thread or with the rows split between torch's threads (where there are two blocks of rows per thread)."""
    from storelab.models import decode
    from storelab.ops.attention import attend_reference

    if decode._kernels() is None:
        pytest.skip("no C compiler here")
    g = torch.Generator().manual_seed(L + H)
    buf = torch.randn(1, L + 5, G, V + K, generator=g) * 3
    k_rows, v_rows = buf[:, :L, :, V:], buf[:, :L, :, :V]
    q = torch.randn(1, 1, H, K, generator=g) * 2
    k_new, v_new = (torch.randn(1, 1, G, K, generator=g), torch.randn(1, 1, G, V, generator=g)) if new else (None, None)
    s_H = torch.randn(H, generator=g) if sinks else None
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = decode._AttendOne.make(H, G, K, V, 0.3, s_H)(q, k_rows, v_rows, k_new, v_new)
    finally:
        torch.set_num_threads(before)
    k_all = k_rows if k_new is None else torch.cat([k_rows, k_new], 1)
    v_all = v_rows if v_new is None else torch.cat([v_rows, v_new], 1)
    want = attend_reference(q, k_all, v_all, scale=0.3, sinks_H=s_H).reshape(-1)
    assert_close(got, want, atol=2e-6 * max(1.0, want.abs().max().item()), what="attend_one")


def test_attend_parts_over_disjoint_rows_merge_into_one_softmax():
    """``attend_part_f32`` over three row ranges (one of them empty, one holding the new entry) and
    ``attend_finish_f32`` merging them, with sinks, equal the reference softmax over all rows; the finish writes the
    new entry into its cache row."""
    from storelab.models import decode
    from storelab.ops.attention import attend_reference

    lib = decode._kernels()
    if lib is None:
        pytest.skip("no C compiler here")
    H, G, K, V, L = 4, 2, 16, 16, 150
    g = torch.Generator().manual_seed(7)
    buf = torch.randn(1, L + 1, G, V + K, generator=g) * 3
    buf[:, L] = 0.0
    k_rows, v_rows = buf[:, :L, :, V:], buf[:, :L, :, :V]
    q, s_H = torch.randn(1, 1, H, K, generator=g) * 2, torch.randn(H, generator=g)
    k_new, v_new = torch.randn(1, 1, G, K, generator=g), torch.randn(1, 1, G, V, generator=g)
    stride = lib.attend_work_floats(H, V)
    works = torch.empty(3 * stride)
    e, row, head = 4, buf.stride(1), buf.stride(2)
    kp, vp = buf.data_ptr() + V * e, buf.data_ptr()
    for i, (r0, r1) in enumerate([(0, 70), (70, 70), (70, L + 1)]):
        lib.attend_part_f32(q.data_ptr(), kp, vp, k_new.data_ptr(), v_new.data_ptr(), works.data_ptr() + i * stride * e,
                            H, G, K, V, L, r0, r1, row, head, row, head, 0.3)
    out = torch.empty(H * V)
    lib.attend_finish_f32(works.data_ptr(), 3, stride, s_H.data_ptr(), out.data_ptr(), H, V, G, K, k_new.data_ptr(),
                          v_new.data_ptr(), kp + L * row * e, vp + L * row * e, head, head)
    want = attend_reference(q, torch.cat([k_rows, k_new], 1), torch.cat([v_rows, v_new], 1), scale=0.3,
                            sinks_H=s_H).reshape(-1)
    assert_close(out, want, atol=2e-6 * max(1.0, want.abs().max().item()), what="merged parts")
    assert torch.equal(buf[0, L, :, V:], k_new[0, 0]) and torch.equal(buf[0, L, :, :V], v_new[0, 0])


def test_the_prepare_and_swiglu_kernels_equal_torch():
    from storelab.models import decode
    from storelab.ops.rope import rope_angles, rotate

    lib = decode._kernels()
    if lib is None:
        pytest.skip("no C compiler here")
    H, G, K, R = 4, 2, 32, 16
    g = torch.Generator().manual_seed(0)
    qk = torch.randn(H + G, K, generator=g)
    qw, kw = torch.rand(K, generator=g) + 0.5, torch.rand(K, generator=g) + 0.5
    cos, sin = rope_angles(torch.tensor([37]), R, 10000.0)
    normed = torch.cat([torch.nn.functional.rms_norm(qk[:H], (K,), qw, 1e-6),
                        torch.nn.functional.rms_norm(qk[H:], (K,), kw, 1e-6)])
    want = rotate(normed.view(1, 1, H + G, K), cos, sin).view(H + G, K)
    got = qk.clone()
    lib.qk_prepare_f32(got.data_ptr(), H, G, K, qw.data_ptr(), kw.data_ptr(), 1e-6, R, cos.data_ptr(), sin.data_ptr())
    assert_close(got, want, atol=1e-6 * want.abs().max().item(), what="qk_prepare")
    gu = torch.randn(2 * 100, generator=g) * 6
    out = torch.empty(100)
    lib.silu_mul_f32(gu.data_ptr(), out.data_ptr(), 100)
    want = torch.nn.functional.silu(gu[:100]) * gu[100:]
    assert_close(out, want, atol=1e-6 * want.abs().max().item(), what="silu_mul")


# -- bf16 and int8 weights ---------------------------------------------------------------------------------------
def test_int8_kernel_equals_dequantized_product():
    g = torch.Generator().manual_seed(5)
    w, x, b = torch.randn(203, 77, generator=g), torch.randn(77, generator=g), torch.randn(203, generator=g)
    for fmt in ("fp32", "bf16", "int8"):
        pw = pack(w, fmt, b)
        for threads in (1, 2, 3, 8):  # 8: more than 203 rows give at 64 a thread, so three run
            out = matvec(pw, x, torch.empty(203), RowSplit(threads))
            ref = pw.dequantize().double() @ x.double() + b.double()
            assert_close(out, ref.float(), atol=1e-5 * ref.abs().max().item(), what=f"{fmt} x{threads}")
    q = pack(w, "int8")
    assert q.data_NK.dtype == torch.int8 and q.data_NK.abs().max() == 127
    assert_close(q.dequantize(), w, atol=(w.abs().amax(1) / 127 / 2).max().item() * 1.0001, what="int8 rounding")


@pytest.mark.parametrize("fmt,within,tokens", [("bf16", 0.02, 8), ("int8", 0.08, 6)])
def test_quantized_weights_against_fp32(fmt, within, tokens, hf_folder):
    ref_model = _load(hf_folder("llama"))
    model = quantize_weights(_load(hf_folder("llama")), fmt)
    n_q = sum(isinstance(m, QuantLinear) for m in model.modules())
    assert n_q == 7 * 3 + 1  # q, k, v, o, gate, up, down per layer, and the LM head
    prompt = torch.randint(0, 128, (1, 12), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        ref = ref_model(prompt)[0]
        got = model(prompt)[0]
    assert_close(got, ref, atol=within * ref.abs().max().item(), what=f"{fmt} prefill logits")
    _compare(model, prompt, chunk=5, what=f"{fmt} fast step")  # the fast step on packed weights: exact again
    a, _ = generate(ref_model, prompt, 8)
    b, _ = generate(model, prompt, 8)
    assert int((a == b).sum()) >= tokens, f"{fmt}: greedy tokens {b.tolist()} against fp32's {a.tolist()}"


def test_quantize_refuses_other_formats():
    with pytest.raises(ValueError, match="weights"):
        quantize_weights(_tiny("qwen3.8"), "int4")


# -- the engines bench's plumbing (its figures are benchmarks, never timed here) -------------------------------
def test_engines_ratios_and_model_argument():
    from storelab.bench.engines import _ratios, resolve_gguf

    rows = [{"engine": "storelab fp32", "threads": 1, "prefill_tok_s": 300.0, "decode_tok_s": 15.0},
            {"engine": "transformers fp32", "threads": 1, "prefill_tok_s": 200.0, "decode_tok_s": 10.0}]
    (r,) = _ratios(rows)
    assert (r["prefill"], r["decode"], r["peer"]) == (1.5, 1.5, "transformers fp32")
    with pytest.raises(ValueError, match="neither a .gguf file nor an installed real subject"):
        resolve_gguf("no-such-model")


def test_bench_engines_needs_a_model():
    from typer.testing import CliRunner

    from storelab.cli import app

    out = CliRunner().invoke(app, ["bench", "engines"])
    assert out.exit_code != 0 and "MODEL is needed" in out.output


def test_gguf_f32_copy_holds_the_dequantized_weights(tmp_path):
    """``bench engines --f32``: the copy's tensors are the original's dequantized ones, its metadata the same, and a
    model loaded from it gives the original's logits exactly; the copy is made once and then reused."""
    import gguf

    from storelab.bench.gguf_f32 import f32_copy
    from storelab.checkpoint import load
    from tests.gguf_writer import write_gguf
    from tests.test_gguf import tiny

    src = tmp_path / "tiny-q8.gguf"
    write_gguf(tiny("qwen3"), "qwen3", src, qtype=gguf.GGMLQuantizationType.Q8_0)
    out = f32_copy(src, tmp_path / "cache")
    a, b = gguf.GGUFReader(src), gguf.GGUFReader(out)
    assert {t.tensor_type for t in a.tensors} > {gguf.GGMLQuantizationType.F32}
    assert {t.tensor_type for t in b.tensors} == {gguf.GGMLQuantizationType.F32}
    for ta, tb in zip(a.tensors, b.tensors):
        assert ta.name == tb.name and list(ta.shape) == list(tb.shape)
        assert (gguf.quants.dequantize(ta.data, ta.tensor_type) == tb.data).all()
    keep = [k for k in a.fields if not k.startswith("GGUF.") and k != "general.file_type"]
    assert all(a.fields[k].contents() == b.fields[k].contents() for k in keep)
    assert b.fields["general.file_type"].contents() == 0
    ids = torch.tensor([[3, 9, 27, 81, 5]])
    with torch.no_grad():
        assert torch.equal(load(str(src), dtype="fp32")(ids)[0], load(str(out), dtype="fp32")(ids)[0])
    mtime = out.stat().st_mtime_ns
    assert f32_copy(src, tmp_path / "cache") == out and out.stat().st_mtime_ns == mtime
    assert not list((tmp_path / "cache").glob("*.tmp*"))


# -- a run of layers in one C call (layer_run_f32) ---------------------------------------------------------------
def test_runs_of_layers_take_the_whole_step_in_c(hf_folder):
    """Where the C library is built, every layer of the tiny Llama and Gemma 3 (windows, sandwich norms, q/k norms,
    geglu_tanh) and three of the hybrid's four (the recurrent one runs in Python between two runs) are computed by
    ``layer_run_f32``, the head too; ``STORELAB_COMPILED=0``'s torch forms give the same logits."""
    from storelab.models import decode

    if decode._kernels() is None:
        pytest.skip("no C compiler here")
    for model_type in TINY_HF:
        model = _load(hf_folder(model_type))
        dec = Decoder(model)
        assert dec.c_layers() == model.cfg.n_layers and dec.runs.head is not None, model_type
    assert Decoder(_hybrid()).c_layers() == 3


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_runs_split_between_threads_equal_the_general_path(threads):
    """The run's phases cut between 1, 2 and 3 threads (heads, rows, the cache's rows in parts once the context
    holds two blocks per thread: a prompt of 420 tokens), a window ring that has wrapped, GQA with K != V, biases,
    sinks: the general path's logits and states to fp32 rounding."""
    from storelab.models import decode

    if decode._kernels() is None:
        pytest.skip("no C compiler here")
    model = _hybrid()
    prompt = torch.randint(0, 64, (1, 420), generator=torch.Generator().manual_seed(8))
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        assert Decoder(model).runs.threads == threads
        _compare(model, prompt, steps=4, chunk=128, what=f"hybrid x{threads}")
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("fmt", ["bf16", "int8"])
def test_runs_take_packed_weights(fmt, hf_folder):
    """bf16 and int8 weights in the run (their own kernels, scales per row): the general path on the same packed
    weights, to fp32 rounding."""
    from storelab.models import decode

    if decode._kernels() is None:
        pytest.skip("no C compiler here")
    model = quantize_weights(_load(hf_folder("gemma3_text")), fmt)
    assert Decoder(model).c_layers() == model.cfg.n_layers
    prompt = torch.randint(0, 128, (1, 10), generator=torch.Generator().manual_seed(9))
    _compare(model, prompt, steps=5, chunk=4, what=f"gemma3 {fmt}")


def test_engines_bytes_a_step_reads(hf_folder):
    """The engines bench's yardstick: a step reads every weight once (the tied head and embedding once), a packed
    weight in its own format; the linear layers' prefill FLOPs leave the LM head out."""
    from storelab.bench.engines import _linear_flops, _step_bytes

    model = _load(hf_folder("llama"))
    assert model.lm_head.weight is model.embed.weight
    params = {p.data_ptr(): p.numel() * 4 for p in model.parameters()}
    assert _step_bytes(model) == sum(params.values()) + sum(b.numel() * b.element_size() for b in model.buffers())
    D, F, L = 64, 96, 3
    per_layer = D * 64 + 2 * D * 32 + 64 * D + 3 * D * F   # q, k and v (2 of 4 heads' width), o, gate/up/down
    assert _linear_flops(model) == 2.0 * L * per_layer
    q = quantize_weights(_load(hf_folder("llama")), "int8")
    linear = sum(m.packed.nbytes() for m in q.modules() if isinstance(m, QuantLinear))
    norms = sum(p.numel() * 4 for n, p in q.named_parameters() if "norm" in n)
    assert _step_bytes(q) >= linear + norms and _step_bytes(q) < _step_bytes(model) / 2


def test_engines_bench_probes_llama_cpp_in_a_child(tmp_path, monkeypatch):
    """A llama.cpp that dies in native code (SIGILL in its AMX path on one of our machines) or fails is found by a
    probe in a child process and its rows skipped with the reason, instead of ending the bench."""
    from storelab.bench import engines

    monkeypatch.setattr(engines, "_PROBE", "import os, signal; os.kill(os.getpid(), signal.SIGILL)")
    assert engines.llama_cpp_runs(tmp_path / "m.gguf") == "llama.cpp died (SIGILL) on a 17-token probe of m.gguf"
    monkeypatch.setattr(engines, "_PROBE", "raise SystemExit('no such file: m.gguf')")
    assert "failed on a 17-token probe of m.gguf: no such file" in engines.llama_cpp_runs(tmp_path / "m.gguf")
    monkeypatch.setattr(engines, "_PROBE", "pass")
    assert engines.llama_cpp_runs(tmp_path / "m.gguf") is None
