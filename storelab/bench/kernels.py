"""``storelab bench gdn`` and ``storelab bench kda``: the chunked recurrent ops against transformers'.

Ours: ``storelab.ops.gated_delta_rule`` and ``storelab.ops.kda`` (chunk form, the default).
Peer: transformers' pure-PyTorch ``torch_chunk_gated_delta_rule`` (Qwen3-Next) and
``chunk_kimi_delta_attention`` (Kimi Linear), the functions transformers runs on a CPU.
Both get the same inputs: L2-normalised q and k, log decays g <= 0 (per head for Gated
DeltaNet, arXiv 2412.06464; per key channel for KDA, arXiv 2510.26692), beta in (0, 1),
no initial state, the final state returned. Each run also times a 2048^3 fp32 matrix
product in the same rounds, the yardstick for "what fraction of this machine". The figures
are the best of the interleaved rounds (the time least disturbed by the machine's other
work, as ``timeit`` advises); the medians are printed beside them.

FLOPs are counted analytically for each side's chunked algorithm (WY/UT form, arXiv
2406.06484), per head and per chunk of C tokens, every product counted as a dense one. The
peer's (``wy_delta_flops``, the textbook form):

    scores        Q K^T, K K^T                      2 C^2 K  +  2 C^2 K
    UT transform  unit-lower-triangular inverse     C^3 / 3
                  U = T V,  W = T K                 2 C^2 V  +  2 C^2 K
    across chunks V_new = U - W S, O += Q S         2 C K V  +  2 C K V
                  O += A V_new, S += K^T V_new      2 C^2 V  +  2 C K V

i.e. ``2 C^2 (3K + 2V) + C^3 / 3 + 6 C K V``. Ours (``chunk_delta_flops``) never forms U and W:
V_new = T (V - K S) with beta and the decays folded in, found by forward substitution in the C kernel
(C^2 V multiply-adds, counted as the dense C x C x V product T V) or with T applied in the loop (the
tensor form), so ``2 C^2 (2K + 2V) + C^3 / 3 + 6 C K V``. The C^3 / 3 of an inverse stays in the count
though the kernel forms none (under 1 % of it at C = 32, K = V = 64). Each side is counted at the
chunk size it runs: ours at the one ``chunk_size=None`` picks on this CPU (``storelab.ops.tuning``,
printed), the peer at its default of 64. "Fraction of matmul" is our count over our time, over the
matmul rate. Elementwise work (decays, masks, exponentials) is not counted, and KDA is counted like
Gated DeltaNet (its per-channel decay is elementwise work around the same products), so the rates
printed are conservative.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch
import torch.nn.functional as F

from storelab.bench.timing import compare, matmul_fn
from storelab.ops.tuning import DEFAULT_CHUNK, ChunkPlan, chunk_plan

CHUNK = 64  # the peer's chunk size (its default)
GDN_SPEEDUP_TARGET = 3.0
GDN_MATMUL_FRACTION_TARGET = 0.40
KDA_SPEEDUP_TARGET = 10.0
KDA_OVER_GDN_TARGET = 1.5


OURS_CHUNK = DEFAULT_CHUNK  # the chunk training takes (the forward's is chosen per CPU: ``storelab.ops.tuning``)


def ours_plan(name: str, x: dict[str, torch.Tensor]) -> ChunkPlan:
    """The chunk (and group) our op runs at on this CPU for these inputs, as ``chunk_size=None`` picks it."""
    from storelab.ops import delta

    K, V = x["q"].shape[-1], x["v"].shape[-1]
    form = "kernel" if delta._kernel_takes(x["q"]) else "tensor"
    return chunk_plan(form, K, V, x["q"].dtype, name == "kda")


def chunk_delta_flops(B: int, T: int, H: int, K: int, V: int, C: int = OURS_CHUNK) -> int:
    """FLOPs of our chunked delta rule, T applied in the loop (see the module docstring); T is padded
    to whole chunks."""
    N = -(-T // C)
    per_chunk = 2 * C * C * (2 * K + 2 * V) + C**3 // 3 + 6 * C * K * V
    return B * H * N * per_chunk


def wy_delta_flops(B: int, T: int, H: int, K: int, V: int, C: int = CHUNK) -> int:
    """FLOPs of the textbook chunked delta rule, U and W made before the loop (the peer's form)."""
    N = -(-T // C)
    per_chunk = 2 * C * C * (3 * K + 2 * V) + C**3 // 3 + 6 * C * K * V
    return B * H * N * per_chunk


def delta_inputs(B: int, T: int, H: int, K: int, *, per_channel: bool, seed: int = 0) -> dict[str, torch.Tensor]:
    """q, k (unit norm), v, g (log decay, per head or per channel), beta; fp32, layout [B, T, H, D]."""
    gen = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, H, K, generator=gen)
    g_shape = (B, T, H, K) if per_channel else (B, T, H)
    g = F.logsigmoid(torch.randn(*g_shape, generator=gen) + 4.0)  # retention around 0.98 per token
    beta = torch.rand(B, T, H, generator=gen).sigmoid()
    return dict(q=q, k=k, v=v, g=g, beta=beta)


def _peer(name: str) -> tuple[Callable | None, str]:
    """The transformers function, imported lazily; (None, reason) when unavailable."""
    os.environ.setdefault("USE_HUB_KERNELS", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        if name == "gdn":
            from transformers.models.qwen3_next.modeling_qwen3_next import torch_chunk_gated_delta_rule as fn

            return fn, "transformers qwen3_next.torch_chunk_gated_delta_rule"
        from transformers.models.kimi_linear.modeling_kimi_linear import chunk_kimi_delta_attention as fn

        return fn, "transformers kimi_linear.chunk_kimi_delta_attention"
    except Exception as e:  # missing, or a version without the function
        return None, f"unavailable ({type(e).__name__}: {e})"


def _ours(name: str) -> Callable:
    from storelab import ops

    return ops.gated_delta_rule if name == "gdn" else ops.kda


def _call_ours(fn: Callable, x: dict[str, torch.Tensor]):
    return fn(x["q"], x["k"], x["v"], g=x["g"], beta=x["beta"], output_final_state=True)


def _call_peer(fn: Callable, x: dict[str, torch.Tensor]):
    return fn(x["q"], x["k"], x["v"], x["g"], x["beta"], chunk_size=CHUNK, output_final_state=True)


def _max_abs_diff(a: tuple, b: tuple) -> float:
    return max(float((a[0] - b[0]).abs().max()), float((a[1] - b[1]).abs().max()))


def bench_delta(name: str, *, T: int = 4096, H: int = 8, K: int = 64, B: int = 1, repeats: int = 5,
                budget_s: float = 60.0, matmul_n: int = 2048) -> dict[str, Any]:
    """One kernel bench (``name`` is "gdn" or "kda"): ours, the peer, the matmul yardstick.

    KDA's run also times our Gated DeltaNet at the same shape, for the KDA / GDN ratio.
    """
    if name not in ("gdn", "kda"):
        raise ValueError(f"name: must be 'gdn' or 'kda', got {name!r}")
    x = delta_inputs(B, T, H, K, per_channel=(name == "kda"))
    plan = ours_plan(name, x)  # calibrated here where this CPU has no plan yet, not in the timed rounds
    ours = _ours(name)
    peer, peer_name = _peer(name)
    mm, mm_flops = matmul_fn(matmul_n)
    fns: dict[str, Callable] = {"ours": lambda: _call_ours(ours, x)}
    if name == "kda":
        xg = delta_inputs(B, T, H, K, per_channel=False)
        gdn = _ours("gdn")
        fns["ours_gdn"] = lambda: _call_ours(gdn, xg)
    fns["matmul"] = mm
    if peer is not None:
        fns["peer"] = lambda: _call_peer(peer, x)

    with torch.inference_mode():
        diff = _max_abs_diff(_call_ours(ours, x), _call_peer(peer, x)) if peer is not None else None
    t = compare(fns, repeats=repeats, warmup=1, budget_s=budget_s)

    flops = chunk_delta_flops(B, T, H, K, K, plan.chunk)
    peer_flops = wy_delta_flops(B, T, H, K, K, CHUNK)
    rate = mm_flops / t["matmul"].best
    ours_s = t["ours"].best
    peer_s = t["peer"].best if peer is not None else None
    speedup = peer_s / ours_s if peer_s else None
    out: dict[str, Any] = {
        "bench": name,
        "shape": {"B": B, "T": T, "H": H, "K": K, "V": K, "dtype": "fp32"},
        "chunk": {"ours": plan.chunk, "peer": CHUNK},
        "ours_group_floats": plan.group_floats,
        "threads": torch.get_num_threads(),
        "statistic": "best of interleaved rounds",
        "ours": "storelab.ops." + ("gated_delta_rule" if name == "gdn" else "kda") + " (chunk)",
        "peer": peer_name,
        "ours_ms": ours_s * 1e3,
        "peer_ms": None if peer_s is None else peer_s * 1e3,
        "speedup": speedup,
        "max_abs_diff": diff,
        "flops": flops,
        "peer_flops": peer_flops,
        "ours_gflops": flops / ours_s / 1e9,
        "peer_gflops": None if peer_s is None else peer_flops / peer_s / 1e9,
        "matmul_gflops": rate / 1e9,
        "matmul_n": matmul_n,
        "fraction_of_matmul": flops / ours_s / rate,
        "timings": {k: v.as_dict() for k, v in t.items()},
    }
    if name == "gdn":
        out["targets"] = {
            f"speedup >= {GDN_SPEEDUP_TARGET:g}": None if speedup is None else speedup >= GDN_SPEEDUP_TARGET,
            f"fraction_of_matmul >= {GDN_MATMUL_FRACTION_TARGET:g}":
                out["fraction_of_matmul"] >= GDN_MATMUL_FRACTION_TARGET,
        }
    else:
        out["ours_gdn_ms"] = t["ours_gdn"].best * 1e3
        out["kda_over_gdn"] = ours_s / t["ours_gdn"].best
        out["targets"] = {
            f"speedup >= {KDA_SPEEDUP_TARGET:g}": None if speedup is None else speedup >= KDA_SPEEDUP_TARGET,
            f"kda_over_gdn <= {KDA_OVER_GDN_TARGET:g}": out["kda_over_gdn"] <= KDA_OVER_GDN_TARGET,
        }
    return out
