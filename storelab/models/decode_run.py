"""A run of decoder layers in one C call (``layer_run_f32``, ``storelab/ops/kernels/decode_step.c``).

``storelab.models.decode.Decoder`` hands a run the layers whose step it may take: pre-norm or sandwich, attention
(full, or a window's ring buffer) with rotate-half rotary angles and optional per-head q/k RMSNorms, then an optional
gated FFN (swiglu, geglu_tanh); every norm an fp32 RMSNorm, every product an ``nn.Linear`` (fp32) or a
``QuantLinear`` (bf16, int8). ``RunLayer.make`` describes such a layer to C once (``layer_t``: pointers to its weights
and norms, its widths) and answers None for any other; each step ``RunLayer.prepare`` claims the cache row its new
entry goes to and fills ``layer_step_t`` (the angles, the cache's rows), and ``Runs.run`` computes consecutive
prepared layers, with the final norm and the LM head where the run ends the model, in one OpenMP region on torch's
threads (the kernel's comment says where the threads meet). ``RunLayer.after`` then moves the counters the Python
step would have moved.

Between the per-call kernels of ``storelab.models.decode`` the threads had waited and Python had run (a SmolLM2-135M
step at 2 threads and 1,024 tokens, 2026-12-07: 34.2 -> 30.3 ms in one process; docs/bench.md).

Shape legend: D model width, N vocabulary.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor, nn

from storelab.models.model import LayerState
from storelab.models.quant import QuantLinear, packed
from storelab.ops.norm import RMSNorm
from storelab.state import EmptyState, KVCache, WindowCache

__all__ = ["Runs", "RunLayer"]

_P, _L, _F = ctypes.c_void_p, ctypes.c_long, ctypes.c_float


class WeightC(ctypes.Structure):
    """``weight_t``: a PackedWeight's pointers, rows and format."""
    _fields_ = [("w", _P), ("scale", _P), ("bias", _P), ("rows", _L), ("fmt", ctypes.c_int)]


class LayerC(ctypes.Structure):
    """``layer_t``: what a layer of a run keeps between steps."""
    _fields_ = [("norm1", _P), ("post1", _P), ("norm2", _P), ("post2", _P),
                ("eps1", _F), ("eps_post1", _F), ("eps2", _F), ("eps_post2", _F),
                ("q", WeightC), ("k", WeightC), ("v", WeightC), ("o", WeightC),
                ("gate", WeightC), ("up", WeightC), ("down", WeightC),
                ("H", _L), ("G", _L), ("K", _L), ("V", _L), ("R", _L), ("F", _L),
                ("scale", _F), ("value_scale", _F), ("qk_eps", _F),
                ("qn", _P), ("kn", _P), ("sinks", _P), ("act", ctypes.c_int)]


class StepC(ctypes.Structure):
    """``layer_step_t``: what a step gives a layer (angles, the cache's rows, where the new entry goes)."""
    _fields_ = [("cos", _P), ("sin", _P), ("k", _P), ("v", _P), ("L", _L), ("k_row", _L), ("k_head", _L),
                ("v_row", _L), ("v_head", _L), ("k_dst", _P), ("v_dst", _P)]


_FMT = {"fp32": 0, "bf16": 1, "int8": 2}
_ACT = {"swiglu": 0, "geglu_tanh": 1}   # the gated activations layer_run_f32 computes


def _rms_of(module: nn.Module | None) -> tuple[Tensor, float] | None:
    """An fp32 RMSNorm's weight (contiguous, the parameter's own storage) and epsilon, else None."""
    if type(module) is not RMSNorm or module.weight.dtype != torch.float32 or not module.weight.is_contiguous():
        return None
    return module.weight.detach(), float(module.eps)


def _weight_c(linear: nn.Module, keep: list) -> WeightC | None:
    """A linear layer's ``weight_t`` (its packed weight kept alive in ``keep``), or None where it is not one."""
    if not isinstance(linear, (nn.Linear, QuantLinear)):
        return None
    pw = packed(linear)
    if pw.data_NK.device.type != "cpu" or (pw.bias_N is not None and pw.bias_N.dtype != torch.float32):
        return None
    keep.append(pw)
    return WeightC(pw.data_NK.data_ptr(), None if pw.scale_N is None else pw.scale_N.data_ptr(),
                    None if pw.bias_N is None else pw.bias_N.data_ptr(), pw.rows, _FMT[pw.fmt])


class RunLayer:
    """A layer that a run computes in C (``layer_run_f32``): pre-norm or sandwich, attention (full, or a window's
    ring buffer) with rotate-half rotary angles and optional per-head q/k RMSNorms, then an optional gated FFN
    (swiglu, geglu_tanh); every norm an fp32 RMSNorm, every product an ``nn.Linear`` or ``QuantLinear``.
    ``make`` answers None for any other layer (its Python step runs)."""

    @classmethod
    def make(cls, block: nn.Module, token, channel, window: int | None, slot: LayerC) -> "RunLayer | None":
        """``token``: the layer's attention step (``storelab.models.decode``: its store, config, widths, angles;
        ``window``: its ring's length, None for full attention); ``channel``: its FFN step or None. ``slot``:
        filled with the layer's ``layer_t``."""
        store, c = token.store, token.cfg
        if channel is not None and (not channel.cfg.gated or channel.cfg.activation not in _ACT
                                    or channel.cfg.swiglu_limit is not None):
            return None
        sandwich = block.norms == "sandwich"
        norm1 = _rms_of(block.norm_token)
        post1 = _rms_of(block.post_norm_token) if sandwich else None
        norm2 = None if channel is None else _rms_of(block.norm_channel)
        post_c = getattr(block, "post_norm_channel", None) if sandwich else None
        post2 = _rms_of(post_c) if post_c is not None else None
        if norm1 is None or (sandwich and post1 is None) or (channel is not None and norm2 is None) \
                or (post_c is not None and post2 is None):
            return None
        keep: list = [norm1, post1, norm2, post2]
        ws = {n: _weight_c(getattr(store, f"{n}_proj"), keep) for n in ("q", "k", "v", "o")}
        if channel is not None:
            ws.update({n: _weight_c(getattr(channel.store, f"{n}_proj"), keep) for n in ("gate", "up", "down")})
        if any(w is None for w in ws.values()):
            return None
        norms = [m for m in (store.q_norm, store.k_norm) if m is not None]
        qk = [m.weight.detach().contiguous() for m in norms]
        keep += qk
        sinks = None if store.sinks is None else store.sinks.detach().float().contiguous()
        keep.append(sinks)
        ptr = lambda t: None if t is None else t.data_ptr()   # noqa: E731
        slot.norm1, slot.eps1 = ptr(norm1[0]), norm1[1]
        if post1 is not None:
            slot.post1, slot.eps_post1 = ptr(post1[0]), post1[1]
        if norm2 is not None:
            slot.norm2, slot.eps2 = ptr(norm2[0]), norm2[1]
        if post2 is not None:
            slot.post2, slot.eps_post2 = ptr(post2[0]), post2[1]
        for n, w in ws.items():
            setattr(slot, n, w)
        slot.H, slot.G, slot.K, slot.V, slot.R = token.H, token.G, token.K, token.V, c.rotary_dim
        slot.F = 0 if channel is None else channel.F
        slot.scale, slot.value_scale = float(c.scale), float(c.value_scale)
        slot.qk_eps = float(norms[0].eps) if norms else 0.0
        slot.qn, slot.kn = (qk[0].data_ptr(), qk[1].data_ptr()) if qk else (None, None)
        slot.sinks = ptr(sinks)
        slot.act = 0 if channel is None else _ACT[channel.cfg.activation]
        return cls(token, window, channel is not None, keep)

    def __init__(self, token, window: int | None, has_ffn: bool, keep: list):
        self.token, self.window, self.has_ffn, self.keep = token, window, has_ffn, keep

    def prepare(self, st: LayerState, sc: StepC) -> bool:
        """Fill this step's ``layer_step_t``, claiming the cache row the new entry goes to; False (nothing
        changed) where the cache is not one this layer writes in C (then its Python step runs)."""
        t, G, K, V = self.token, self.token.G, self.token.K, self.token.V
        state = st.token
        if self.window is None:
            if type(state) is not KVCache:
                return False
            slot = state.claim_one(G, K, V, torch.float32)
            if slot is None:
                return False
            buf, n, k_off, v_off = slot
            e, base = buf.element_size(), buf.data_ptr()
            row, head = buf.stride(1), buf.stride(2)
            sc.k, sc.v, sc.L = base + k_off * e, base + v_off * e, n
            sc.k_row = sc.v_row = row
            sc.k_head = sc.v_head = head
            sc.k_dst, sc.v_dst = sc.k + n * row * e, sc.v + n * row * e
        else:
            W = self.window
            if state is None:
                state = st.token = WindowCache(window=W)
            if type(state) is not WindowCache or state.window != W:
                return False
            if state.k is None:
                state.k, state.v = torch.zeros(1, W, G, K), torch.zeros(1, W, G, V)
            if not (state.k.dtype == state.v.dtype == torch.float32 and state.k.is_contiguous()
                    and state.v.is_contiguous() and state.k.shape == (1, W, G, K) and state.v.shape == (1, W, G, V)):
                return False
            kp, vp = state.k.data_ptr(), state.v.data_ptr()
            sc.k, sc.v, sc.L = kp, vp, state.filled
            sc.k_row, sc.k_head, sc.v_row, sc.v_head = G * K, K, G * V, V
            sc.k_dst, sc.v_dst = kp + state.head * G * K * 4, vp + state.head * G * V * 4
        if t.R:
            cos, sin = t.angles.pair(t.cfg, state.seen)
            sc.cos, sc.sin = cos.data_ptr(), sin.data_ptr()
        return True

    def after(self, st: LayerState) -> None:
        """The counters the run's step moved: the layer's, its cache's (a window's head and fill), the FFN's."""
        st.seen += 1
        state = st.token
        if self.window is not None:
            state.head = (state.head + 1) % self.window
            state.filled = min(self.window, state.filled + 1)
        state.seen += 1
        if self.has_ffn:
            st.channel = EmptyState(seen=(0 if st.channel is None else st.channel.seen) + 1)


class Runs:
    """The layers computed in C, runs of consecutive ones each in one call of ``layer_run_f32`` (with the final
    norm and the LM head where the run ends the model); the threads are the decoder's."""

    def __init__(self, model: nn.Module, lib: ctypes.CDLL, threads: int, candidates: list[tuple | None]):
        """``candidates``: per layer, (attention step, FFN step or None, window or None) where the decoder's step
        of that layer is one a run may take, else None."""
        m = model
        n = m.cfg.n_layers
        self.lib, self.threads = lib, threads
        self.layers, self.steps = (LayerC * n)(), (StepC * n)()
        self.c: list[RunLayer | None] = [
            None if cand is None else RunLayer.make(m.blocks[i], cand[0], cand[1], cand[2], self.layers[i])
            for i, cand in enumerate(candidates)]
        self.keep: list = []
        fnorm, head = _rms_of(m.norm), _weight_c(m.lm_head, self.keep)
        self.head = None if fnorm is None or head is None or m.lm_head.in_features != m.cfg.d_model else head
        self.fnorm = fnorm
        self.head_rows = 0 if self.head is None else head.rows
        self.D = m.cfg.d_model
        self.work = torch.empty(0)

    def count(self) -> int:
        return sum(c is not None for c in self.c)

    def run(self, i0: int, i1: int, h_D: Tensor, cache: list[LayerState], *, with_head: bool) -> Tensor | None:
        """Layers i0..i1-1 (prepared) over h in place; with the head, the logits [N]."""
        lib, T = self.lib, self.threads
        size = ctypes.sizeof(LayerC)
        ls = ctypes.byref(self.layers, i0 * size)
        ss = ctypes.byref(self.steps, i0 * ctypes.sizeof(StepC))
        need = lib.layer_run_floats(ls, i1 - i0, self.D, T)
        if self.work.numel() < need:
            self.work = torch.empty(need)
        logits = torch.empty(self.head_rows) if with_head else None
        lib.layer_run_f32(ls, ss, i1 - i0, h_D.data_ptr(), self.D,
                          self.fnorm[0].data_ptr() if with_head else None, self.fnorm[1] if with_head else 0.0,
                          ctypes.byref(self.head) if with_head else None,
                          logits.data_ptr() if with_head else None, self.work.data_ptr(), T)
        for i in range(i0, i1):
            self.c[i].after(cache[i])
        return logits
