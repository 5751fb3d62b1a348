"""Softmax attention over the full history (``attention``) and over a sliding window (``window``).

Full attention (Vaswani et al., arXiv 1706.03762) with the devices today's layers add:

* grouped-query heads (Ainslie et al., arXiv 2305.13245): ``n_heads`` query heads share
  ``n_kv_heads`` key/value heads; query head h reads key head h // (n_heads / n_kv_heads);
* rotary positions (Su et al., arXiv 2104.09864) on the first ``partial_rotary * head_dim``
  channels of each query/key head (Qwen3-Next 0.25, MiMo 0.334; 0 = no positions at all,
  as in Kimi K3's attention);
* ``qk_norm``: an RMSNorm (arXiv 1910.07467) over each query and key head before RoPE
  (``qk_norm_scope = "all"``: over all heads' channels at once, as OLMo 2 and MiniMax-M2 do;
  ``"head_after_rope"``: each head's norm applied after the rotation, as HunYuan does: its weight per
  channel does not commute with the rotation of channel pairs);
* ``gate``: the per-channel sigmoid output gate of Qwen3-Next (Qiu et al., arXiv 2505.06708):
  ``q_proj`` emits, per head, ``head_dim`` query channels followed by ``v_head_dim`` gate
  channels (the layout of transformers' ``Qwen3NextAttention``), and each head's output is
  multiplied by ``sigmoid(gate)`` before ``o_proj``;
* ``head_gate``: one sigmoid gate per head from its own projection ``g_proj`` (D -> H, no bias), each
  head's whole output multiplied by it before ``o_proj`` (LFM3's ``use_attention_gate``);
* ``gate_activation``: what turns either gate's logit into its factor, "sigmoid" (above) or "softplus"
  (log(1 + e^g), computed in fp32: Poolside's Laguna, whose gate can amplify a head as well as close it);
* ``sink``: one learned logit per head in the softmax's denominator (StreamingLLM,
  arXiv 2309.17453; learned as in gpt-oss and MiMo's window layers);
* ``logn``: Qwen's LogN scaling (arXiv 2309.16609): the logits of a query at position p are
  multiplied by ``max(1, log(p + 1) / log(logn_base))`` -- 1 up to ``logn_base`` tokens, then
  growing as the log of the context, which keeps the softmax sharp as competitors accumulate;
* ``value_scale``: a constant on the values (MiMo's ``attention_value_scale``);
* ``softcap``: each scaled score s read as c tanh(s / c) (Gemma 2's ``attn_logit_softcapping``, arXiv
  2408.00118); such a store reads through the reference kernel (``storelab.ops.attention.softcapped``);
* Llama 4's devices (Meta, 2025; transformers' ``Llama4TextAttention``), all off by default:
  ``rope_interleaved`` pairs channel 2i with 2i+1 (Llama 4's rotation of complex pairs) instead of
  i with i + R/2; ``qk_l2_norm`` divides each query and key head by its root mean square after RoPE
  (``Llama4TextL2Norm``: no weight, eps ``norm_eps``; Llama 4 sets it on its RoPE layers only);
  ``attn_temperature_tuning`` multiplies the query at position p by
  ``log1p(floor((p + 1) / floor_scale)) * attn_temperature_scale + 1`` (Llama 4's NoPE layers,
  after Scalable-Softmax, arXiv 2501.19399; its ``attn_scale`` is ``attn_temperature_scale`` here, since
  ``attn_scale`` names the logits' scale): 1 below ``floor_scale`` tokens, then growing as the log;
* Gemma 4's devices (Google, 2026; transformers' ``Gemma4TextAttention``), off by default: ``values_from_keys``
  (its ``attention_k_eq_v`` global layers) has no value projection: each head's value is its key projection
  as computed, before the key's norm and rotation (so V = K channels, and D*G*V fewer parameters);
  ``v_norm`` divides each value head by its root mean square (no weight, eps ``norm_eps``), on every layer;
* ``kernel``: "fused" (torch's fused kernels, ``storelab.ops.attention``) or "reference" (the
  plain form, every score materialised), taken once at construction.

Update rule (full):  cache <- cache ++ [(k_t, v_t)];  y_t = softmax(q_t K^T * scale) V.
Update rule (window): cache <- last W of (cache ++ [(k_t, v_t)]).
Positions come from ``state.seen`` (the tokens seen before this call).

Window semantics (MiMo, arXiv 2610.11959; sliding windows after Longformer, arXiv 2004.05150):
``window = W`` is the number of *earlier* tokens a query sees. The query at position p reads
positions p-W .. p, i.e. W + 1 entries counting itself. This is transformers'
``MiMoV2FlashAttention`` with ``sliding_window = W + 1`` (its mask is ``kv > q - 129`` for MiMo's
published 128, "128 previous tokens plus the query"). Between calls the store keeps exactly the
last W entries (what transformers' sliding cache keeps, ``sliding_window - 1``), which is all the
next query needs, so chunked prefill equals one full pass. The essay's count "keeps 128, reads
128" counts those kept entries.

Parameters (G = n_kv_heads, K = head_dim, V = v_head_dim, D = d_model):
  D*H*(K + V*gate) + D*G*K + D*G*V + H*V*D   (projections)
  + D*H if head_gate  + 2K if qk_norm  + H if sink  + biases (H*(K+V*gate) + G*(K+V) with qkv_bias, D with out_bias).
State per token (full): G*(K + V) numbers; the window keeps at most W tokens of that.

Shape legend: B batch, T new tokens, L entries read, H query heads, G key/value heads,
K key width, V value width, D model width.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from storelab.ops.attention import KERNELS, softcapped, window_mask
from storelab.ops.norm import RMSNorm, rms_norm
from storelab.ops.rope import apply_rope, check_scaling
from storelab.state import KVCache, WindowCache
from storelab.stores.base import TOKEN, DTYPE_BYTES, Card, Footprint, ParamCount, StoreConfig, check_input, register

__all__ = ["AttentionConfig", "WindowConfig", "Attention", "WindowAttention", "logn_factor", "temperature_factor"]

QK_NORM_SCOPES = ("head", "all", "head_after_rope")  # AttentionConfig.qk_norm_scope
# AttentionConfig.gate_activation: the gate's logit -> its factor on the head's output
GATE_ACTIVATIONS = {"sigmoid": torch.sigmoid,
                    "softplus": lambda g: torch.nn.functional.softplus(g.float()).to(g.dtype)}


def logn_factor(positions_T: Tensor, base: int) -> Tensor:
    """Qwen's LogN factor (arXiv 2309.16609) per query position: max(1, log(p + 1) / log(base))."""
    n = positions_T.to(torch.float64) + 1.0
    return torch.clamp(torch.log(n) / math.log(base), min=1.0).to(torch.float32)


def temperature_factor(positions_T: Tensor, floor_scale: int, scale: float, offset: int = 1) -> Tensor:
    """Llama 4's attention temperature per query position: log1p(floor((p + offset) / floor_scale)) * scale + 1
    (Llama 4 counts p + 1, Ministral 3 p itself: ``floor_offset``)."""
    n = torch.floor((positions_T.to(torch.float64) + offset) / floor_scale)
    return (torch.log1p(n) * scale + 1.0).to(torch.float32)


@register("attention")
@dataclass(kw_only=True)
class AttentionConfig(StoreConfig):
    d_model: int
    n_heads: int
    head_dim: int
    n_kv_heads: int | None = None        # None = n_heads (plain multi-head)
    v_head_dim: int | None = None        # None = head_dim
    partial_rotary: float = 1.0          # fraction of head_dim that RoPE rotates; 0 = no RoPE
    rope_theta: float = 10000.0
    gate: bool = False                   # Qwen3-Next per-channel sigmoid output gate
    head_gate: bool = False              # LFM3: one sigmoid gate per head, from g_proj (D -> H)
    qk_norm: bool = False                # RMSNorm on each query/key head
    rope_scaling: dict | None = None     # a published rope_scaling (linear, llama3, yarn: storelab.ops.rope.SCALINGS)
    qk_norm_scope: str = "head"          # "head": one K-wide norm shared by the heads (Qwen3, Gemma 3); "all": one
                                         # norm over all heads' channels at once, H*K and G*K wide (OLMo 2, MiniMax-M2);
                                         # "head_after_rope": the "head" norm after the rotation (HunYuan)
    sink: bool = False                   # learned attention-sink logit per head
    logn: bool = False                   # Qwen LogN scaling of the logits
    logn_base: int = 4096
    attn_scale: float | None = None      # None = head_dim ** -0.5
    value_scale: float = 1.0             # MiMo's attention_value_scale
    softcap: float | None = None         # Gemma 2: scores capped as c tanh(s / c) (reference kernel)
    qkv_bias: bool = False
    out_bias: bool = False
    norm_eps: float = 1e-6
    kernel: str = "fused"                # "fused" or "reference" (storelab.ops.attention.KERNELS)
    rope_interleaved: bool = False       # pairs (2i, 2i+1), Llama 4's complex rotation; else (i, i + R/2)
    qk_l2_norm: bool = False             # Llama 4: weightless RMS norm of each query/key head after RoPE
    attn_temperature_tuning: bool = False  # Llama 4's NoPE layers: queries scaled by temperature_factor
    floor_scale: int = 8192              # Llama 4's floor_scale (tokens)
    attn_temperature_scale: float = 0.1  # Llama 4's attn_scale (the strength of the tuning)
    floor_offset: int = 1                # the position counted from: p + 1 (Llama 4), p + 0 (Ministral 3)
    values_from_keys: bool = False       # Gemma 4's attention_k_eq_v: no v_proj, v = the raw key projection
    v_norm: bool = False                 # Gemma 4: a weightless RMS norm over each value head
    gate_activation: str = "sigmoid"     # the output gate's function (gate or head_gate): GATE_ACTIVATIONS

    SLOTS, FAMILY, CARD_ORDER, MIX_LABEL = (TOKEN,), "full", 40, "full"
    CARD = Card(
        name="Full cache (softmax attention)",
        written_by="each token of the context, once",
        holds="an entry per token; random keys stay separable at a fixed sharpness up to about "
              "e^{2 beta (1 - beta/d)} entries",
        reading_costs="all L entries",
        forgets="nothing; competitors accumulate",
        source="arXiv 1706.03762 (attention), 2305.13245 (GQA), 2104.09864 (RoPE), 2505.06708 (output gate), "
               "2309.16609 (LogN)",
    )

    def __post_init__(self):
        if self.n_kv_heads is None:
            self.n_kv_heads = self.n_heads
        if self.v_head_dim is None:
            self.v_head_dim = self.head_dim
        self.check_positive("d_model", "n_heads", "n_kv_heads", "head_dim", "v_head_dim", "rope_theta", "norm_eps",
                            "value_scale")
        self.check(self.n_heads % self.n_kv_heads == 0, "n_kv_heads",
                   f"{self.n_kv_heads} key/value heads do not divide {self.n_heads} query heads")
        self.check(0.0 <= self.partial_rotary <= 1.0, "partial_rotary", f"must be in [0, 1], got {self.partial_rotary}")
        self.check(self.rotary_dim % 2 == 0, "partial_rotary",
                   f"rotates int({self.head_dim} * {self.partial_rotary}) = {self.rotary_dim} channels; must be even")
        self.check(self.logn_base > 1, "logn_base", f"must be > 1, got {self.logn_base}")
        self.check(self.attn_scale is None or self.attn_scale > 0, "attn_scale", f"must be > 0, got {self.attn_scale}")
        self.check(self.kernel in KERNELS, "kernel", f"must be one of {tuple(KERNELS)}, got {self.kernel!r}")
        self.check(self.softcap is None or (not isinstance(self.softcap, bool) and self.softcap > 0), "softcap",
                   f"must be None or a number > 0, got {self.softcap!r}")
        check_scaling(self.rope_scaling)
        self.check(not (self.gate and self.head_gate), "head_gate",
                   "cannot be true with gate (one output gate or the other)")
        self.check(self.gate_activation in GATE_ACTIVATIONS, "gate_activation",
                   f"must be one of {tuple(GATE_ACTIVATIONS)}, got {self.gate_activation!r}")
        self.check(self.qk_norm_scope in QK_NORM_SCOPES, "qk_norm_scope",
                   f"must be one of {QK_NORM_SCOPES}, got {self.qk_norm_scope!r}")
        self.check(isinstance(self.floor_scale, int) and self.floor_scale > 0, "floor_scale",
                   f"must be an int > 0, got {self.floor_scale!r}")
        self.check(self.attn_temperature_scale >= 0, "attn_temperature_scale",
                   f"must be >= 0, got {self.attn_temperature_scale}")
        self.check(not self.values_from_keys or (self.v_head_dim == self.head_dim and not self.qkv_bias),
                   "values_from_keys", f"needs v_head_dim == head_dim ({self.head_dim}, got {self.v_head_dim}) "
                   "and no qkv_bias (the values are the key projection itself)")

    @property
    def rotary_dim(self) -> int:
        return int(self.head_dim * self.partial_rotary)

    @property
    def scale(self) -> float:
        return self.attn_scale if self.attn_scale is not None else self.head_dim ** -0.5

    def build(self) -> nn.Module:
        return Attention(self)

    # -- accounting -------------------------------------------------------------
    def _kept_read(self, context: int) -> tuple[int, int]:
        return context, context

    def cache_entry_bytes(self, fmt: str) -> float:
        """G (K + V) plain numbers in ``fmt``."""
        return self.n_kv_heads * (self.head_dim + self.v_head_dim) * DTYPE_BYTES[fmt]

    def footprint(self, context: int, *, dtype: str = "bf16") -> Footprint:
        kept, read = self._kept_read(context)
        per_entry = self.n_kv_heads * (self.head_dim + self.v_head_dim)
        return Footprint(
            context=context, kept=kept, read=read,
            state_bytes=math.ceil(kept * per_entry * DTYPE_BYTES[dtype]),
            read_flops=2 * self.n_heads * read * (self.head_dim + self.v_head_dim),
        )

    def num_params(self) -> ParamCount:
        D, H, G, K, V = self.d_model, self.n_heads, self.n_kv_heads, self.head_dim, self.v_head_dim
        q_out = H * (K + (V if self.gate else 0))
        v_proj = 0 if self.values_from_keys else D * G * V
        n = D * q_out + D * G * K + v_proj + H * V * D
        if self.qkv_bias:
            n += q_out + G * K + G * V
        if self.out_bias:
            n += D
        if self.qk_norm:
            n += (H + G) * K if self.qk_norm_scope == "all" else 2 * K
        if self.sink:
            n += H
        if self.head_gate:
            n += D * H
        return ParamCount(n, n)


@register("window")
@dataclass(kw_only=True)
class WindowConfig(AttentionConfig):
    window: int                          # earlier tokens each query sees (MiMo: 128)

    FAMILY, CARD_ORDER, MIX_LABEL = "window", 60, ""
    CARD = Card(
        name="Window (sliding-window attention)",
        written_by="each token of the context",
        holds="the last W entries (128 in MiMo)",
        reading_costs="a fixed number of entries (W, plus the query itself)",
        forgets="everything older than the window",
        source="arXiv 2004.05150 (sliding window), 2610.11959 (MiMo), 2309.17453 (sinks)",
    )

    def __post_init__(self):
        super().__post_init__()
        self.check(isinstance(self.window, int) and self.window > 0, "window",
                   f"must be an int > 0, got {self.window!r}")

    def build(self) -> nn.Module:
        return WindowAttention(self)

    def cache_window(self) -> int:
        return self.window

    def _kept_read(self, context: int) -> tuple[int, int]:
        n = min(context, self.window)
        return n, n


class Attention(nn.Module):
    """Causal GQA softmax attention with a full KV cache (see the module docstring); ``kernel`` is
    the config's form of the softmax read (``storelab.ops.attention.KERNELS``), taken once here."""

    def __init__(self, cfg: AttentionConfig):
        super().__init__()
        self.cfg = cfg
        D, H, G, K, V = cfg.d_model, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.v_head_dim
        self.q_proj = nn.Linear(D, H * (K + (V if cfg.gate else 0)), bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(D, G * K, bias=cfg.qkv_bias)
        self.v_proj = None if cfg.values_from_keys else nn.Linear(D, G * V, bias=cfg.qkv_bias)
        self.o_proj = nn.Linear(H * V, D, bias=cfg.out_bias)
        whole = cfg.qk_norm_scope == "all"
        self.q_norm = RMSNorm(H * K if whole else K, cfg.norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(G * K if whole else K, cfg.norm_eps) if cfg.qk_norm else None
        self.sinks = nn.Parameter(torch.zeros(H)) if cfg.sink else None
        self.g_proj = nn.Linear(D, H, bias=False) if cfg.head_gate else None
        self.gate_fn = GATE_ACTIVATIONS[cfg.gate_activation]
        self.kernel = KERNELS[cfg.kernel] if cfg.softcap is None else softcapped(cfg.softcap)

    def project(self, x_BTD: Tensor, positions_T: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """Queries (LogN already applied), keys and values with positions, and the output gate."""
        c = self.cfg
        B, T, _ = x_BTD.shape
        H, G, K, V = c.n_heads, c.n_kv_heads, c.head_dim, c.v_head_dim
        gate_BTHV = None
        if c.gate:
            qg = self.q_proj(x_BTD).view(B, T, H, K + V)
            q_BTHK, gate_BTHV = qg.split([K, V], dim=-1)                            # (one backward, no zero fills)
        else:
            q_BTHK = self.q_proj(x_BTD).view(B, T, H, K)
        if c.head_gate:
            gate_BTHV = self.g_proj(x_BTD).unsqueeze(-1)                             # [B, T, H, 1]
        k_BTGK = self.k_proj(x_BTD).view(B, T, G, K)
        v_BTGV = k_BTGK if self.v_proj is None else self.v_proj(x_BTD).view(B, T, G, V)
        if c.v_norm:
            v_BTGV = rms_norm(v_BTGV, eps=c.norm_eps)
        if c.value_scale != 1.0:
            v_BTGV = v_BTGV * c.value_scale
        if self.q_norm is not None and c.qk_norm_scope == "all":  # over the whole projection
            q_BTHK = self.q_norm(q_BTHK.flatten(2)).view(B, T, H, K)
            k_BTGK = self.k_norm(k_BTGK.flatten(2)).view(B, T, G, K)
        elif self.q_norm is not None and c.qk_norm_scope == "head":
            q_BTHK, k_BTGK = self.q_norm(q_BTHK), self.k_norm(k_BTGK)
        rope = dict(rotary_dim=c.rotary_dim, theta=c.rope_theta, interleaved=c.rope_interleaved, scaling=c.rope_scaling)
        q_BTHK, k_BTGK = apply_rope(q_BTHK, positions_T, **rope), apply_rope(k_BTGK, positions_T, **rope)
        if self.q_norm is not None and c.qk_norm_scope == "head_after_rope":
            q_BTHK, k_BTGK = self.q_norm(q_BTHK), self.k_norm(k_BTGK)
        if c.qk_l2_norm:  # after RoPE, no weight (Llama4TextL2Norm)
            q_BTHK, k_BTGK = rms_norm(q_BTHK, eps=c.norm_eps), rms_norm(k_BTGK, eps=c.norm_eps)
        if c.attn_temperature_tuning:
            t_T = temperature_factor(positions_T, c.floor_scale, c.attn_temperature_scale, c.floor_offset)
            q_BTHK = q_BTHK * t_T.to(q_BTHK.dtype)[None, :, None, None]
        if c.logn:
            # scaling q by the factor scales this query's logits by it
            q_BTHK = q_BTHK * logn_factor(positions_T, c.logn_base).to(q_BTHK.dtype)[None, :, None, None]
        return q_BTHK, k_BTGK, v_BTGV, gate_BTHV

    def finish(self, o_BTHV: Tensor, gate_BTHV: Tensor | None) -> Tensor:
        if gate_BTHV is not None:
            o_BTHV = o_BTHV * self.gate_fn(gate_BTHV)
        return self.o_proj(o_BTHV.flatten(2))

    def positions(self, seen: int, T: int, device) -> Tensor:
        return torch.arange(seen, seen + T, device=device)

    def forward(self, x_BTD: Tensor, state: KVCache | None = None, *, token_ids: Tensor | None = None):
        check_input(x_BTD, self.cfg.d_model)
        state = KVCache() if state is None else state
        T = x_BTD.shape[1]
        q_BTHK, k_BTGK, v_BTGV, gate = self.project(x_BTD, self.positions(state.seen, T, x_BTD.device))
        state.append(k_BTGK, v_BTGV)
        k_BLGW, v_BLGW = state.same_width()  # views of the cache, no copy
        o_BTHV = self.kernel.causal(q_BTHK, k_BLGW, v_BLGW, scale=self.cfg.scale, sinks_H=self.sinks,
                                    v_dim=self.cfg.v_head_dim)
        state.seen += T
        return self.finish(o_BTHV, gate), state


class WindowAttention(Attention):
    """Sliding-window attention: each query reads the W earlier tokens and itself.

    A long chunk is processed ``query_block`` queries at a time (default max(W, 64)), each slice
    reading the window before it, so prefill costs O(T (W + query_block)) instead of O(T^2).
    """

    def __init__(self, cfg: WindowConfig):
        super().__init__(cfg)
        self.query_block = max(cfg.window, 64)

    def forward(self, x_BTD: Tensor, state: WindowCache | None = None, *, token_ids: Tensor | None = None):
        check_input(x_BTD, self.cfg.d_model)
        W = self.cfg.window
        state = WindowCache(window=W) if state is None else state
        if state.window != W:
            raise ValueError(f"state: a WindowCache of window {state.window} given to a store of window {W}")
        ys = [self._slice(x_BTD, state) for x_BTD in x_BTD.split(self.query_block, dim=1)]  # split: one backward
        return torch.cat(ys, dim=1), state

    def _slice(self, x_BTD: Tensor, state: WindowCache) -> Tensor:
        W, T = self.cfg.window, x_BTD.shape[1]
        q_BTHK, k_BTGK, v_BTGV, gate = self.project(x_BTD, self.positions(state.seen, T, x_BTD.device))
        old_k, old_v = state.ordered()
        if old_k is None:
            k_BLGK, v_BLGV = k_BTGK, v_BTGV
        else:  # the old window then the slice; the mask cuts each query's view to W back
            k_BLGK, v_BLGV = torch.cat([old_k, k_BTGK], dim=1), torch.cat([old_v, v_BTGV], dim=1)
        L = k_BLGK.shape[1]
        o_BTHV = self.kernel.masked(q_BTHK, k_BLGK, v_BLGV, scale=self.cfg.scale,
                                    mask_TL=window_mask(T, L, W + 1, x_BTD.device), sinks_H=self.sinks)
        state.write(k_BTGK, v_BTGV)
        state.seen += T
        return self.finish(o_BTHV, gate)
