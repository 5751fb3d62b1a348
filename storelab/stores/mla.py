"""Multi-head latent attention (MLA; DeepSeek-V2, arXiv 2405.04434).

Features
* the cache keeps, per token, only the compressed latent ``c = RMSNorm(W_dkv x)``
  (``kv_lora_rank`` wide) and one decoupled rotary key ``k_r = RoPE(W_kr x)``
  (``qk_rope_head_dim`` wide) shared by all heads;
* keys and values are reconstructed from the latent: ``k_h = [W_uk,h c ; k_r]``,
  ``v_h = W_uv,h c``. Two read forms, chosen once at construction:
  naive (up-project every kept latent, then softmax attention) or absorbed
  (fold W_uk into the query and W_uv after the softmax, so the latent acts as a
  single shared key/value head of width kv_lora_rank + rope; DeepSeek's decode form);
* optional low-rank query (``q_lora_rank``; None = one direct projection);
* ``use_rope=False``: no rotary anywhere, the rope slot stays (Kimi K3's MLA /
  transformers ``KimiLinearAttention``);
* ``output_gate``: the heads' output times sigmoid(W_g x), channel by channel,
  before the output projection (Kimi K3's gated MLA); ``head_gate``: one sigmoid(W_g x) per head instead,
  W_g [H, D] (Ling / Ring hybrids' ``BailingHybridAttention``);
* a layer that reads another layer's cache (``cache_owner``, ``CACHE_SHARING =
  "latent"``) gets a ``LatentView`` of the owner's state from ``new_state(groups,
  owner=...)``: it reads the owner's entries and keeps none of its own.

Update rule: append (c_t, k_r,t) for every token; nothing is ever removed.
Parameters (no biases): q: D*H*(N+R), or D*Q + Q + Q*H*(N+R) with a q latent of
width Q; kv: D*(C+R) + C + C*H*(N+V); out: H*V*D; gate: D*H*V if gated (D*H with head_gate).
State per token: C + R numbers (kv_lora_rank + qk_rope_head_dim), whatever H.

Legend: B batch, T new tokens, L tokens kept, H heads, N qk_nope_head_dim,
R qk_rope_head_dim, V v_head_dim, C kv_lora_rank, Q q_lora_rank, D d_model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from storelab.ops.attention import attend, attend_causal, attend_causal_blocks
from storelab.ops.norm import RMSNorm
from storelab.ops.rope import apply_rope, check_scaling
from storelab.state import State, append_rows, joined_rows
from storelab.stores.base import (TOKEN, DTYPE_BYTES, Card, Footprint, MemoryTerms, ParamCount, StoreConfig, check_input,
                                  register)

GATHER_BUDGET = 1 << 20  # numbers gathered at once by a selective read (4 MiB in fp32)

# submodule names in transformers' DeepseekV3Attention / KimiLinearAttention / GlmMoeDsaAttention -> ours
HF_NAMES = {"q_proj": "q_proj", "q_a_proj": "q_down", "q_a_layernorm": "q_norm", "q_b_proj": "q_up",
            "kv_a_proj_with_mqa": "kv_down", "kv_a_layernorm": "kv_norm", "kv_b_proj": "kv_up", "o_proj": "out"}


LATENT_QUANT_BLOCK = 128  # scale block for latent entries in fp8/fp4 (V4.1-Flash: 4 scale bytes per 448)


def entry_bytes(dtype: str) -> float:
    """Bytes of one stored number in ``dtype`` ("fp32", "bf16", "fp8", "fp4", ...)."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"dtype: unknown {dtype!r} (known: {', '.join(DTYPE_BYTES)})")
    return DTYPE_BYTES[dtype]


def latent_row_bytes(width: int, rope: int, fmt: str) -> float:
    """One row of ``width`` numbers (the last ``rope`` rotary): fp8/fp4 quantised, else plain."""
    from storelab.ops.quant import FORMATS, entry_bytes as quantised_entry_bytes

    if fmt in FORMATS:
        return quantised_entry_bytes(width, rope, fmt, LATENT_QUANT_BLOCK)
    return width * entry_bytes(fmt)


@dataclass
class LatentCache(State):
    """Every token's latent ``latent`` [B, L, C] and rotary key ``k_rope`` [B, L, R]."""

    latent: Tensor | None = None
    k_rope: Tensor | None = None

    @property
    def entries(self) -> int:
        return 0 if self.latent is None else self.latent.shape[1]

    def append(self, latent_BTC: Tensor, k_rope_BTR: Tensor) -> tuple[Tensor, Tensor]:
        """Write this call's entries; return everything kept (old then new), views of one buffer."""
        return append_rows(self, ("latent", "k_rope"), (latent_BTC, k_rope_BTR))

    def joined(self) -> Tensor | None:
        """[latent ; k_rope] per entry, [B, L, C + R]: the absorbed read's key (a view, no copy)."""
        return joined_rows(self, ("latent", "k_rope"))


@dataclass
class LatentView(LatentCache):
    """A reader's view of another layer's latent cache (``cache_owner``; V4.1-Flash's shared caches).

    The owner runs first in each call and writes the call's entries; the view's ``append``
    writes nothing and returns the owner's entries, so the reader reads exactly the owner's
    cache and keeps no bytes of its own. Its position is the owner's before the call
    (``before_call``): the reader's tokens are the owner's last ones (in an encoder-decoder
    the owner also saw the encoder-only tokens).
    """

    owner: LatentCache | None = None

    LINKS = ("owner",)

    @property
    def entries(self) -> int:
        return 0

    def before_call(self, tokens: int) -> None:
        self.seen = self.owner.seen - tokens

    def append(self, latent_BTC: Tensor, k_rope_BTR: Tensor) -> tuple[Tensor, Tensor]:
        return self.owner.latent, self.owner.k_rope

    def joined(self) -> Tensor | None:
        return self.owner.joined()


@dataclass(kw_only=True)
class LatentFields(StoreConfig):
    """The fields of MLA's cache and main attention, shared by mla, dsa and hierarchical."""

    d_model: int
    n_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None = None       # None: direct query projection
    rope_theta: float = 10000.0
    rope_interleaved: bool = True        # DeepSeek pairs channels (2i, 2i+1)
    rope_scaling: dict | None = None     # a published rope_scaling (DeepSeek-V3's yarn: storelab.ops.rope.SCALINGS)
    use_rope: bool = True                # False: Kimi K3 (rope slot kept, never rotated)
    output_gate: bool = False            # sigmoid gate per output channel (Kimi K3)
    head_gate: bool = False              # sigmoid gate per head, W_g [H, D] (Bailing hybrids)
    softmax_scale: float | None = None   # None: (N + R)^-1/2; give YaRN's mscale^2 folded in here
    norm_eps: float = 1e-6
    serving_format: str | None = None    # the entry format its publisher's engine keeps (accounting only)

    def __post_init__(self):
        self.check_positive("d_model", "n_heads", "kv_lora_rank", "qk_nope_head_dim", "v_head_dim")
        self.check(self.serving_format is None or self.serving_format in DTYPE_BYTES, "serving_format",
                   f"must be None or one of {', '.join(DTYPE_BYTES)}, got {self.serving_format!r}")
        self.check(self.qk_rope_head_dim >= 0 and self.qk_rope_head_dim % 2 == 0, "qk_rope_head_dim",
                   f"must be even and >= 0, got {self.qk_rope_head_dim}")
        self.check(self.q_lora_rank is None or self.q_lora_rank > 0, "q_lora_rank",
                   f"must be None or > 0, got {self.q_lora_rank}")
        self.check(self.rope_theta > 0, "rope_theta", f"must be > 0, got {self.rope_theta}")
        self.check(not (self.output_gate and self.head_gate), "head_gate",
                   "cannot be true with output_gate (one output gate or the other)")
        check_scaling(self.rope_scaling)
        self.check(self.softmax_scale is None or self.softmax_scale > 0, "softmax_scale",
                   f"must be None or > 0, got {self.softmax_scale}")

    # -- derived sizes ---------------------------------------------------------
    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def scale(self) -> float:
        return self.softmax_scale if self.softmax_scale is not None else self.qk_head_dim ** -0.5

    def new_state(self, groups: dict, *, owner: LatentCache | None = None) -> LatentCache:
        """The layer's empty state in a new model cache: a cache of its own, or a view of ``owner``'s
        (the state of the layer it reads, ``cache_owner``). ``groups``: the model's scratch for what
        its layers share, filled in layer order (the selection stores keep their groups there)."""
        return LatentCache() if owner is None else LatentView(owner=owner)

    def published_cache_format(self) -> str | None:
        return self.serving_format

    def cache_entry_bytes(self, fmt: str) -> float:
        """The latent and rotary key: fp8/fp4 in the quantised layout of ``storelab.ops.quant.entry_bytes``
        (no-rope channels at 8 or 4 bits, rope channels in bf16, a scale per LATENT_QUANT_BLOCK: DeepSeek's
        mixed entry); any other format a plain row."""
        return latent_row_bytes(self.kv_lora_rank + self.qk_rope_head_dim, self.qk_rope_head_dim, fmt)

    def index_key_bytes(self, fmt: str) -> float:
        """Bytes of the index key this layer keeps per token (0: no indexer)."""
        return 0.0

    def memory_terms(self, *, cache: str = "bf16", state: str = "fp32") -> MemoryTerms:
        """Everything grows with context: one latent entry (and index key) per token."""
        entry = self.cache_entry_bytes(cache)
        return MemoryTerms(per_token=entry + self.index_key_bytes(cache), cache_per_token=entry)

    def cache_bytes(self, L: int, dtype: str) -> int:
        return math.ceil(L * (self.kv_lora_rank + self.qk_rope_head_dim) * entry_bytes(dtype))

    def mla_read_flops(self, n_read: int, context: int, *, absorbed: bool) -> int:
        """Flops the next token spends reading ``n_read`` of ``context`` kept entries."""
        H, N, R, V, C = self.n_heads, self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim, self.kv_lora_rank
        if absorbed:  # logits over C + R, weighted sum over C, per head and entry
            return 2 * H * n_read * (2 * C + R)
        # up-project every kept latent to keys and values, then attend
        return 2 * context * C * H * (N + V) + 2 * H * n_read * (N + R + V)

    def mla_params(self) -> int:
        D, H, N, R, V, C = (self.d_model, self.n_heads, self.qk_nope_head_dim, self.qk_rope_head_dim,
                            self.v_head_dim, self.kv_lora_rank)
        Q = self.q_lora_rank
        q = D * H * (N + R) if Q is None else D * Q + Q + Q * H * (N + R)
        kv = D * (C + R) + C + C * H * (N + V)
        gate = D * H * V if self.output_gate else D * H if self.head_gate else 0
        return q + kv + H * V * D + gate


@register("mla")
@dataclass(kw_only=True)
class MLAConfig(LatentFields):
    absorbed: bool = False               # read form: naive up-projection or absorbed

    SLOTS, FAMILY, CARD_ORDER, CACHE_SHARING = (TOKEN,), "full", 50, "latent"
    READER_UNUSED = ("kv_down", "kv_norm")   # a reader takes the owner's latent
    CARD = Card(
        name="Full cache of latents (MLA)",
        written_by="each token of the context, once",
        holds="an entry per token, compressed to one latent plus a shared rotary key; random keys stay "
              "separable at a fixed sharpness up to about e^{2 beta (1 - beta/d)} entries",
        reading_costs="all L entries",
        forgets="nothing; competitors accumulate",
        source="arXiv 2405.04434",
    )

    def build(self) -> nn.Module:
        return MLA(self, absorbed=self.absorbed)

    def footprint(self, context: int, *, dtype: str = "bf16") -> Footprint:
        L = context
        return Footprint(context=L, kept=L, read=L, state_bytes=self.cache_bytes(L, dtype),
                         read_flops=self.mla_read_flops(L, L, absorbed=self.absorbed),
                         note=f"{self.kv_lora_rank}+{self.qk_rope_head_dim} numbers per token")

    def num_params(self) -> ParamCount:
        n = self.mla_params()
        return ParamCount(n, n)


@dataclass
class Projection:
    """One call's projections: queries, the index-query source and the new cache entries."""

    q_nope_BTHN: Tensor
    q_rope_BTHR: Tensor
    q_src_BTQ: Tensor      # the normalised q latent (or x without one): the indexer's query input
    latent_BTC: Tensor
    k_rope_BTR: Tensor


class MLA(nn.Module):
    """The MLA module; ``absorbed`` picks the read form once, here."""

    def __init__(self, cfg: LatentFields, *, absorbed: bool = False):
        super().__init__()
        self.cfg = cfg
        D, H, V, C, R = cfg.d_model, cfg.n_heads, cfg.v_head_dim, cfg.kv_lora_rank, cfg.qk_rope_head_dim
        if cfg.q_lora_rank is None:
            self.q_proj = nn.Linear(D, H * cfg.qk_head_dim, bias=False)
        else:
            self.q_down = nn.Linear(D, cfg.q_lora_rank, bias=False)
            self.q_norm = RMSNorm(cfg.q_lora_rank, cfg.norm_eps)
            self.q_up = nn.Linear(cfg.q_lora_rank, H * cfg.qk_head_dim, bias=False)
        self.kv_down = nn.Linear(D, C + R, bias=False)          # [W_dkv ; W_kr]
        self.kv_norm = RMSNorm(C, cfg.norm_eps)
        self.kv_up = nn.Linear(C, H * (cfg.qk_nope_head_dim + V), bias=False)  # per head [W_uk ; W_uv]
        self.out = nn.Linear(H * V, D, bias=False)
        self.gate = (nn.Linear(D, H * V, bias=False) if cfg.output_gate else
                     nn.Linear(D, H, bias=False) if cfg.head_gate else None)
        self.absorbed = absorbed
        self._read = self._read_absorbed if absorbed else self._read_naive

    # -- pieces shared with the selection stores ---------------------------------
    def rope(self, x_BTHR: Tensor, positions_T: Tensor) -> Tensor:
        c = self.cfg
        if not c.use_rope:
            return x_BTHR
        return apply_rope(x_BTHR, positions_T, rotary_dim=c.qk_rope_head_dim, theta=c.rope_theta,
                          interleaved=c.rope_interleaved, scaling=c.rope_scaling)

    def project(self, x_BTD: Tensor, positions_T: Tensor) -> Projection:
        c = self.cfg
        B, T, _ = x_BTD.shape
        if c.q_lora_rank is None:
            q_src = x_BTD
            q = self.q_proj(x_BTD)
        else:
            q_src = self.q_norm(self.q_down(x_BTD))
            q = self.q_up(q_src)
        q_BTHK = q.view(B, T, c.n_heads, c.qk_head_dim)
        q_nope, q_rope = q_BTHK.split([c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
        latent, k_rope = self.kv_down(x_BTD).split([c.kv_lora_rank, c.qk_rope_head_dim], dim=-1)
        k_rope = self.rope(k_rope[:, :, None, :], positions_T)[:, :, 0]
        return Projection(q_nope, self.rope(q_rope, positions_T), q_src, self.kv_norm(latent), k_rope)

    def up_weights(self) -> tuple[Tensor, Tensor]:
        """W_uk [H, N, C] and W_uv [H, V, C] from the joint up-projection."""
        c = self.cfg
        w = self.kv_up.weight.view(c.n_heads, c.qk_nope_head_dim + c.v_head_dim, c.kv_lora_rank)
        return w[:, : c.qk_nope_head_dim], w[:, c.qk_nope_head_dim:]

    def absorbed_query(self, p: Projection) -> Tensor:
        """[q_nope W_uk ; q_rope]: a query against [latent ; k_rope], [B, T, H, C + R]."""
        w_uk, _ = self.up_weights()
        q_lat_BTHC = torch.einsum("bthn,hnc->bthc", p.q_nope_BTHN, w_uk)
        return torch.cat([q_lat_BTHC, p.q_rope_BTHR], dim=-1)

    def values_from_latent(self, o_BTHC: Tensor) -> Tensor:
        _, w_uv = self.up_weights()
        return torch.einsum("bthc,hvc->bthv", o_BTHC, w_uv)

    def read_dense(self, p: Projection, latent_BLC: Tensor, k_rope_BLR: Tensor, mask_TL: Tensor) -> Tensor:
        return self._read(p, latent_BLC, k_rope_BLR, mask_TL)

    def read_causal(self, p: Projection, latent_BLC: Tensor, k_rope_BLR: Tensor, key_BLX: Tensor | None = None) \
            -> Tensor:
        """Each of the T new queries (the last T of the L entries) reads every entry up to its own,
        with no [T, L] mask. ``key_BLX``: [latent ; k_rope] when the cache holds it joined."""
        c = self.cfg
        L = latent_BLC.shape[1]
        if self.absorbed:
            if key_BLX is None:
                key_BLX = torch.cat([latent_BLC, k_rope_BLR], dim=-1)
            # the key [latent ; k_rope] is also the value: its first C channels are the latent
            o_BTHC = attend_causal(self.absorbed_query(p), key_BLX[:, :, None, :], key_BLX[:, :, None, :],
                                   scale=c.scale, v_dim=c.kv_lora_rank)
            return self.values_from_latent(o_BTHC)
        q_BTHK = torch.cat([p.q_nope_BTHN, p.q_rope_BTHR], dim=-1)
        if torch.is_grad_enabled() and latent_BLC.requires_grad:
            # training: keys and values expanded at once (the blockwise expansion is inference only);
            # attend_causal differentiates a whole sequence without a [T, L] array
            return attend_causal(q_BTHK, *self._expand(latent_BLC, k_rope_BLR), scale=c.scale)
        return attend_causal_blocks(q_BTHK, lambda s, e: self._expand(latent_BLC[:, s:e], k_rope_BLR[:, s:e]), L,
                                    G=c.n_heads, V=c.v_head_dim, scale=c.scale)

    def _expand(self, latent_BLC: Tensor, k_rope_BLR: Tensor) -> tuple[Tensor, Tensor]:
        """Per-head keys and values of the given entries (the naive form's up-projection)."""
        c = self.cfg
        B, L, _ = latent_BLC.shape
        kv_BLHX = self.kv_up(latent_BLC).view(B, L, c.n_heads, c.qk_nope_head_dim + c.v_head_dim)
        k_nope_BLHN, v_BLHV = kv_BLHX.split([c.qk_nope_head_dim, c.v_head_dim], dim=-1)
        k_BLHK = torch.cat([k_nope_BLHN, k_rope_BLR[:, :, None, :].expand(-1, -1, c.n_heads, -1)], dim=-1)
        return k_BLHK, v_BLHV

    def _read_naive(self, p: Projection, latent_BLC: Tensor, k_rope_BLR: Tensor, mask_TL: Tensor) -> Tensor:
        k_BLHK, v_BLHV = self._expand(latent_BLC, k_rope_BLR)
        q_BTHK = torch.cat([p.q_nope_BTHN, p.q_rope_BTHR], dim=-1)
        return attend(q_BTHK, k_BLHK, v_BLHV, scale=self.cfg.scale, mask_TL=mask_TL)

    def _read_absorbed(self, p: Projection, latent_BLC: Tensor, k_rope_BLR: Tensor, mask_TL: Tensor) -> Tensor:
        # one shared key/value head: key [latent ; k_rope], value latent
        k_BL1X = torch.cat([latent_BLC, k_rope_BLR], dim=-1)[:, :, None, :]
        o_BTHC = attend(self.absorbed_query(p), k_BL1X, latent_BLC[:, :, None, :], scale=self.cfg.scale,
                        mask_TL=mask_TL)
        return self.values_from_latent(o_BTHC)

    def read_selected(self, p: Projection, latent_BLC: Tensor, k_rope_BLR: Tensor, pos_BTk: Tensor,
                      valid_BTk: Tensor) -> Tensor:
        """Each query reads only its own k entries (gathered), in the absorbed form.

        Queries are taken in chunks so a long prefill gathers at most about
        ``GATHER_BUDGET`` numbers at a time.
        """
        B, T, k = pos_BTk.shape
        width = latent_BLC.shape[-1] + k_rope_BLR.shape[-1]
        step = max(1, GATHER_BUDGET // max(1, B * k * width))
        q_BTHX = self.absorbed_query(p)
        outs = [self._read_gathered(q, latent_BLC, k_rope_BLR, pos_BTk[:, t:t + step], valid_BTk[:, t:t + step])
                for t, q in zip(range(0, T, step), q_BTHX.split(step, dim=1))]  # split: one backward, not one per slice
        return self.values_from_latent(torch.cat(outs, dim=1))

    def _read_gathered(self, q_BTHX: Tensor, latent_BLC: Tensor, k_rope_BLR: Tensor, pos_BTk: Tensor,
                       valid_BTk: Tensor) -> Tensor:
        B, T, k = pos_BTk.shape
        H, X = q_BTHX.shape[2:]
        C = latent_BLC.shape[-1]
        b_idx = torch.arange(B, device=pos_BTk.device)[:, None, None]
        lat_BTkC = latent_BLC[b_idx, pos_BTk]
        key_BTkX = torch.cat([lat_BTkC, k_rope_BLR[b_idx, pos_BTk]], dim=-1)
        # fold the queries into the batch: every query has its own k entries
        o = attend(q_BTHX.reshape(B * T, 1, H, X), key_BTkX.reshape(B * T, k, 1, X),
                   lat_BTkC.reshape(B * T, k, 1, C), scale=self.cfg.scale,
                   mask_TL=valid_BTk.reshape(B * T, 1, 1, k))
        return o.reshape(B, T, H, C)

    def finish(self, o_BTHV: Tensor, x_BTD: Tensor) -> Tensor:
        if self.gate is not None and self.cfg.head_gate:
            o_BTHV = o_BTHV * torch.sigmoid(self.gate(x_BTD))[..., None]
        o = o_BTHV.flatten(2)
        if self.gate is not None and self.cfg.output_gate:
            o = o * torch.sigmoid(self.gate(x_BTD))
        return self.out(o)

    # -- the store ---------------------------------------------------------------
    def forward(self, x_BTD: Tensor, state: LatentCache | None = None, *, token_ids=None):
        check_input(x_BTD, self.cfg.d_model)
        state = LatentCache() if state is None else state
        T = x_BTD.shape[1]
        positions_T = torch.arange(state.seen, state.seen + T, device=x_BTD.device)
        p = self.project(x_BTD, positions_T)
        latent_BLC, k_rope_BLR = state.append(p.latent_BTC, p.k_rope_BTR)
        state.seen += T
        o_BTHV = self.read_causal(p, latent_BLC, k_rope_BLR, state.joined())
        return self.finish(o_BTHV, x_BTD), state
