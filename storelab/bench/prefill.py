"""``storelab bench prefill``: the seven tiny models read a long prompt in chunks.

Two measurements per model.

Memory (``length`` tokens, 131,072 by default, in chunks of ``memory_chunk``, 256 by default).
Each model runs in a fresh subprocess:
build the tiny model with random weights, warm up on 8,192 tokens (thread pools, lazy
kernels, every store's long-context paths), hand the memory the allocator kept from the
warm-up back to the system (glibc ``malloc_trim``: otherwise the run would reuse it unseen
and one chunk's working set would not count), then reset the process's peak resident set
(writing "5" to ``/proc/self/clear_refs`` resets VmHWM) and read the resident set as the
baseline (weights, prompt, interpreter, thread pools);
prefill the whole prompt chunk by chunk with ``storelab.models.prefill``; read VmHWM.
``peak above weights = VmHWM - baseline``: every byte the process held above the weights
at its worst moment (the cache, one chunk's activations, any copy made while the cache
grows, and the freed memory the C allocator keeps in its heap instead of returning).
A second run of the same prefill measures the tensors alone, with no allocator in the way
(the CPU analogue of ``torch.cuda.max_memory_allocated``): ``tensor peak = bytes of the
storages the cache holds when a chunk starts (``storelab.state.held_bytes``: filled rows,
reserved room, anything a view pins) + the largest running sum of the allocations torch's
profiler reports during that chunk``. Frees of blocks made before a profiled chunk are not
reported (the profiler does not know their size), so the running sum can only overstate:
an upper bound. Every ``PROFILE_EVERY``-th chunk is profiled, and the last (profiling all
of them triples the run); each chunk runs the same code on the same sizes, the cache's
room is reserved at the first chunk (profiled), and only the indexers' number of score
blocks grows with the context, not the size of any block.
Both peaks are compared with the analytic accounting of the models package
(``analytic_state_bytes``: each layer's store footprint at the tokens it saw, fp32,
shared caches counted once), and with the L x L fp32 matrix the prefill must not hold.
The target (within 10 %) is judged on the tensor peak, what the library holds; the
process peak is printed beside it (glibc's heap keeps a few MB of freed chunk memory
that the next chunk reuses, which for the smallest tiny caches is more than 10 %).
(tracemalloc does not see torch's allocations, so the kernel's counters and the profiler are used.)

Speed (``speed_length`` tokens, 16,384 by default): tokens per second of the same chunked
prefill, ours and transformers' tiny model of the same family (same width, layers and
vocabulary, the other sizes as in shared/reference/oracles.md) given the same prompt in
the same chunks with its own cache, in the same subprocess, alternating (after a
two-chunk warm-up each); the best of ``repeats`` (2) runs each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import torch

MEMORY_TOLERANCE = 0.10
SPEED_TARGET = 1.5
DEFAULT_CHUNK = 1024
# The memory run reads in chunks of 256: above the caches a prefill holds one chunk's activations
# (the hidden states, the MoE's routed copies, a recurrent chunk's workspace, attention's outputs),
# which scale with the chunk, not the context; for the tiny models' small caches (24 MB for
# kimi-k3 at 131,072 tokens) those of a 1,024-token chunk alone are about 5 MB.
DEFAULT_MEMORY_CHUNK = 256
WARMUP_TOKENS = 8192
PROFILE_EVERY = 8  # the tensor-peak run profiles every 8th chunk, and the last

# our zoo model -> the transformers family it is measured against
PEER_FAMILY = {
    "mimo-v2.6-pro": "mimo_v2_flash",
    "kimi-k3": "kimi_linear",
    "qwen3.8": "qwen3_next",
    "glm-5.3": "glm_moe_dsa",
    "deepseek-v4-pro": "deepseek_v4",
    "deepseek-v4.1-flash": "deepseek_v4",
    "minimax-m3": "minimax_m3_vl_text",
}


# -- /proc readings ---------------------------------------------------------------------------------

def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _trim() -> None:
    """glibc's malloc_trim(0): return freed heap memory to the system (no-op elsewhere)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _peak_run(fn) -> dict[str, Any]:
    """Run ``fn()`` once after a peak reset; seconds, baseline, peak and what stays held (bytes)."""
    import gc

    gc.collect()
    _trim()  # hand what the allocator kept from earlier work back, so the run cannot reuse it unseen
    reset = _reset_peak()
    base_kb = _status_kb("VmRSS")
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = fn()
    seconds = time.perf_counter() - t0
    peak_kb, after_kb = _status_kb("VmHWM"), _status_kb("VmRSS")
    return {"out": out, "seconds": seconds, "peak_reset": reset, "baseline_kb": base_kb, "peak_kb": peak_kb,
            "peak_above_weights_bytes": (peak_kb - base_kb) * 1024, "held_after_bytes": (after_kb - base_kb) * 1024}


from storelab.models.peaks import allocation_peak as _allocation_peak  # noqa: E402 (one count, two users)


def tensor_peak_run(model, prompt_BT: torch.Tensor, chunk: int, every: int = PROFILE_EVERY) -> dict[str, Any]:
    """The chunked prefill once more, profiling every ``every``-th chunk and the last: the peak
    of the bytes its tensors hold (see the module docstring), with no allocator in the way."""
    import gc

    from torch.profiler import ProfilerActivity, profile

    from storelab.models.model import prefill
    from storelab.state import held_bytes

    n_chunks = -(-prompt_BT.shape[1] // chunk)
    cache = model.new_cache()
    box: dict[str, Any] = {"i": 0, "prof": None, "start": 0, "peak": 0, "profiled": 0, "worst": None}

    def begin():
        i = box["i"]
        if i < n_chunks and (i % every == 0 or i == n_chunks - 1):
            box["start"] = held_bytes(cache)
            box["prof"] = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            box["prof"].__enter__()

    def end(_n):
        prof, box["prof"] = box["prof"], None
        if prof is not None:
            prof.__exit__(None, None, None)
            total = box["start"] + _allocation_peak(prof)
            del prof
            gc.collect()  # the profiler's results sit in reference cycles: 2.9 GB after 32 chunks without this
            box["profiled"] += 1
            if total > box["peak"]:
                box["peak"], box["worst"] = total, box["i"]
        box["i"] += 1
        begin()

    with torch.inference_mode():
        begin()
        try:
            prefill(model, prompt_BT, chunk=chunk, cache=cache, on_chunk=end)
        finally:
            if box["prof"] is not None:
                box["prof"].__exit__(None, None, None)
    return {"tensor_peak_bytes": box["peak"], "profiled_chunks": box["profiled"], "chunks": n_chunks,
            "worst_chunk": box["worst"], "cache_held_bytes": held_bytes(cache)}


def _timed(fn) -> float:
    t0 = time.perf_counter()
    with torch.inference_mode():
        fn()
    return time.perf_counter() - t0


def prefill_child(name: str, length: int, chunk: int, peer: bool = False, repeats: int = 1,
                  seed: int = 0, tensor_peak: bool = True) -> dict[str, Any]:
    """Run in a fresh process: our chunked prefill of ``length`` tokens (time, peak memory above the
    weights, the cache against the accounting); then, with ``peer``, transformers' on the same prompt.
    With ``repeats`` > 1 both are timed that many times, alternating; ``seconds`` is the best.
    ``tensor_peak``: then our prefill once more, profiled (``tensor_peak_run``)."""
    from storelab.models.accounting import analytic_state_bytes, count_params
    from storelab.models.model import Model, prefill
    from storelab.zoo import load_zoo

    torch.manual_seed(seed)
    cfg = load_zoo(name, tiny=True)
    model = Model(cfg).eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, length), generator=torch.Generator().manual_seed(seed))
    with torch.inference_mode():
        # warm-up: thread pools, lazy kernels and the allocator's first blocks, over enough tokens
        # that every path of every store has run (a compressed cache's multi-block reads, say)
        prefill(model, prompt[:, : min(length, max(2 * chunk, WARMUP_TOKENS))], chunk=chunk)
    r = _peak_run(lambda: prefill(model, prompt, chunk=chunk)[1])
    cache = r.pop("out")
    seen = [st.seen or length for st in cache]
    analytic = analytic_state_bytes(cfg, seen, dtype="fp32", own_copies=list(getattr(model, "unshared", [])))
    r.update(model=name, length=length, chunk=chunk, params=count_params(cfg).stored,
             weights_bytes=sum(p.numel() * p.element_size() for p in model.parameters()),
             cache_nbytes=sum(st.nbytes() for st in cache), analytic_bytes=sum(analytic.values()),
             analytic_by_kind=analytic)
    out: dict[str, Any] = {"ours": r}
    del cache
    if tensor_peak:
        r.update(tensor_peak_run(model, prompt, chunk))
    ours_fn = lambda: prefill(model, prompt, chunk=chunk)  # noqa: E731
    peer_fn = None
    if peer:
        try:
            family, hf = build_peer(name, cfg)
            with torch.inference_mode():
                peer_prefill(hf, prompt[:, : min(length, 2 * chunk)], chunk)  # warm-up, and it runs at all
            peer_fn = lambda: peer_prefill(hf, prompt, chunk)  # noqa: E731
            p = _peak_run(peer_fn)
            p.pop("out")
            p.update(peer=f"transformers {family}", params=sum(x.numel() for x in hf.parameters()))
            out["peer"] = p
        except Exception as e:  # a missing family, or a model that cannot run chunked on a CPU
            out["peer"] = {"peer": f"unavailable ({type(e).__name__}: {str(e)[:200]})"}
    for key, fn in (("ours", ours_fn), ("peer", peer_fn)):
        if key in out:
            out[key]["all_seconds"] = [out[key].get("seconds")]
    for _ in range(repeats - 1):
        out["ours"]["all_seconds"].append(_timed(ours_fn))
        if peer_fn is not None and "seconds" in out["peer"]:
            out["peer"]["all_seconds"].append(_timed(peer_fn))
    for key in ("ours", "peer"):
        if key in out and out[key].get("seconds") is not None:
            out[key]["seconds"] = min(out[key]["all_seconds"])
    return out


def run_child(name: str, length: int, chunk: int, *, peer: bool, repeats: int = 1, tensor_peak: bool = True,
              timeout_s: float = 7200) -> dict[str, Any]:
    """``prefill_child`` in a subprocess (a fresh peak, and nothing else's allocations)."""
    code = ("import json, torch; torch.set_num_threads(%d); from storelab.bench.prefill import prefill_child; "
            "print(json.dumps(prefill_child(%r, %d, %d, %r, %d, tensor_peak=%r)))"
            % (torch.get_num_threads(), name, length, chunk, peer, repeats, tensor_peak))
    env = {**os.environ, "USE_HUB_KERNELS": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s, env=env)
    if p.returncode != 0:
        raise RuntimeError(p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def memory_row(r: dict[str, Any]) -> dict[str, Any]:
    """Our run's memory figures against the accounting."""
    peak, analytic, L = r["peak_above_weights_bytes"], r["analytic_bytes"], r["length"]
    tensors = r.get("tensor_peak_bytes")

    def within(x):
        return None if x is None or not analytic else abs(x - analytic) <= MEMORY_TOLERANCE * analytic

    return {**r, "peak_above_weights_mb": peak / 2**20, "analytic_mb": analytic / 2**20,
            "ratio": peak / analytic if analytic else None, "process_within_10pct": within(peak),
            "tensor_peak_mb": None if tensors is None else tensors / 2**20,
            "tensor_ratio": tensors / analytic if tensors is not None and analytic else None,
            # the target: what the prefill's tensors hold (the process figure when there is no tensor run)
            "within_10pct": within(peak if tensors is None else tensors),
            "cache_matches_analytic": r["cache_nbytes"] == analytic, "lxl_fp32_mb": L * L * 4 / 2**20}


def speed_row(child: dict[str, Any]) -> dict[str, Any]:
    """Tokens per second, ours and the peer's, from one child run."""
    ours, peer = child["ours"], child.get("peer") or {}
    L = ours["length"]
    row = {"length": L, "chunk": ours["chunk"], "ours_tok_s": L / ours["seconds"], "ours_params": ours["params"],
           "peer": peer.get("peer"), "peer_params": peer.get("params"),
           "peer_tok_s": L / peer["seconds"] if "seconds" in peer else None,
           "peer_peak_above_weights_mb": peer["peak_above_weights_bytes"] / 2**20 if "seconds" in peer else None}
    row["speedup"] = row["ours_tok_s"] / row["peer_tok_s"] if row["peer_tok_s"] else None
    row["target"] = None if row["speedup"] is None else row["speedup"] >= SPEED_TARGET
    return row


# -- the peer: transformers' tiny model of the same family -------------------------------------------

def peer_settings(name: str, cfg) -> tuple[str, dict[str, Any]]:
    """(transformers model type, config settings) of the tiny peer for one of our zoo models.

    Width, layer count, vocabulary, the layer pattern (which layers are full, window,
    linear, compressed) and the dense/MoE pattern follow our tiny model; the other sizes
    are the tiny settings of shared/reference/oracles.md (8 experts of 32, top 2).
    """
    family = PEER_FAMILY[name]
    kinds = [lay.token.KIND for lay in cfg.layers]
    dense = [lay.channel.KIND == "ffn" for lay in cfg.layers]
    n = cfg.n_layers
    common = dict(hidden_size=cfg.d_model, num_hidden_layers=n, vocab_size=cfg.vocab_size, pad_token_id=0,
                  bos_token_id=1, eos_token_id=2)
    moe = dict(num_experts_per_tok=2, moe_intermediate_size=32)
    if family == "mimo_v2_flash":
        s = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=24, v_head_dim=16, n_routed_experts=8,
                 intermediate_size=128, sliding_window_size=5, **moe,
                 layer_types=["full_attention" if k == "attention" else "sliding_attention" for k in kinds],
                 mlp_layer_types=["dense" if d else "sparse" for d in dense])
    elif family == "kimi_linear":
        s = dict(num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=None,
                 qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16, num_local_experts=8, n_shared_experts=1,
                 intermediate_size=128, linear_head_dim=16, linear_num_heads=2, **moe,
                 layer_types=["linear_attention" if k == "kda" else "full_attention" for k in kinds],
                 mlp_layer_types=["dense" if d else "sparse" for d in dense])
    elif family == "qwen3_next":
        s = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=8,
                 shared_expert_intermediate_size=32, intermediate_size=128, linear_conv_kernel_dim=4,
                 linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2, linear_num_value_heads=4,
                 layer_types=["linear_attention" if k == "gated_deltanet" else "full_attention" for k in kinds],
                 mlp_only_layers=[i for i, d in enumerate(dense) if d], **moe)
    elif family == "glm_moe_dsa":
        s = dict(num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=16, q_lora_rank=24, qk_rope_head_dim=8,
                 qk_nope_head_dim=16, v_head_dim=16, index_topk=6, index_head_dim=16, index_n_heads=2,
                 n_routed_experts=8, intermediate_size=128, n_group=1, topk_group=1, **moe,
                 mlp_layer_types=["dense" if d else "sparse" for d in dense])
    elif family == "deepseek_v4":
        kind_type = {"csa": "compressed_sparse_attention", "hierarchical": "compressed_sparse_attention",
                     "hca": "heavily_compressed_attention", "window": "sliding_attention"}
        s = dict(num_attention_heads=4, num_key_value_heads=1, head_dim=32, q_lora_rank=24, o_groups=2,
                 o_lora_rank=16, index_n_heads=2, index_head_dim=16, index_topk=3, sliding_window=4,
                 compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 4},
                 n_routed_experts=8, n_shared_experts=1, hc_mult=4, hc_sinkhorn_iters=5, num_nextn_predict_layers=0,
                 layer_types=[kind_type.get(k, "heavily_compressed_attention") for k in kinds],
                 mlp_layer_types=["hash_moe" if getattr(lay.channel, "routing", "") == "hash" else "moe"
                                  for lay in cfg.layers], **moe)
    else:  # minimax_m3_vl_text
        s = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=16, rotary_dim=8, num_local_experts=8,
                 intermediate_size=32, dense_intermediate_size=128, shared_intermediate_size=32, index_n_heads=2,
                 index_head_dim=16, index_block_size=4, index_topk_blocks=2, index_local_blocks=1,
                 num_experts_per_tok=2,
                 layer_types=["full_attention" if k == "attention" else "minimax_m3_sparse" for k in kinds],
                 mlp_layer_types=["dense" if d else "sparse" for d in dense])
    return family, {**common, **s}


def build_peer(name: str, cfg):
    """transformers' tiny model for ``name`` (random weights, eval mode), or raise."""
    os.environ.setdefault("USE_HUB_KERNELS", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    family, settings = peer_settings(name, cfg)
    if family == "minimax_m3_vl_text":
        from transformers.models.minimax_m3_vl.configuration_minimax_m3_vl import MiniMaxM3VLTextConfig
        from transformers.models.minimax_m3_vl.modeling_minimax_m3_vl import MiniMaxM3VLForCausalLM

        return family, MiniMaxM3VLForCausalLM(MiniMaxM3VLTextConfig(**settings)).eval()
    hf_cfg = AutoConfig.for_model(family, **settings)
    return family, AutoModelForCausalLM.from_config(hf_cfg).eval()


def peer_prefill(model, prompt_BT: torch.Tensor, chunk: int):
    """transformers' chunked prefill: each chunk a forward call with the model's own cache."""
    past = None
    out = None
    for s in range(0, prompt_BT.shape[1], chunk):
        out = model(input_ids=prompt_BT[:, s:s + chunk], past_key_values=past, use_cache=True, logits_to_keep=1)
        past = out.past_key_values
    return out.logits[:, -1]


def bench_prefill(*, models: list[str] | None = None, length: int = 131072, speed_length: int = 16384,
                  chunk: int | None = None, memory_chunk: int | None = None, quick: bool = False, peer: bool = True,
                  repeats: int = 2) -> dict[str, Any]:
    """Memory at ``length`` (chunks of ``memory_chunk``) and speed at ``speed_length`` (chunks of
    ``chunk``) for each model (see the module docstring).

    When the two lengths and the two chunks are equal one run per model gives both (ours, then the peer).
    """
    from storelab.zoo import SEVEN, zoo_names

    have = set(zoo_names())
    names = models or list(SEVEN)
    chunk = chunk or (min(DEFAULT_CHUNK, max(1, speed_length // 4)) if quick else DEFAULT_CHUNK)
    memory_chunk = memory_chunk or (min(DEFAULT_MEMORY_CHUNK, max(1, length // 4)) if quick else DEFAULT_MEMORY_CHUNK)
    rows = []
    for name in names:
        row: dict[str, Any] = {"model": name}
        if not quick:  # progress on stderr: the target lengths take minutes per model
            print(f"bench prefill: {name} ...", file=sys.stderr, flush=True)
        if name not in have:
            row["error"] = "no tiny model in the zoo yet"
            rows.append(row)
            continue
        try:
            same = length == speed_length and memory_chunk == chunk
            fast = run_child(name, speed_length, min(chunk, speed_length), peer=peer,
                             repeats=1 if quick else repeats, tensor_peak=same)
            row["speed"] = speed_row(fast)
            mem = fast if same else run_child(name, length, memory_chunk, peer=False)
            row["memory"] = memory_row(mem["ours"])
        except Exception as e:
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        rows.append(row)
    return {"bench": "prefill", "length": length, "speed_length": speed_length, "chunk": chunk,
            "memory_chunk": memory_chunk,
            "memory_method": "process: VmHWM - VmRSS after a peak reset (/proc/self/clear_refs), one subprocess "
                             "per model; tensors: held storages at a chunk's start + the profiler's running "
                             f"allocation peak in it, every {PROFILE_EVERY}th chunk and the last (the target)",
            "speed_method": f"best of {1 if quick else repeats} chunked prefills each, ours and the peer "
                            "alternating, in the same subprocess",
            "threads": torch.get_num_threads(), "dtype": "fp32", "models": rows}
