"""``storelab bench engines MODEL``: storelab, transformers and llama.cpp on the same weights, prefill and decode.

MODEL is a GGUF file or a real subject's name (``smollm2-135m``, ``gemma3-270m``: ``storelab.subjects.real``).
Every engine reads the same file: storelab with ``storelab.checkpoint.load(path, dtype="fp32")``,
transformers with ``from_pretrained(folder, gguf_file=name, dtype=float32)`` (both dequantize the file's
weights to fp32), and llama.cpp through ``llama_cpp`` (llama-cpp-python) where it is importable, on the
file as it is (its own weight format: the row says which), its KV cache in f16 (its default); with ``--f32``
also a row "llama.cpp f32 cache" whose cache is fp32 like storelab's and transformers'. Where llama_cpp is not
importable, its rows are skipped with a message, not failed.

Per thread count (default 1 and 2): a prompt of ``prompt`` tokens (fixed ids) prefilled in chunks of
``chunk`` (only the last position's logits), then ``new_tokens`` greedy tokens decoded one at a time. The
engines run in turn within each round, and each figure is the best of the rounds (``compare``'s reasoning:
a busy spell falls on all of them alike). storelab also runs with int8 and bf16 weights
(``storelab.models.quant``, activations fp32); the ratios compare like with like (fp32 with fp32) and the
quantised rows against transformers' fp32.

Yardsticks, measured in the same run at each thread count: the machine's fp32 matmul rate and its memory read rate
(``read_rate``). A decode step reads every weight once and the cache once, so each storelab row and transformers'
fp32 row (the same fp32 weights and fp32 cache as storelab fp32) also give the bytes a step reads over the step's
time (``decode_gb_s``) and its share of the read rate (``decode_of_memory``); a decode ratio whose peer would need
more than the read rate is out of any engine's reach. Prefill rows give the linear layers' FLOPs per second
(2 per weight per token, the LM head on the last position only) and their share of the matmul rate
(``prefill_of_matmul``).
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any, Callable

import torch

from storelab.bench.timing import matmul_rate, read_rate

__all__ = ["bench_engines", "resolve_gguf"]


def resolve_gguf(model: str) -> Path:
    """A GGUF path as given, or a real subject's file (ValueError naming both when neither)."""
    p = Path(model)
    if p.suffix == ".gguf" and p.is_file():
        return p
    from storelab.subjects.real import REAL, SubjectError, real_subject

    try:
        return real_subject(model).path()
    except (KeyError, SubjectError) as e:
        raise ValueError(f"MODEL: {model!r} is neither a .gguf file nor an installed real subject "
                         f"({', '.join(s.name for s in REAL)}): {e}") from None


def _storelab(path: Path, weights: str) -> tuple[Callable, Callable]:
    from storelab.checkpoint import load
    from storelab.models.decode import Decoder
    from storelab.models.model import prefill
    from storelab.models.quant import quantize_weights
    from storelab.state import upcoming

    model = quantize_weights(load(path, dtype="fp32").eval(), weights)
    box: dict[str, Any] = {}
    step_bytes, linear_flops = _step_bytes(model), _linear_flops(model)

    def run_prefill(ids, chunk, new_tokens):
        with torch.inference_mode(), upcoming(new_tokens):
            logits, box["cache"] = prefill(model, ids, chunk=chunk)
        box["decoder"] = Decoder(model)  # made once per context, as generate does
        return int(logits.argmax())

    def run_decode(first, n):
        tok, dec, cache = torch.tensor([[first]]), box["decoder"], box["cache"]
        out = []
        with torch.inference_mode():
            for i in range(n):
                with upcoming(n - i - 1):
                    tok = dec.step(tok, cache).argmax(-1, keepdim=True)
                out.append(int(tok))
        return out
    run_decode.step_bytes = lambda: step_bytes + sum(lay.nbytes() for lay in box["cache"])  # type: ignore[attr-defined]
    run_prefill.flops_per_token = linear_flops  # type: ignore[attr-defined]
    return run_prefill, run_decode


def _step_bytes(model) -> int:
    """The bytes of weights one decode step reads: every parameter once (a tied LM head and embedding once), the
    embedding table not at all where it is not also the head (a step reads one of its rows), and every weight
    packed by ``storelab.models.quant`` in its own format."""
    from storelab.models.quant import QuantLinear

    seen: set[int] = set()
    total = 0
    head = getattr(model.lm_head, "weight", None)
    for name, p in list(model.named_parameters()) + [(n, b) for n, b in model.named_buffers()]:
        if p.data_ptr() in seen or (p is model.embed.weight and p is not head):
            continue
        seen.add(p.data_ptr())
        total += p.numel() * p.element_size()
    for m in model.modules():
        if isinstance(m, QuantLinear) and m.packed.data_NK.data_ptr() not in seen:
            seen.add(m.packed.data_NK.data_ptr())
            total += m.packed.nbytes()
    return total


def _linear_flops(model) -> float:
    """FLOPs per token of a prefill's products with the weights: 2 per weight of every linear layer but the LM head
    (a prefill keeps the last position's logits only)."""
    from torch import nn

    from storelab.models.quant import QuantLinear

    n = sum(m.in_features * m.out_features for m in model.modules()
            if isinstance(m, (nn.Linear, QuantLinear)) and m is not model.lm_head)
    return 2.0 * n


def _transformers(path: Path) -> tuple[Callable, Callable]:
    from transformers import AutoModelForCausalLM, DynamicCache

    hf = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    box: dict[str, Any] = {}

    def run_prefill(ids, chunk, new_tokens):
        cache = DynamicCache()
        with torch.inference_mode():
            for s in range(0, ids.shape[1], chunk):
                out = hf(ids[:, s:s + chunk], past_key_values=cache, use_cache=True, logits_to_keep=1)
        box["cache"] = cache
        return int(out.logits[0, -1].argmax())

    def run_decode(first, n):
        tok, cache, out = torch.tensor([[first]]), box["cache"], []
        with torch.inference_mode():
            for _ in range(n):
                o = hf(tok, past_key_values=cache, use_cache=True, logits_to_keep=1)
                tok = o.logits[:, -1].argmax(-1, keepdim=True)
                out.append(int(tok))
        return out
    return run_prefill, run_decode


GGML_TYPE_F32 = 0  # ggml's type id of fp32 (llama.cpp's KV cache is f16 unless told)


def _llama_cpp(path: Path, threads: int, n_ctx: int, chunk: int, *, f32_cache: bool = False) -> tuple[Callable, Callable]:
    import llama_cpp

    cache = dict(type_k=GGML_TYPE_F32, type_v=GGML_TYPE_F32) if f32_cache else {}
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_batch=chunk, n_threads=threads,
                          n_threads_batch=threads, logits_all=False, verbose=False, **cache)

    import numpy as np

    def last_argmax() -> int:  # the last evaluated token's logits (llama.cpp keeps only those without logits_all)
        return int(np.ctypeslib.as_array(llm._ctx.get_logits(), shape=(llm.n_vocab(),)).argmax())

    def run_prefill(ids, chunk, new_tokens):
        llm.reset()
        llm.eval(ids[0].tolist())
        return last_argmax()

    def run_decode(first, n):
        tok, out = first, []
        for _ in range(n):
            llm.eval([tok])
            tok = last_argmax()
            out.append(tok)
        return out
    return run_prefill, run_decode


_PROBE = """
import sys, llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], n_ctx=64, n_batch=16, n_threads=1, n_threads_batch=1, verbose=False)
llm.eval(list(range(1, 17)))
llm.eval([5])
"""


def llama_cpp_runs(path: Path, timeout_s: float = 300.0) -> str | None:
    """None where llama.cpp prefills and decodes a few tokens of ``path`` in a child process, else why not. A crash
    of llama.cpp's native code (on this machine: SIGILL in its AMX path for quantized files, the CPU listing AMX
    that the VM does not run) would otherwise end the whole bench."""
    import signal
    import subprocess
    import sys

    try:
        run = subprocess.run([sys.executable, "-c", _PROBE, str(path)], capture_output=True, text=True,
                             timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"llama.cpp did not finish a 17-token probe of {path.name} in {timeout_s:.0f} s"
    if run.returncode == 0:
        return None
    if run.returncode < 0:
        try:
            name = signal.Signals(-run.returncode).name
        except ValueError:
            name = f"signal {-run.returncode}"
        return f"llama.cpp died ({name}) on a 17-token probe of {path.name}"
    tail = (run.stderr.strip().splitlines() or ["no message"])[-1][:200]
    return f"llama.cpp failed on a 17-token probe of {path.name}: {tail}"


def bench_engines(model: str, *, threads: tuple[int, ...] = (1, 2), prompt: int = 1024, chunk: int = 512,
                  new_tokens: int = 32, rounds: int = 3, weights: tuple[str, ...] = ("fp32", "int8", "bf16"),
                  peers: bool = True, progress: Callable[[str], None] | None = None,
                  f32: bool = False) -> dict[str, Any]:
    """Prefill and decode tokens per second of each engine at each thread count (module docstring). ``f32``: every
    engine reads an fp32 copy of the file (``storelab.bench.gguf_f32``), llama.cpp included."""
    path = resolve_gguf(model)
    say = progress or (lambda s: None)
    if f32:
        from storelab.bench.gguf_f32 import f32_copy

        say(f"an fp32 copy of {path.name}")
        path = f32_copy(path)
    old_threads = torch.get_num_threads()
    llama_ok = importlib.util.find_spec("llama_cpp") is not None
    llama_why = "skipped: --no-peer" if not peers else \
        "skipped: llama_cpp (llama-cpp-python) is not importable here" if not llama_ok else None
    if llama_why is None:
        say(f"llama.cpp: a probe of {path.name} in a child process")
        broke = llama_cpp_runs(path)
        if broke is not None:
            llama_ok, llama_why = False, f"skipped: {broke}"
    res: dict[str, Any] = {"bench": "engines", "model": model, "path": str(path), "prompt": prompt,
                           "chunk": chunk, "new_tokens": new_tokens, "rounds": rounds,
                           "statistic": "best of rounds, engines in turn within each round", "rows": [],
                           "llama_cpp": llama_why or "measured"}
    ids = torch.randint(100, 1000, (1, prompt), generator=torch.Generator().manual_seed(0))
    engines: dict[str, Callable[[int], tuple[Callable, Callable]]] = {
        f"storelab {w}": (lambda t, w=w: _storelab(path, w)) for w in weights}
    if peers:
        engines["transformers fp32"] = lambda t: _transformers(path)
        if llama_ok:
            engines["llama.cpp"] = lambda t: _llama_cpp(path, t, prompt + new_tokens + 8, chunk)
            if f32:   # like for like with storelab's and transformers' fp32 caches (its default cache is f16)
                engines["llama.cpp f32 cache"] = lambda t: _llama_cpp(path, t, prompt + new_tokens + 8, chunk,
                                                                       f32_cache=True)
    try:
        for t in threads:
            torch.set_num_threads(t)
            res.setdefault("matmul_gflops", {})[str(t)] = matmul_rate() / 1e9
            res.setdefault("read_gb_s", {})[str(t)] = read_rate() / 1e9
            built = {}
            for name, make in engines.items():
                say(f"loading {name} ({t} threads)")
                built[name] = make(t)
            best: dict[str, dict[str, float]] = {n: {"prefill": float("inf"), "decode": float("inf")} for n in built}
            tokens: dict[str, list[int]] = {}
            for r in range(rounds):
                for name, (pre, dec) in built.items():
                    say(f"round {r + 1}/{rounds}: {name}, {t} threads")
                    t0 = time.perf_counter()
                    first = pre(ids, chunk, new_tokens)
                    t1 = time.perf_counter()
                    tokens[name] = dec(first, new_tokens)
                    t2 = time.perf_counter()
                    best[name]["prefill"] = min(best[name]["prefill"], t1 - t0)
                    best[name]["decode"] = min(best[name]["decode"], t2 - t1)
            for name, b in best.items():
                row = {"engine": name, "threads": t, "prefill_tok_s": prompt / b["prefill"],
                       "decode_tok_s": new_tokens / b["decode"], "prefill_s": b["prefill"],
                       "decode_s": b["decode"], "tokens": tokens[name]}
                pre, dec = built[name]
                if name == "transformers fp32" and "storelab fp32" in built:
                    pre, dec = built["storelab fp32"]   # the same fp32 weights and fp32 cache: the same bytes, FLOPs
                if hasattr(dec, "step_bytes"):
                    row["decode_gb_s"] = dec.step_bytes() * row["decode_tok_s"] / 1e9
                    row["decode_of_memory"] = row["decode_gb_s"] / res["read_gb_s"][str(t)]
                flops = getattr(pre, "flops_per_token", None)
                if flops:
                    row["prefill_gflops"] = flops * row["prefill_tok_s"] / 1e9
                    row["prefill_of_matmul"] = row["prefill_gflops"] / res["matmul_gflops"][str(t)]
                res["rows"].append(row)
            del built
    finally:
        torch.set_num_threads(old_threads)
    res["ratios"] = _ratios(res["rows"])
    return res


def _ratios(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """storelab's rate over each peer's, per thread count, prefill and decode."""
    out = []
    by = {(r["engine"], r["threads"]): r for r in rows}
    for (engine, t), r in by.items():
        if not engine.startswith("storelab"):
            continue
        for peer in ("transformers fp32", "llama.cpp", "llama.cpp f32 cache"):
            p = by.get((peer, t))
            if p is None:
                continue
            out.append({"engine": engine, "peer": peer, "threads": t,
                        "prefill": r["prefill_tok_s"] / p["prefill_tok_s"],
                        "decode": r["decode_tok_s"] / p["decode_tok_s"]})
    return out
