"""One token's step through a model, without the general path's overhead: ``Decoder(model).step(ids, cache)``.

A decode step reads every weight once for one token; done well its time is the weights' bytes over the
memory rate. The general path (``Model.forward``) spends a third again on work around the products
(docs/bench.md, issue 39): checks made for every call, positions and rotary angles built in every layer,
q, k and v (gate and up) in separate calls, new tensors for every intermediate. Here the choices are made
once, at construction, per layer:

* the products: every linear weight is packed once (``storelab.ops.matvec``: fp32 as it is, or the bf16 /
  int8 weight a ``QuantLinear`` holds) and multiplied by the C kernel into buffers made once; the outputs
  of q, k and v (gate and up) are written side by side into one buffer, so the layer reads one vector;
* a full-attention layer (``Attention``) appends its key and value to the cache in place (the cache's row
  buffer has room for the tokens ``upcoming`` announces) and reads it through the store's own kernel;
* a window layer (``WindowAttention``) reads its ring buffer in place, oldest-first order not needed:
  the softmax over the window's W entries and the one over the new entry are merged by their
  log-sum-exps (``merge_parts``), then the new entry is written over the oldest;
* the rotary angles of a step are computed once per (rotary width, base, scaling, position) and shared
  by the layers;
* an FFN layer runs its gate and up products into one buffer and its declared activation on the halves;
* the LM head reads the last position only (a step has one), through the same kernel;
* where the C library is built, a run of consecutive layers of attention and a gated FFN with fp32 RMSNorms is one
  call of ``layer_run_f32`` (``storelab.models.decode_run``: which layers, and what it saved), with the final norm
  and the LM head where the run ends the model. A layer the run does not compute, or whose cache has no room claimed
  this step, runs as above between two runs.

Any other layer runs as the general path runs it (``Block.forward``: a recurrent store, MoE, an Engram,
a layer that reads another's cache); so does every layer of a model whose depth store is not the plain
residual, or whose weights are not fp32 (``--dtype bf16``). Exact: the same operations as the general path,
the sums of each product in another order (tests/test_decode_fast.py holds logits and states equal to
fp32 rounding on the zoo's tiny models, a hybrid with recurrent states and a window cache, and a
transformers-format folder).

One token per step and one sequence (B = 1): ``generate`` takes this path for a single prompt.

Shape legend: B batch (1), T tokens (1), D model width, H query heads, G key/value heads, K key width,
V value width, F FFN width, W window, N vocabulary.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from storelab.models.model import LayerState, Model
from storelab.models.decode_run import Runs
from storelab.models.quant import packed
from storelab.ops.attention import attend_lse, merge_parts
from storelab.ops.compiled import compiled_library
from storelab.ops.norm import RMSNorm
from storelab.ops.matvec import RowSplit, bind
from storelab.ops.rope import rope_frequencies, rotate
from storelab.state import EmptyState, KVCache, WindowCache
from storelab.stores.attention import Attention, WindowAttention
from storelab.stores.depth import ResidualHead, ResidualMixer, ResidualState
from storelab.stores.ffn import FFN

__all__ = ["Decoder", "packed"]


class _Products:
    """Several weights that read one input, written side by side into one output buffer made once."""

    def __init__(self, linears: list[nn.Module], split: RowSplit):
        pws = [packed(m) for m in linears]
        self.widths = [p.rows for p in pws]
        self.out = torch.empty(sum(self.widths))
        offs = [sum(self.widths[:i]) for i in range(len(pws))]
        self._runs = [(bind(p, split), self.out[o:o + p.rows]) for p, o in zip(pws, offs)]

    def __call__(self, x_D: Tensor) -> Tensor:
        for run, out in self._runs:
            run(x_D, out)
        return self.out


class _Angles:
    """The rotary cos / sin of one step, computed once per (width, base, scaling, position): as ``rope_angles``
    gives them ([1, R/2]), and spread over a whole head of K channels for the rotate-half pairing,
    cos_K = [cos, cos, 1...], sin_K = [sin, sin, 0...], so that y = x cos_K + [-x2, x1, x_rest] sin_K is
    ``rotate``'s x1 cos - x2 sin, x2 cos + x1 sin, x_rest, bit for bit (x_rest 1 + x_rest 0 = x_rest)."""

    def __init__(self):
        self._memo: dict[tuple, tuple[Tensor, Tensor, Tensor, Tensor]] = {}
        self._pairs: dict[tuple, tuple[Tensor, Tensor]] = {}
        self._freqs: dict[tuple, tuple[Tensor, float]] = {}   # kept across steps: they do not depend on the position

    def reset(self) -> None:
        self._memo.clear()
        self._pairs.clear()

    def pair(self, cfg, position: int) -> tuple[Tensor, Tensor]:
        """``rope_angles``' cos, sin [1, R/2] at ``position``, the frequencies computed once per (width, base, scaling)."""
        key = (cfg.rotary_dim, cfg.rope_theta, repr(cfg.rope_scaling))
        got = self._pairs.get(key + (position,))
        if got is None:
            freqs = self._freqs.get(key)
            if freqs is None:
                freqs = self._freqs[key] = rope_frequencies(cfg.rotary_dim, cfg.rope_theta, cfg.rope_scaling)
            inv_freq, att = freqs
            ang = torch.tensor([[float(position)]]) * inv_freq[None, :]   # rope_angles' formula, the same rounding
            got = (ang.cos() * att, ang.sin() * att) if att != 1.0 else (ang.cos(), ang.sin())
            self._pairs[key + (position,)] = got
        return got

    def __call__(self, cfg, position: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        key = (cfg.rotary_dim, cfg.rope_theta, repr(cfg.rope_scaling), cfg.head_dim, position)
        got = self._memo.get(key)
        if got is None:
            cos, sin = self.pair(cfg, position)
            rest = cfg.head_dim - cfg.rotary_dim
            cos_K = torch.cat([cos[0], cos[0], cos.new_ones(rest)])
            sin_K = torch.cat([sin[0], sin[0], sin.new_zeros(rest)])
            got = self._memo[key] = (cos, sin, cos_K, sin_K)
        return got


_P, _L, _F = ctypes.c_void_p, ctypes.c_long, ctypes.c_float
_SIGNATURES = {"rms_norm_f32": ([_P, _P, _P, _L, _F], None),
               "attend_one_f32": ([_P] * 10 + [_L] * 9 + [_F], None),
               "attend_one_threads_f32": ([_P] * 10 + [_L] * 9 + [_F, ctypes.c_int], None),
               "attend_part_f32": ([_P] * 6 + [_L] * 11 + [_F], None),
               "attend_finish_f32": ([_P, _L, _L, _P, _P, _L, _L, _L, _L, _P, _P, _P, _P, _L, _L], None),
               "qk_prepare_f32": ([_P, _L, _L, _L, _P, _P, _F, _L, _P, _P], None),
               "silu_mul_f32": ([_P, _P, _L], None),
               "attend_work_floats": ([_L, _L], _L),
               "layer_run_floats": ([_P, _L, _L, ctypes.c_int], _L),
               "layer_run_f32": ([_P, _P, _L, _P, _L, _P, _F, _P, _P, _P, ctypes.c_int], None)}


def _kernels() -> ctypes.CDLL | None:
    """``kernels/decode_step.c`` (a layer's RMSNorm, the q/k norms and rotation, the one-query read and swiglu, one
    call each), or None where the C library cannot be built or ``STORELAB_COMPILED=0`` (then torch's ops run: the
    same formulas)."""
    return compiled_library("decode_step", _SIGNATURES)


def _norm(module: nn.Module, *, vector: bool = False):
    """An RMSNorm in one call: of a vector [D] (``vector``: a layer's norms) by the C kernel, else as torch's one fused
    op (the same formula, fp32); any other norm module as it is."""
    if type(module) is not RMSNorm or module.weight.dtype != torch.float32:
        return module
    shape, w, eps = (module.weight.shape[0],), module.weight, module.eps
    lib = _kernels() if vector else None
    if lib is None or not w.is_contiguous():
        return lambda x: F.rms_norm(x, shape, w, eps)
    fn, D, wp = lib.rms_norm_f32, shape[0], w.data_ptr()

    def run(x: Tensor, w=w) -> Tensor:   # (w: keeps the weight behind the pointer alive)
        x = x.contiguous()
        y = torch.empty(D)
        fn(x.data_ptr(), wp, y.data_ptr(), D, eps)
        return y
    return run


class _AttendOne:
    """The query's heads over a cache's rows (strided, read in place) and an optional new entry, with sinks: one
    call of ``attend_one_threads_f32`` (the rows split between torch's threads where there are enough of them), or
    None from ``make`` where the C library is not there."""

    @classmethod
    def make(cls, H: int, G: int, K: int, V: int, scale: float, sinks: Tensor | None):
        lib = _kernels()
        if lib is None or (sinks is not None and sinks.dtype != torch.float32):
            return None
        return cls(lib.attend_one_threads_f32, H, G, K, V, scale, sinks, work=lib.attend_work_floats(H, V))

    def __init__(self, fn, H, G, K, V, scale, sinks, *, work: int):
        self.fn, self.H, self.G, self.K, self.V, self.scale = fn, H, G, K, V, float(scale)
        self.sinks = None if sinks is None else sinks.detach().contiguous()
        self.work_floats = work
        self.work = torch.empty(work)   # the kernel's scratch, one per thread, made again when torch's threads grow

    def takes(self, *rows: Tensor) -> bool:
        """Whether the kernel reads these cache views ([1, L, G, K] fp32 on the CPU, channels contiguous)."""
        return all(t.dtype == torch.float32 and t.device.type == "cpu" and t.shape[0] == 1 and t.stride(-1) == 1
                   for t in rows)

    def __call__(self, q: Tensor, k_rows: Tensor, v_rows: Tensor, k_new: Tensor | None = None,
                 v_new: Tensor | None = None) -> Tensor:
        """Over the rows of the views ``k_rows`` / ``v_rows`` and the new entry, if any."""
        kn, vn = (None, None) if k_new is None else (k_new.contiguous().data_ptr(), v_new.contiguous().data_ptr())
        return self._run(q, k_rows.data_ptr(), v_rows.data_ptr(), k_rows.shape[1], k_rows.stride(1), k_rows.stride(2),
                         v_rows.stride(1), v_rows.stride(2), kn, vn, None, None)

    def into_row(self, q: Tensor, k_new: Tensor, v_new: Tensor, buf: Tensor, n: int, k_off: int, v_off: int) -> Tensor:
        """Over rows 0..n-1 of a cache's row buffer [1, cap, G, W] (keys from channel ``k_off``, values from
        ``v_off``) and the new entry, which is then written into row n (``KVCache.claim_one``)."""
        base, e = buf.data_ptr(), buf.element_size()
        row, head = buf.stride(1), buf.stride(2)
        k0, v0 = base + k_off * e, base + v_off * e
        return self._run(q, k0, v0, n, row, head, row, head, k_new.contiguous().data_ptr(),
                         v_new.contiguous().data_ptr(), k0 + n * row * e, v0 + n * row * e)

    def _run(self, q, kp, vp, L, k_row, k_head, v_row, v_head, kn, vn, k_dst, v_dst) -> Tensor:
        H, G, K, V = self.H, self.G, self.K, self.V
        q = q.contiguous()
        out = torch.empty(H * V)
        threads = torch.get_num_threads()
        if self.work.numel() < threads * self.work_floats:
            self.work = torch.empty(threads * self.work_floats)
        qp, sp, wp = q.data_ptr(), None if self.sinks is None else self.sinks.data_ptr(), self.work.data_ptr()
        self.fn(qp, kp, vp, kn, vn, k_dst, v_dst, sp, wp, out.data_ptr(), H, G, K, V, L, k_row, k_head, v_row, v_head,
                self.scale, threads)
        return out


def _plain_attention(cfg) -> bool:
    """Whether the fast attention step computes this config's layer (the devices it leaves to the general path
    are rare in the families we read: an output gate, LogN, Llama 4's temperature and L2 norm, a soft cap, Gemma 4's
    values read from the keys and value norm)."""
    return not (cfg.gate or cfg.head_gate or cfg.logn or cfg.attn_temperature_tuning or cfg.qk_l2_norm
                or cfg.softcap is not None or (cfg.qk_norm and cfg.qk_norm_scope != "head")
                or cfg.values_from_keys or cfg.v_norm)


class _AttentionStep:
    """q, k, v in one buffer; rotary angles shared; the cache written in place and read by the store's kernel."""

    def __init__(self, store: Attention, split: RowSplit, angles: _Angles):
        c = store.cfg
        self.store, self.cfg, self.angles = store, c, angles
        self.qkv = _Products([store.q_proj, store.k_proj, store.v_proj], split)
        self.o = _Products([store.o_proj], split)
        H, G, K, V = c.n_heads, c.n_kv_heads, c.head_dim, c.v_head_dim
        self.H, self.G, self.K, self.V = H, G, K, V
        self.q_norm = None if store.q_norm is None else _norm(store.q_norm)
        self.k_norm = None if store.k_norm is None else _norm(store.k_norm)
        self.half, self.R = c.rotary_dim // 2, c.rotary_dim
        # the one-query read in C where the store reads through the fused kernel (a "reference" store keeps its own)
        self.attend_one = _AttendOne.make(H, G, K, V, c.scale, store.sinks) if c.kernel == "fused" else None
        self.prepare = self._prepare_kernel(store)

    def _prepare_kernel(self, store: Attention):
        """``qk_prepare_f32`` bound to this layer's q/k norm weights, or None where torch's ops run instead (no C
        library; interleaved rotary pairs; norms that are not an fp32 RMSNorm over each head, or of two epsilons)."""
        c, lib = self.cfg, _kernels()
        norms = [m for m in (store.q_norm, store.k_norm) if m is not None]
        if lib is None or c.rope_interleaved or (self.R and c.rotary_dim % 2) or len(norms) == 1 or any(
                type(m) is not RMSNorm or m.weight.dtype != torch.float32 or m.weight.shape != (self.K,)
                for m in norms) or len({m.eps for m in norms}) > 1:
            return None
        ws = [m.weight.detach().contiguous() for m in norms]
        ptrs = [w.data_ptr() for w in ws] or [None, None]
        eps = norms[0].eps if norms else 0.0
        fn, H, G, K, R = lib.qk_prepare_f32, self.H, self.G, self.K, self.R

        def run(qkv: Tensor, cos: Tensor, sin: Tensor, ws=ws) -> None:   # (ws: the weights behind the pointers)
            fn(qkv.data_ptr(), H, G, K, ptrs[0], ptrs[1], eps, R, cos.data_ptr() if R else None,
               sin.data_ptr() if R else None)
        return run

    def project(self, u_D: Tensor, seen: int) -> tuple[Tensor, Tensor, Tensor]:
        c, H, G, K, V = self.cfg, self.H, self.G, self.K, self.V
        qkv = self.qkv(u_D)
        if self.prepare is not None:   # norms and rotation in place in the products' buffer, one call
            cos = sin = None
            if self.R:
                cos, sin = self.angles.pair(c, seen)
            self.prepare(qkv, cos, sin)
            v = qkv[(H + G) * K:].view(1, 1, G, V)
            return (qkv[:H * K].view(1, 1, H, K), qkv[H * K:(H + G) * K].view(1, 1, G, K),
                    v if c.value_scale == 1.0 else v * c.value_scale)
        qk = qkv[:(H + G) * K].view(H + G, K)  # q's heads then k's: normed apart, rotated together
        v = qkv[(H + G) * K:].view(1, 1, G, V)
        if c.value_scale != 1.0:
            v = v * c.value_scale
        if self.q_norm is not None:
            qk = torch.cat([self.q_norm(qk[:H]), self.k_norm(qk[H:])])
        if self.R:
            cos, sin, cos_K, sin_K = self.angles(c, seen)
            if c.rope_interleaved:
                qk = rotate(qk.view(1, 1, H + G, K), cos, sin, interleaved=True).view(H + G, K)
            else:
                h, R = self.half, self.R
                turned = torch.cat([-qk[:, h:R], qk[:, :h], qk[:, R:]], dim=1)
                qk = qk * cos_K + turned * sin_K
        return qk[:H].view(1, 1, H, K), qk[H:].view(1, 1, G, K), v

    def __call__(self, u_D: Tensor, state: KVCache | None, ids_BT: Tensor) -> tuple[Tensor, KVCache]:
        state = KVCache() if state is None else state
        q, k, v = self.project(u_D, state.seen)
        fast = self.attend_one is not None and self.attend_one.takes(k, v)
        slot = state.claim_one(self.G, self.K, self.V, k.dtype) if fast else None
        if slot is not None:   # read rows 0..n-1 and the new entry, then write it into row n
            o = self.attend_one.into_row(q, k, v, *slot)
            state.seen += 1
            return self.o(o), state
        state.append(k, v)
        if self.attend_one is not None and self.attend_one.takes(state.k, state.v):
            o = self.attend_one(q, state.k, state.v)
            state.seen += 1
            return self.o(o), state
        k_all, v_all = state.same_width()
        o = self.store.kernel.causal(q, k_all, v_all, scale=self.cfg.scale, sinks_H=self.store.sinks,
                                     v_dim=self.cfg.v_head_dim)
        state.seen += 1
        return self.o(o.reshape(-1)), state


class _WindowStep(_AttentionStep):
    """The window's ring buffer read in place (its order does not matter to a softmax), merged with the new entry."""

    def __call__(self, u_D: Tensor, state: WindowCache | None, ids_BT: Tensor) -> tuple[Tensor, WindowCache]:
        W = self.cfg.window
        state = WindowCache(window=W) if state is None else state
        if state.window != W:
            raise ValueError(f"state: a WindowCache of window {state.window} given to a store of window {W}")
        q, k, v = self.project(u_D, state.seen)
        if self.attend_one is not None and self.attend_one.takes(k, v) and \
                (state.k is None or self.attend_one.takes(state.k, state.v)):
            n = state.filled
            rows_k, rows_v = (k[:, :0], v[:, :0]) if n == 0 else (state.k[:, :n], state.v[:, :n])
            o = self.attend_one(q, rows_k, rows_v, k, v)
            state.write(k, v)
            state.seen += 1
            return self.o(o), state
        scale = self.cfg.scale
        parts = [attend_lse(q, k, v, scale=scale)]
        if state.filled:
            n = state.filled
            parts.append(attend_lse(q, state.k[:, :n], state.v[:, :n], scale=scale))
        o = merge_parts(iter(parts), sinks_H=self.store.sinks) if len(parts) > 1 or self.store.sinks is not None \
            else parts[0][0]
        state.write(k, v)
        state.seen += 1
        return self.o(o.to(q.dtype).reshape(-1)), state


class _FFNStep:
    """Gate and up into one buffer, the declared activation on its halves, then down."""

    def __init__(self, store: FFN, split: RowSplit):
        self.store, self.cfg = store, store.cfg
        ins = [store.gate_proj, store.up_proj] if store.cfg.gated else [store.up_proj]
        self.inner = _Products(ins, split)
        self.down = _Products([store.down_proj], split)
        lib = _kernels()
        plain = store.cfg.activation == "swiglu" and store.cfg.swiglu_limit is None
        self.silu_mul = lib.silu_mul_f32 if lib is not None and plain else None   # swiglu in one call
        self.F = self.inner.widths[0]

    def __call__(self, u_D: Tensor, state: EmptyState | None, ids_BT: Tensor) -> tuple[Tensor, EmptyState]:
        h = self.inner(u_D)
        if self.silu_mul is not None:
            a = torch.empty(self.F)
            self.silu_mul(h.data_ptr(), a.data_ptr(), self.F)
            return self.down(a), EmptyState(seen=(0 if state is None else state.seen) + 1)
        if self.cfg.gated:
            gate, up = h.split(self.inner.widths)
            a = self.store.act.fn(gate, up, self.cfg)
        else:
            a = self.store.act.fn(h, self.cfg)
        return self.down(a.contiguous()), EmptyState(seen=(0 if state is None else state.seen) + 1)


class _Generic:
    """A store as the general path calls it (``forward(x, state, token_ids=...)``): a recurrent store, MoE, ..."""

    def __init__(self, store: nn.Module):
        self.store = store

    def __call__(self, u_D: Tensor, state, ids_BT: Tensor):
        y, state = self.store(u_D.view(1, 1, -1), state, token_ids=ids_BT)
        return y.reshape(-1), state


# store module class -> its fast step (exact classes: a subclass may compute something else)
_TOKEN_STEPS = {Attention: _AttentionStep, WindowAttention: _WindowStep}


@dataclass
class _FastLayer:
    """A pre-norm or sandwich layer on the plain residual, h <- h + post(f(norm(h))) for each slot."""

    token: Any          # step(u_D, state, ids_BT) -> (y_D, state)
    channel: Any        # the same, or None: no channel sublayer
    norm_token: Any
    norm_channel: Any
    post_token: Any     # sandwich norms, or None
    post_channel: Any

    @classmethod
    def of(cls, b: nn.Module, token, channel) -> "_FastLayer":
        sandwich = b.norms == "sandwich"
        post_c = getattr(b, "post_norm_channel", None) if sandwich else None
        return cls(token, channel, _norm(b.norm_token, vector=True),
                   None if b.norm_channel is None else _norm(b.norm_channel, vector=True),
                   _norm(b.post_norm_token, vector=True) if sandwich else None,
                   None if post_c is None else _norm(post_c, vector=True))

    def __call__(self, h_D: Tensor, st: LayerState, ids_BT: Tensor) -> Tensor:
        st.seen += 1
        if st.token is not None:
            st.token.before_call(1)
        y, st.token = self.token(self.norm_token(h_D), st.token, ids_BT)
        if self.post_token is not None:
            y = self.post_token(y)
        h_D = h_D + y
        if self.channel is None:
            return h_D
        y, st.channel = self.channel(self.norm_channel(h_D), st.channel, ids_BT)
        if self.post_channel is not None:
            y = self.post_channel(y)
        return h_D + y


class Decoder:
    """``step(ids_B1, cache) -> logits [B, N]``: ``model(ids, cache)``'s last logits, by the per-layer steps
    chosen here (module docstring). ``threads``: the threads between which the C kernels split their work: a run
    of layers in one call (``layer_run_f32``), and outside runs the products of bf16 / int8 weights (default:
    torch's thread count; fp32's ``torch.mv`` outside runs uses torch's threads). The kernels run
    on torch's own OpenMP threads (``storelab.ops.compiled.OPENMP``): a Python pool's, tried first, waited for the
    cores torch's threads spin on (int8 at 2 threads 21.9 tokens/s against 26.4 at one, 2026-12-06); on torch's
    threads the split is faster (SmolLM2-135M, 2 threads, a step at 1,024 tokens, in one process, 2026-12-07:
    bf16 26.5 against 36.9 ms on one thread, int8 23.5 against 33.8; docs/bench.md)."""

    @staticmethod
    def runs(model: Model) -> bool:
        """Whether this step runs ``model``: every weight in CPU memory (not a GPU's, not a streamed model's
        ``meta`` placeholders, whose weights are read per call)."""
        return all(p.device.type == "cpu" for p in model.parameters())

    def __init__(self, model: Model, *, threads: int | None = None):
        self.model = model
        self.split = RowSplit(threads or torch.get_num_threads())
        self.angles = _Angles()
        cfg = model.cfg
        residual = isinstance(model.depth_head, ResidualHead) and all(
            type(b.depth_token) is ResidualMixer and type(b.depth_channel) is ResidualMixer
            for b in model.blocks)
        self.fp32 = model.embed.weight.dtype == torch.float32
        self.residual = residual and self.fp32
        self.layers = [self._layer(i) if self.residual else None for i in range(cfg.n_layers)]
        self.head = _Products([model.lm_head], self.split) if self.fp32 else None
        self.final_norm = _norm(model.norm, vector=True)
        lib = _kernels() if self.residual else None
        self.runs = None if lib is None else Runs(model, lib, self.split.threads, [self._run_candidate(lay)
                                                                                   for lay in self.layers])
        if self.runs is not None and not self.runs.count():
            self.runs = None

    def _layer(self, i: int) -> _FastLayer | None:
        """Layer i's fast step, or None where the general path runs it."""
        m, lay, b = self.model, self.model.cfg.layers[i], self.model.blocks[i]
        if b.lookup is not None or b.norms not in ("pre", "sandwich") or m._handed[i] or m._views[i] \
                or b.channel_reads_stream or b.beside is not None:
            return None
        step = _TOKEN_STEPS.get(type(b.token))
        if step is not None and _plain_attention(lay.token) and m.cfg.owns_cache(i):
            token = step(b.token, self.split, self.angles)
        else:
            token = _Generic(b.token)
        channel = None
        if b.channel is not None:
            channel = _FFNStep(b.channel, self.split) if type(b.channel) is FFN else _Generic(b.channel)
        return _FastLayer.of(b, token, channel)

    @staticmethod
    def _run_candidate(layer: "_FastLayer | None") -> tuple | None:
        """(attention step, FFN step or None, window or None) where a run may take this layer
        (``storelab.models.decode_run``): its token step is the C kernels' attention step, its channel an FFN's."""
        if layer is None or not isinstance(layer.token, _AttentionStep) or layer.token.attend_one is None \
                or layer.token.prepare is None or type(layer.channel) not in (_FFNStep, type(None)):
            return None
        return layer.token, layer.channel, layer.token.cfg.window if isinstance(layer.token, _WindowStep) else None

    def fast_layers(self) -> int:
        """How many layers take the fast step (the rest run the general path)."""
        return sum(lay is not None for lay in self.layers)

    def c_layers(self) -> int:
        """How many of them run in C, a run of layers per call (``layer_run_f32``)."""
        return 0 if self.runs is None else self.runs.count()

    @torch.no_grad()
    def step(self, ids_B1: Tensor, cache: list[LayerState]) -> Tensor:
        m = self.model
        if ids_B1.shape != (1, 1) or not self.residual:
            return m(ids_B1, cache)[0][:, -1]
        self.angles.reset()
        e = m.embed(ids_B1)
        if m.cfg.embed_scale != 1.0:
            e = e * torch.tensor(m.cfg.embed_scale, dtype=e.dtype)
        h = e.reshape(-1)
        runs, start = self.runs, None
        for i, (layer, block) in enumerate(zip(self.layers, m.blocks)):
            if runs is not None and runs.c[i] is not None and runs.c[i].prepare(cache[i], runs.steps[i]):
                if start is None:
                    start, h = i, h.clone()   # (the run writes h in place: a tensor of its own)
                continue
            if start is not None:
                runs.run(start, i, h, cache, with_head=False)
                start = None
            if layer is not None:
                h = layer(h, cache[i], ids_B1)
                continue
            st = cache[i].token
            if st is not None:
                st.before_call(1)
            shared = cache[m.cfg.layers[i].cache_owner].token if m._handed[i] else None
            ds, cache[i] = block(ResidualState(h=h.view(1, 1, -1)), cache[i], ids_B1, shared, 0)
            h = ds.h.reshape(-1)
        if start is not None:
            logits = runs.run(start, len(self.layers), h, cache, with_head=runs.head is not None)
            if logits is not None:
                return m._logits(logits.view(1, -1))
        z = self.head(self.final_norm(h))
        return m._logits(z.view(1, -1).clone())

