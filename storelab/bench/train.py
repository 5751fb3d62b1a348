"""``storelab bench train``: training through our ops and models against transformers', in one process.

Three measurements, each side by side with a peer or a yardstick timed in the same rounds
(``timing.compare`` with autograd on: one call of each per round, in turn; best of rounds).

(a) The ops under autograd: ``storelab.ops.gated_delta_rule`` and ``storelab.ops.kda`` (chunk
    mode, the default) forward + backward, against transformers' ``torch_chunk_gated_delta_rule``
    (Qwen3-Next) and ``chunk_kimi_delta_attention`` (Kimi Linear), the functions transformers
    trains through on a CPU. The inputs are those of the inference bench (``kernels.delta_inputs``:
    unit-norm q and k, log decays g <= 0, beta in (0, 1)) made leaves that need gradients; one call
    is the forward and ``torch.autograd.grad`` of the output and the final state, against fixed
    random cotangents, for q, k, v, g and beta. A plain fp32 matrix product of comparable size
    (``comparable_matmul_n``: its FLOPs about those of our call) is timed in the same rounds; our
    counted FLOPs over our time, over its rate, is the "fraction of the matmul rate". The gradients
    of the two sides are compared once, at ``CHECK_T`` tokens.

(b) One training step of each tiny zoo model against its prefill-bench peer
    (``prefill.build_peer``: transformers' tiny model of the same family, width, layers and
    vocabulary): random token ids, the forward, the next-token cross-entropy (the same expression
    for both sides, from the logits), ``loss.backward()`` into freshly zeroed (``None``) gradients.
    No optimizer step (the same AdamW for both would add the same time), no auxiliary loss.

(c) The peak memory of one training step of each tiny zoo model (B=1) at two lengths, 4,096 and
    16,384 tokens, each model in a fresh subprocess. Method: torch's profiler with
    ``profile_memory=True`` records every allocation and free of torch's CPU allocator during the
    step (forward, loss, backward: the saved activations, the gradients, every temporary), and the
    peak is the largest running sum of those events (``prefill._allocation_peak``): the bytes the
    step's tensors held above what existed when it began (the weights, the ids). The gradients are
    ``None`` when it begins and the warm-up's graph is gone, so nothing allocated before the span is
    freed inside it and the sum is exact, not a bound. It is what the library's tensors hold, with
    no allocator in the way (the CPU analogue of ``torch.cuda.max_memory_allocated``); scratch
    memory that oneDNN or OpenMP take outside torch's allocator is not seen. Linear in T means
    ``peak(16,384) / peak(4,096) <= 4.4`` (4 for a purely linear footprint, 10 % for what does not
    scale); a T x T score matrix anywhere would make it about 16.

FLOPs of the chunked WY/UT form (arXiv 2406.06484 section 3; with decay arXiv 2412.06464; the
algorithm of ``ops/delta_reference.py``), per head and per chunk of C tokens, every product
counted as a dense one except the triangular inverse and its backward, at their minimum:

    forward (9 products)                                     backward (each product Y = X Z gives
                                                             dX = dY Z^T and dZ = X^T dY)
    f1  K K^T                          2 C^2 K               dK = (dM + dM^T) K, one product 2 C^2 K
    f2  T = (I + A)^-1                 C^3 / 3               dA = -T^T dT T^T: two triangular x square
                                                             products, C^3 each               2 C^3
    f3  U = T (b V)                    2 C^2 V               dT, d(bV)                        4 C^2 V
    f4  W = T (b K e^G)                2 C^2 K               dT, d(bKe^G)                     4 C^2 K
    f5  W S                            2 C K V               dW, dS                           4 C K V
    f6  (Q e^G) S                      2 C K V               d(Qe^G), dS                      4 C K V
    f7  Q K^T                          2 C^2 K               dQ, dK (through the decay mask)  4 C^2 K
    f8  (Q K^T * Gamma) V_new          2 C^2 V               dP, dV_new                       4 C^2 V
    f9  (K e^(G_C - G))^T V_new        2 C K V               d(Ke^(G_C-G)), dV_new            4 C K V

    forward   2 C^2 (3K + 2V) + C^3 / 3 + 6 C K V      (= ``kernels.wy_delta_flops``)
    backward  2 C^2 (5K + 4V) + 2 C^3   + 12 C K V

At C = K = V = 64 the backward is 1.96 times the forward. Elementwise work (the decays, masks, the
gradients of g and beta from elementwise products) is not counted; nor is any recomputation a
backward may do to save memory (it is not part of the algorithm's work), so the rates printed are
conservative. Each side is counted at the chunk size it runs: ours at the ops' default (32), the
peer at its 64; KDA is counted like Gated DeltaNet (its per-channel decay is elementwise work around
the same products).
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from typing import Any, Callable

import torch
import torch.nn.functional as F

from storelab.bench.kernels import CHUNK, OURS_CHUNK, _call_ours, _call_peer, _ours, _peer, delta_inputs
from storelab.bench.timing import compare, matmul_fn

OPS_SPEEDUP_TARGET = 3.0
OPS_MATMUL_FRACTION_TARGET = 0.30
MODEL_SPEEDUP_TARGET = 1.5
MODEL_SPEEDUP_TARGETS = {"qwen3.8": 2.0, "kimi-k3": 2.0}  # the recurrent hybrids, stricter
MEMORY_RATIO_TARGET = 4.4
CHECK_T = 512  # the gradients of ours and the peer's compared at this many tokens
INPUTS = ("q", "k", "v", "g", "beta")


def wy_train_flops(B: int, T: int, H: int, K: int, V: int, C: int) -> dict[str, int]:
    """FLOPs of the chunked WY/UT delta rule's forward and backward (the module docstring's
    table), per call: ``{"forward", "backward", "total"}``; T is padded to whole chunks."""
    N = -(-T // C)
    forward = 2 * C * C * (3 * K + 2 * V) + C**3 // 3 + 6 * C * K * V
    backward = 2 * C * C * (5 * K + 4 * V) + 2 * C**3 + 12 * C * K * V
    f, b = B * H * N * forward, B * H * N * backward
    return {"forward": f, "backward": b, "total": f + b}


def comparable_matmul_n(flops: float, lo: int = 128, hi: int = 4096) -> int:
    """The side n of a square fp32 product whose 2 n^3 FLOPs are about ``flops`` (a multiple of 64
    within [lo, hi]): the yardstick timed beside an op, at a comparable size."""
    n = round((flops / 2) ** (1 / 3) / 64) * 64
    return int(min(hi, max(lo, n)))


# -- (a) the ops -------------------------------------------------------------------------------------

def _leaves(x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: t.detach().clone().requires_grad_(True) for k, t in x.items()}


def _cotangents(B: int, T: int, H: int, K: int, seed: int = 1) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return {"o": torch.randn(B, T, H, K, generator=gen), "S": torch.randn(B, H, K, K, generator=gen)}


def _fwd_bwd(call: Callable, fn: Callable, x: dict[str, torch.Tensor], cot: dict[str, torch.Tensor]) -> Callable:
    """One forward + backward of ``fn`` on the leaves ``x``: the gradients of q, k, v, g, beta."""
    inputs = [x[n] for n in INPUTS]

    def step():
        o, S = call(fn, x)
        return torch.autograd.grad((o, S), inputs, (cot["o"], cot["S"]))

    return step


def _grad_check(ours: Callable, peer: Callable, B: int, T: int, H: int, K: int, per_channel: bool) -> float:
    """Max |ours - peer| over the gradients of q, k, v, g and beta, on a short input."""
    x = _leaves(delta_inputs(B, T, H, K, per_channel=per_channel, seed=2))
    cot = _cotangents(B, T, H, K, seed=3)
    a = _fwd_bwd(_call_ours, ours, x, cot)()
    b = _fwd_bwd(_call_peer, peer, x, cot)()
    return max(float((u - w).abs().max()) for u, w in zip(a, b))


def bench_train_op(name: str, *, T: int = 4096, H: int = 8, K: int = 64, B: int = 1, repeats: int = 5,
                   budget_s: float = 90.0) -> dict[str, Any]:
    """(a) for one op (``name`` "gdn" or "kda"): forward + backward, ours, the peer and the matmul."""
    if name not in ("gdn", "kda"):
        raise ValueError(f"name: must be 'gdn' or 'kda', got {name!r}")
    per_channel = name == "kda"
    ours = _ours(name)
    peer, peer_name = _peer(name)
    flops = wy_train_flops(B, T, H, K, K, OURS_CHUNK)
    peer_flops = wy_train_flops(B, T, H, K, K, CHUNK)
    matmul_n = comparable_matmul_n(flops["total"])
    mm, mm_flops = matmul_fn(matmul_n)
    x = _leaves(delta_inputs(B, T, H, K, per_channel=per_channel))
    cot = _cotangents(B, T, H, K)
    fns: dict[str, Callable] = {"ours": _fwd_bwd(_call_ours, ours, x, cot), "matmul": mm}
    if peer is not None:
        fns["peer"] = _fwd_bwd(_call_peer, peer, x, cot)
    diff = _grad_check(ours, peer, B, min(T, CHECK_T), H, K, per_channel) if peer is not None else None
    t = compare(fns, repeats=repeats, warmup=1, budget_s=budget_s, inference=False)
    ours_s, rate = t["ours"].best, mm_flops / t["matmul"].best
    peer_s = t["peer"].best if peer is not None else None
    speedup = peer_s / ours_s if peer_s else None
    fraction = flops["total"] / ours_s / rate
    return {
        "bench": f"train {name}", "shape": {"B": B, "T": T, "H": H, "K": K, "V": K, "dtype": "fp32"},
        "chunk": {"ours": OURS_CHUNK, "peer": CHUNK}, "threads": torch.get_num_threads(),
        "statistic": "best of interleaved rounds, forward + backward (torch.autograd.grad of o and the "
                     "final state for q, k, v, g, beta)",
        "ours": "storelab.ops." + ("kda" if per_channel else "gated_delta_rule") + " (chunk, under autograd)",
        "peer": peer_name, "ours_ms": ours_s * 1e3, "peer_ms": None if peer_s is None else peer_s * 1e3,
        "speedup": speedup, "grad_max_abs_diff": diff, "grad_check_T": min(T, CHECK_T),
        "flops": flops, "peer_flops": peer_flops,
        "ours_gflops": flops["total"] / ours_s / 1e9,
        "peer_gflops": None if peer_s is None else peer_flops["total"] / peer_s / 1e9,
        "matmul_n": matmul_n, "matmul_gflops": rate / 1e9, "fraction_of_matmul": fraction,
        "timings": {k: v.as_dict() for k, v in t.items()},
        "targets": {
            f"speedup >= {OPS_SPEEDUP_TARGET:g}": None if speedup is None else speedup >= OPS_SPEEDUP_TARGET,
            f"fraction_of_matmul >= {OPS_MATMUL_FRACTION_TARGET:g}": fraction >= OPS_MATMUL_FRACTION_TARGET,
        },
    }


# -- (b) one training step of a model ----------------------------------------------------------------

def next_token_loss(logits_BTV: torch.Tensor, ids_BT: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of each position's logits against the next token (fp32)."""
    V = logits_BTV.shape[-1]
    return F.cross_entropy(logits_BTV[:, :-1].reshape(-1, V).float(), ids_BT[:, 1:].reshape(-1))


def train_step_fn(model: torch.nn.Module, ids_BT: torch.Tensor, *, peer: bool) -> Callable[[], float]:
    """One training step (gradients set to None, forward, next-token loss, backward); returns the loss."""
    params = [p for p in model.parameters() if p.requires_grad]

    def step() -> float:
        for p in params:
            p.grad = None
        logits = model(input_ids=ids_BT, use_cache=False).logits if peer else model(ids_BT)[0]
        loss = next_token_loss(logits, ids_BT)
        loss.backward()
        return float(loss.detach())

    return step


def _ours_model(name: str, seed: int = 0):
    from storelab.models.model import Model
    from storelab.zoo import load_zoo

    torch.manual_seed(seed)
    cfg = load_zoo(name, tiny=True)
    return cfg, Model(cfg).train()


def bench_train_model(name: str, *, B: int = 4, T: int = 2048, repeats: int = 3,
                      budget_s: float = 120.0) -> dict[str, Any]:
    """(b) for one tiny zoo model: its training step and its prefill-bench peer's, interleaved."""
    from storelab.bench.prefill import build_peer

    cfg, model = _ours_model(name)
    ids = torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(0))
    fns: dict[str, Callable] = {"ours": train_step_fn(model, ids, peer=False)}
    row: dict[str, Any] = {"model": name, "B": B, "T": T,
                           "ours_params": sum(p.numel() for p in model.parameters())}
    hf = None
    try:
        family, hf = build_peer(name, cfg)
        hf.train()
        fns["peer"] = train_step_fn(hf, ids, peer=True)
        fns["peer"]()  # it trains at all (a missing family or a CPU path without backward raises here)
        row.update(peer=f"transformers {family}", peer_params=sum(p.numel() for p in hf.parameters()))
    except Exception as e:
        fns.pop("peer", None)
        row["peer"] = f"unavailable ({type(e).__name__}: {str(e)[:200]})"
    t = compare(fns, repeats=repeats, warmup=1, budget_s=budget_s, inference=False)
    ours_s = t["ours"].best
    peer_s = t["peer"].best if "peer" in t else None
    speedup = peer_s / ours_s if peer_s else None
    target = MODEL_SPEEDUP_TARGETS.get(name, MODEL_SPEEDUP_TARGET)
    row.update(ours_ms=ours_s * 1e3, peer_ms=None if peer_s is None else peer_s * 1e3, speedup=speedup,
               ours_tok_s=B * T / ours_s, peer_tok_s=None if peer_s is None else B * T / peer_s,
               target=target, meets_target=None if speedup is None else speedup >= target,
               timings={k: v.as_dict() for k, v in t.items()})
    del model, hf, fns
    gc.collect()
    return row


# -- (c) the peak memory of a training step ----------------------------------------------------------

def memory_child(name: str, lengths: list[int], warmup_T: int = 256, seed: int = 0) -> dict[str, Any]:
    """Run in a fresh process: the tensors' peak of one training step (B=1) of a tiny zoo model at
    each length, shortest first (see the module docstring)."""
    from torch.profiler import ProfilerActivity, profile

    from storelab.bench.prefill import _allocation_peak

    cfg, model = _ours_model(name, seed)
    gen = torch.Generator().manual_seed(seed)
    train_step_fn(model, torch.randint(0, cfg.vocab_size, (1, warmup_T), generator=gen), peer=False)()
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    peaks = {}
    for T in sorted(lengths):
        step = train_step_fn(model, torch.randint(0, cfg.vocab_size, (1, T), generator=gen), peer=False)
        for p in model.parameters():
            p.grad = None
        gc.collect()
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            step()
        peaks[str(T)] = _allocation_peak(prof)
        del prof
        gc.collect()  # the profiler's results sit in reference cycles
    return {"model": name, "weights_bytes": weights, "peak_bytes": peaks}


def run_memory_child(name: str, lengths: list[int], timeout_s: float = 3600) -> dict[str, Any]:
    """``memory_child`` in a subprocess (a fresh process per model; an out-of-memory kills only it)."""
    code = ("import json, torch; torch.set_num_threads(%d); from storelab.bench.train import memory_child; "
            "print(json.dumps(memory_child(%r, %r)))" % (torch.get_num_threads(), name, list(lengths)))
    env = {**os.environ, "USE_HUB_KERNELS": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s, env=env)
    if p.returncode != 0:
        raise RuntimeError(p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def memory_row(child: dict[str, Any], lengths: list[int]) -> dict[str, Any]:
    """One model's peaks in MB, and the ratio of the longest to the shortest against the target."""
    lo, hi = min(lengths), max(lengths)
    peaks = child["peak_bytes"]
    ratio = peaks[str(hi)] / peaks[str(lo)] if peaks[str(lo)] else None
    linear = hi / lo * MEMORY_RATIO_TARGET / 4  # 4.4 at 16,384 / 4,096; the same 10 % above linear otherwise
    return {"model": child["model"], "weights_mb": child["weights_bytes"] / 2**20,
            "peak_mb": {T: b / 2**20 for T, b in peaks.items()},
            "bytes_per_token": {T: b / int(T) for T, b in peaks.items()},
            "ratio": ratio, "length_ratio": hi / lo, "ratio_target": linear,
            "meets_target": None if ratio is None else ratio <= linear}


# -- all three -----------------------------------------------------------------------------------------

def bench_train(*, models: list[str] | None = None, ops: dict[str, Any], step: dict[str, Any],
                memory_lengths: tuple[int, ...] = (4096, 16384), progress: bool = False) -> dict[str, Any]:
    """(a), (b) and (c); ``ops`` and ``step`` are keyword arguments of ``bench_train_op`` and
    ``bench_train_model``. Progress goes to stderr with ``progress``."""
    from storelab.zoo import SEVEN, zoo_names

    def say(msg: str) -> None:
        if progress:
            print(f"bench train: {msg} ...", file=sys.stderr, flush=True)

    have = set(zoo_names())
    names = models or list(SEVEN)
    out: dict[str, Any] = {"bench": "train", "threads": torch.get_num_threads(), "dtype": "fp32", "ops": {}}
    for op in ("gdn", "kda"):
        say(f"op {op}")
        out["ops"][op] = bench_train_op(op, **ops)
    rows, mem_rows = [], []
    for name in names:
        if name not in have:
            rows.append({"model": name, "error": "no tiny model in the zoo yet"})
            continue
        say(f"step {name}")
        try:
            rows.append(bench_train_model(name, **step))
        except Exception as e:
            rows.append({"model": name, "error": f"{type(e).__name__}: {str(e)[:300]}"})
    for name in names:
        if name not in have:
            continue
        say(f"memory {name}")
        try:
            mem_rows.append(memory_row(run_memory_child(name, list(memory_lengths)), list(memory_lengths)))
        except Exception as e:
            mem_rows.append({"model": name, "error": f"{type(e).__name__}: {str(e)[:300]}"})
    out["models"] = rows
    out["memory"] = {"lengths": list(memory_lengths), "B": 1, "models": mem_rows,
                     "method": "torch profiler (profile_memory=True) over one training step in a fresh "
                               "subprocess per model: the largest running sum of the CPU allocator's "
                               "allocations and frees during the step, above what was held when it began"}
    return out
