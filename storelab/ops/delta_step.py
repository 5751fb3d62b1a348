"""The delta rules token by token in C, forward and backward, for training with small states.

For narrow heads (K x V up to ``MAX_STATE``, e.g. the tiny Qwen3.8's 16 x 16) the chunked training form
(``delta_train``) spends its time on the per-call cost of thousands of 16 x 16 products and on passes
over its chunk-sized tensors, not on arithmetic. Here the plain per-token recursion runs instead, in C
(``kernels/delta_step.c``, built by ``storelab.ops.compiled``), with heads side by side in SIMD lanes:
    P = diag(exp(g_t)) S_{t-1},  r = v_t - P^T k_t,  S_t = P + beta_t k_t r^T,  o_t = scale S_t^T q_t
and its backward written out token by token (the equations head the C file). Forward keeps the state
entering every ``SPAN`` tokens (memory linear in T, K V / SPAN numbers per token and head); backward runs
each span forward again from its state, then back. Exact: the same sums as the per-token reference, in
another order (tests hold both to 1e-12 in float64). Measured (fp32, one thread, B=4, T=2,048, 4 heads,
forward + backward, the two forms interleaved): K = V = 16 11.0 against 31.3 ms, 32 x 32 28.5 against
64.3, 32 x 64 53.2 against 87.3, 64 x 64 160 against 174 (hence ``MAX_STATE``: wider states keep the
chunked form, whose products grow more efficient with the width).

Who uses it: ``delta.py``'s training path, for float32 / float64 inputs on a CPU, when the library
builds (``available()``); else the chunked form runs, which computes the same thing.
Threads: the lane groups are split between ``torch.get_num_threads()`` threads (ctypes lets go of the GIL).
"""

from __future__ import annotations

import ctypes
import torch
from torch import Tensor

from storelab.ops.compiled import compiled_library, compiled_unavailable, in_threads

__all__ = ["step_train", "step_train_fits"]

MAX_STATE = 32 * 64  # K * V at most (module docstring)
MIN_FILL = 0.5  # the share of the lanes that must hold heads (the rest are padding, computed for nothing)
SPAN = 32  # tokens between kept states (measured flat from 16 to 64 at K = 16, best at 32-64 for K = 32)

_P, _L, _I = ctypes.c_void_p, ctypes.c_long, ctypes.c_int
_REALS = (torch.float32, torch.float64)
_SIGNATURES = {"delta_step_lanes": ([], _I)}
for _suf, _real in (("f32", ctypes.c_float), ("f64", ctypes.c_double)):
    _SIGNATURES[f"delta_forward_{_suf}"] = ([_P] * 8 + [_L] * 5 + [_I, _real, _L, _L, _L], None)
    _SIGNATURES[f"delta_backward_{_suf}"] = ([_P] * 14 + [_L] * 5 + [_I, _real, _L, _L, _L], None)


def _library() -> ctypes.CDLL | None:
    return compiled_library("delta_step", _SIGNATURES)


def step_train_fits(q: Tensor, v: Tensor) -> bool:
    """Whether the per-token kernel takes these inputs q [B, T, HV, K], v [B, T, HV, V]: a CPU, float32 or
    float64, K * V <= ``MAX_STATE``, at least ``MIN_FILL`` of the lanes holding heads, and the library built.
    (A lane group costs the same however few of its lanes hold heads; the chunked form's cost falls with
    the heads.)"""
    if not (q.device.type == "cpu" and q.dtype in _REALS
            and q.shape[-1] * v.shape[-1] <= MAX_STATE):
        return False
    lib = _library()
    if lib is None:
        return False
    heads, lanes = q.shape[0] * q.shape[2], lib.delta_step_lanes()
    return heads >= MIN_FILL * (-(-heads // lanes) * lanes)


def _ptr(t: Tensor | None) -> int | None:
    return None if t is None else t.data_ptr()


def _run_groups(fn, args: tuple, groups: int) -> None:
    """fn(*args, g0, g1) over the lane groups, split between torch's threads."""
    in_threads(lambda g0, g1: fn(*args, g0, g1), groups, torch.get_num_threads())


class _DeltaSteps(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, S0, scale: float):
        lib = _library()
        B, T, H, K = q.shape
        V = v.shape[-1]
        suf = "f64" if q.dtype == torch.float64 else "f32"
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        g = None if g is None else g.contiguous()
        beta = None if beta is None else beta.contiguous()
        S0 = None if S0 is None else S0.contiguous()
        g_mode = 0 if g is None else (2 if g.dim() == 4 else 1)
        W = lib.delta_step_lanes()
        G, NC = -(-B * H // W), -(-T // SPAN)
        o = q.new_empty(B, T, H, V)
        kept = q.new_empty(G, NC + 1, K, V, W)                                       # lane layout, C's own
        _run_groups(getattr(lib, f"delta_forward_{suf}"),
                    (_ptr(q), _ptr(k), _ptr(v), _ptr(g), _ptr(beta), _ptr(S0), _ptr(o), _ptr(kept),
                     B, T, H, K, V, g_mode, scale, SPAN), G)
        ctx.save_for_backward(q, k, v, g, beta, kept)
        ctx.setup = (scale, g_mode, suf, S0 is not None)
        S_final = kept[:, NC].permute(0, 3, 1, 2).reshape(G * W, K, V)[: B * H].reshape(B, H, K, V)
        return o, S_final

    @staticmethod
    def backward(ctx, do, dS_final):
        q, k, v, g, beta, kept = ctx.saved_tensors
        scale, g_mode, suf, has_S0 = ctx.setup
        lib = _library()
        B, T, H, K = q.shape
        V = v.shape[-1]
        do = do.to(q.dtype).contiguous()
        dS_final = None if dS_final is None else dS_final.to(q.dtype).contiguous()
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        dg = None if g is None else torch.empty_like(g)
        db = None if beta is None else torch.empty_like(beta)
        dS0 = q.new_empty(B, H, K, V)
        _run_groups(getattr(lib, f"delta_backward_{suf}"),
                    (_ptr(q), _ptr(k), _ptr(v), _ptr(g), _ptr(beta), _ptr(kept), _ptr(do), _ptr(dS_final),
                     _ptr(dq), _ptr(dk), _ptr(dv), _ptr(dg), _ptr(db), _ptr(dS0), B, T, H, K, V, g_mode, scale,
                     SPAN), kept.shape[0])
        return dq, dk, dv, dg, db, (dS0 if has_S0 else None), None


def step_train(q: Tensor, k: Tensor, v: Tensor, g: Tensor | None, beta: Tensor | None, S0: Tensor | None, *,
               scale: float) -> tuple[Tensor, Tensor]:
    """(o [B,T,H,V], final state [B,H,K,V]) of the per-token rule with its C backward; inputs as
    ``delta_reference.prepare_delta_inputs`` returns them (heads matched, one dtype, scale given); g None,
    [B,T,H] or [B,T,H,K]; beta None (linear attention) or [B,T,H]. Needs ``step_train_fits``. The C code
    reads the tensors' memory as these shapes, so a shape, dtype or device out of line is refused here."""
    B, T, H, K = q.shape if q.dim() == 4 else (None,) * 4
    V = v.shape[-1]
    want = {"q": (q, (B, T, H, K)), "k": (k, (B, T, H, K)), "v": (v, (B, T, H, V)),
            "g": (g, (B, T, H) if g is None or g.dim() == 3 else (B, T, H, K)), "beta": (beta, (B, T, H)),
            "S0": (S0, (B, H, K, V))}
    for name, (t, shape) in want.items():
        if t is not None and tuple(t.shape) != shape:
            raise ValueError(f"{name}: expected shape {list(shape)}, got {list(t.shape)}")
        if t is not None and (t.dtype != q.dtype or t.device.type != "cpu" or q.dtype not in _REALS):
            raise ValueError(f"{name}: the C kernel takes CPU float32 or float64 tensors of one dtype, got "
                             f"{t.device.type} {t.dtype} (q: {q.dtype})")
    if _library() is None:
        raise RuntimeError(f"the delta_step kernel is not built: {compiled_unavailable('delta_step')}")
    return _DeltaSteps.apply(q, k, v, g, beta, S0, float(scale))
