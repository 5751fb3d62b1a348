"""``storelab bench mamba2``: Mamba-2's chunked SSD, forward + backward, against transformers' torch path.

Two rows, each forward + backward under autograd (``torch.autograd.grad`` of the outputs, and of the final
state for the op, against fixed random cotangents), in interleaved rounds with a square fp32 matrix product
of comparable size (the yardstick: "what fraction of this machine"):

* ``op``: ``storelab.ops.ssd`` (chunk form, its backward by hand) against transformers'
  ``mamba2_chunk_scan`` (the function ``Mamba2Mixer`` runs on a CPU), on the same x, dt, A, B, C, D;
* ``mixer``: our ``mamba2`` store against ``Mamba2Mixer`` in training mode with no cache (its torch path:
  the fused kernel is absent), the same weights (the store docstring's table), gradients of the input and
  of every parameter.

Each side runs at its own default chunk size (ours 64, transformers' config 256). FLOPs are counted for our
chunked algorithm, every product as a dense one, per chunk of L tokens (P head width, N state width; per
head unless "per group", G groups of heads sharing B and C):

    forward   C B^T 2 L^2 N per group; M x 2 L^2 P; the chunk's write (w x)^T B 2 L P N; C S_0 2 L N P
    backward  C B^T again 2 L^2 N per group, dM = dy x^T and dx = M^T dy 2 L^2 P each, dC and dB from the
              scores 2 L^2 N each per group; C S_0 again, dC from S_0, dS_0, dW B and dB from dW 2 L P N each

i.e. ``H (6 L^2 P + 14 L P N) + G (8 L^2 N)`` per chunk (``ssd_train_flops``). The mixer adds its two
projections, 2 T D (2 d_inner + 2 G N + H) + 2 T d_inner D forward and twice that backward; the short
convolution, the norm and the gates are elementwise and not counted, so the rates printed are conservative.
Figures are the best of the interleaved rounds (medians beside them); ``--quick`` sizes are smoke checks only.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import torch
import torch.nn.functional as F

from storelab.bench.timing import compare, matmul_fn
from storelab.bench.train import comparable_matmul_n

OURS_CHUNK = 64
PEER_CHUNK = 256  # transformers' Mamba2Config default


def ssd_train_flops(B: int, T: int, H: int, P: int, N: int, G: int, L: int = OURS_CHUNK) -> int:
    """FLOPs of our chunked SSD's forward + backward (module docstring); T padded to whole chunks."""
    n = -(-T // L)
    return B * n * (H * (6 * L * L * P + 14 * L * P * N) + G * 8 * L * L * N)


def mixer_train_flops(B: int, T: int, D: int, H: int, P: int, N: int, G: int, L: int = OURS_CHUNK) -> int:
    """The op's count plus the mixer's two projections, forward and backward (3 x the forward)."""
    di = H * P
    projections = 2 * B * T * D * (2 * di + 2 * G * N + H) + 2 * B * T * di * D
    return ssd_train_flops(B, T, H, P, N, G, L) + 3 * projections


def _peer_scan() -> tuple[Callable | None, str]:
    os.environ.setdefault("USE_HUB_KERNELS", "0")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from transformers.models.mamba2.modeling_mamba2 import mamba2_chunk_scan
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        return mamba2_chunk_scan, "transformers mamba2.mamba2_chunk_scan"
    except Exception as e:  # missing, or a version without the function
        return None, f"unavailable ({type(e).__name__}: {e})"


def ssd_inputs(B: int, T: int, H: int, P: int, N: int, G: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """x, dt (softplus of N(-2, 1): steps around 0.1), A in [-8, -1], B, C, D; fp32 leaves."""
    gen = torch.Generator().manual_seed(seed)
    x = {"x": torch.randn(B, T, H, P, generator=gen), "dt": F.softplus(torch.randn(B, T, H, generator=gen) - 2),
         "A": -(1 + 7 * torch.rand(H, generator=gen)), "B": torch.randn(B, T, G, N, generator=gen),
         "C": torch.randn(B, T, G, N, generator=gen), "D": torch.randn(H, generator=gen)}
    return {k: t.requires_grad_(True) for k, t in x.items()}


def _op_steps(x: dict[str, torch.Tensor], peer: Callable | None, seed: int = 1) -> dict[str, Callable]:
    from storelab.ops import ssd

    B, T, H, P = x["x"].shape
    gen = torch.Generator().manual_seed(seed)
    dy, dS = torch.randn(B, T, H, P, generator=gen), torch.randn(B, H, P, x["B"].shape[-1], generator=gen)
    leaves = list(x.values())

    def ours():
        y, S = ssd(x["x"], x["dt"], x["A"], x["B"], x["C"], D=x["D"], output_final_state=True, chunk_size=OURS_CHUNK)
        return torch.autograd.grad((y, S), leaves, (dy, dS))

    def theirs():
        y, S = peer(x["x"], x["dt"], x["A"], x["B"], x["C"], PEER_CHUNK, D=x["D"], return_final_states=True)
        return torch.autograd.grad((y, S), leaves, (dy, dS))

    return {"ours": ours, **({"peer": theirs} if peer is not None else {})}


def _mixers(D: int, H: int, P: int, N: int, G: int, seed: int = 0):
    """Our store and transformers' Mamba2Mixer (training mode) with the same weights, and their parameters in
    one order: (ours, ours' parameters, peer or None, peer's parameters, peer name)."""
    from storelab.stores import build_store

    torch.manual_seed(seed)
    ours = build_store(dict(kind="mamba2", d_model=D, n_heads=H, head_dim=P, d_state=N, n_groups=G,
                            chunk_size=OURS_CHUNK)).build()
    names, mine = zip(*ours.named_parameters())
    try:
        from transformers import Mamba2Config
        from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer
    except Exception as e:
        return ours, list(mine), None, [], f"unavailable ({type(e).__name__}: {e})"
    if (H * P) % D:
        raise ValueError(f"D: the mixer's d_inner {H * P} (heads x head width) must be a multiple of d_model {D} "
                         "(transformers' expand is a whole number)")
    cfg = Mamba2Config(hidden_size=D, num_heads=H, head_dim=P, state_size=N, n_groups=G, expand=H * P // D,
                       chunk_size=PEER_CHUNK, num_hidden_layers=1, layer_norm_epsilon=ours.cfg.norm_eps)
    peer = Mamba2Mixer(cfg, layer_idx=0).train()
    table = {"conv_weight": "conv1d.weight", "conv_bias": "conv1d.bias", "norm_weight": "norm.weight"}  # ours -> theirs
    theirs = [peer.get_parameter(table.get(n, n)) for n in names]
    with torch.no_grad():
        for p, q in zip(mine, theirs):
            q.copy_(p.view(q.shape))
    return ours, list(mine), peer, theirs, "transformers mamba2.Mamba2Mixer (torch path, training mode)"


def _mixer_steps(ours, mine, peer, theirs, x_BTD: torch.Tensor, seed: int = 2) -> dict[str, Callable]:
    """Forward + backward of each mixer: the gradients of x and of the parameters, in the same order."""
    dy = torch.randn(x_BTD.shape, generator=torch.Generator().manual_seed(seed))

    def ours_step():
        return torch.autograd.grad(ours(x_BTD)[0], [x_BTD, *mine], dy)

    def peer_step():
        return [g.view(p.shape) for g, p in zip(torch.autograd.grad(peer(x_BTD), [x_BTD, *theirs], dy),
                                                [x_BTD, *mine])]

    return {"ours": ours_step, **({"peer": peer_step} if peer is not None else {})}


def _row(name: str, fns: dict[str, Callable], flops: int, shape: dict, ours_name: str, peer_name: str,
         diff: float | None, repeats: int, budget_s: float) -> dict[str, Any]:
    matmul_n = comparable_matmul_n(flops)
    fns["matmul"], mm_flops = matmul_fn(matmul_n)
    t = compare(fns, repeats=repeats, warmup=1, budget_s=budget_s, inference=False)
    ours_s, rate = t["ours"].best, mm_flops / t["matmul"].best
    peer_s = t["peer"].best if "peer" in t else None
    return {"bench": f"mamba2 {name}", "shape": shape, "chunk": {"ours": OURS_CHUNK, "peer": PEER_CHUNK},
            "threads": torch.get_num_threads(), "statistic": "best of interleaved rounds, forward + backward",
            "ours": ours_name, "peer": peer_name, "ours_ms": ours_s * 1e3,
            "peer_ms": None if peer_s is None else peer_s * 1e3,
            "speedup": None if peer_s is None else peer_s / ours_s, "grad_max_abs_diff": diff,
            "flops": flops, "ours_gflops": flops / ours_s / 1e9, "matmul_n": matmul_n,
            "matmul_gflops": rate / 1e9, "fraction_of_matmul": flops / ours_s / rate,
            "timings": {k: v.as_dict() for k, v in t.items()}}


def _max_diff(a: tuple, b: tuple) -> float:
    return max(float((u - w).abs().max()) for u, w in zip(a, b))


def bench_mamba2(*, T: int = 4096, H: int = 8, P: int = 64, N: int = 64, G: int = 1, D: int = 256, B: int = 1,
                 repeats: int = 10, budget_s: float = 120.0) -> dict[str, Any]:
    """The op and the mixer rows (module docstring); the gradients compared once before timing."""
    shape = {"B": B, "T": T, "H": H, "P": P, "N": N, "G": G, "dtype": "fp32"}
    peer, peer_name = _peer_scan()
    x = ssd_inputs(B, T, H, P, N, G)
    fns = _op_steps(x, peer)
    diff = _max_diff(fns["ours"](), fns["peer"]()) if "peer" in fns else None
    rows = {"op": _row("op", fns, ssd_train_flops(B, T, H, P, N, G), shape, "storelab.ops.ssd (chunk, hand backward)",
                       peer_name, diff, repeats, budget_s)}
    ours, mine, mixer, theirs, mixer_name = _mixers(D, H, P, N, G)
    x_BTD = torch.randn(B, T, D, generator=torch.Generator().manual_seed(3)).requires_grad_(True)
    fns = _mixer_steps(ours, mine, mixer, theirs, x_BTD)
    diff = _max_diff(fns["ours"](), fns["peer"]()) if "peer" in fns else None
    rows["mixer"] = _row("mixer", fns, mixer_train_flops(B, T, D, H, P, N, G), {**shape, "D": D},
                         "storelab mamba2 store (chunk)", mixer_name, diff, repeats, budget_s)
    return rows
