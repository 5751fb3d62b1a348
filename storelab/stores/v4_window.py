"""DeepSeek-V4's window-only layer (DeepSeek-V4 report, arXiv 2606.19348), kind ``v4_window``:
the layer's own attention over its sliding window alone, with no compressed entries
(transformers' ``sliding_attention`` layer type, a ``compress_ratios`` entry of 0; V4-Flash's
layers 0 and 1, V4.1-Flash's first two layers).

Update rule. Each token writes one entry ``kv_t = RoPE(RMSNorm(W_kv x_t))``: one KV head of
``head_dim`` channels, the last ``rope_dim`` rotated (interleaved pairs), the same vector is key
and value for every query head; the layer keeps the last ``window`` of them. The query is
low-rank, ``q_t = RoPE(RMSNorm_unweighted(W_qb RMSNorm(W_qa x_t)))`` per head; a query at
position t reads the entries of positions (t - window, t] in one softmax with a learned sink
logit per head (StreamingLLM, arXiv 2309.17453; gpt-oss), scale ``head_dim^-1/2``. Because K = V,
the output's rope channels carry each entry's rotation: they are rotated back by -t, then a
grouped low-rank output projection maps the heads to ``d_model`` (``o_groups`` groups of heads,
each through its own ``[o_lora, H*C/g]`` map, then one ``[D, g*o_lora]``). This is exactly what
CSA and HCA (``storelab.stores.compressed``) do with their window part, without the pooled
entries: the read, the sinks, the rotation back and the output are the same equations.

Parameters (D d_model, H heads, C head_dim, Q q_lora, g o_groups, r o_lora):
``D*Q + Q + Q*H*C`` (low-rank query) ``+ D*C + C`` (own entry) ``+ H*C*r + g*r*D`` (output)
``+ H`` (sinks), all active for every token.

State (``V4WindowCache``): the last ``window`` entries, one row each in the ``cache_format``
(None: as computed; "fp8"/"fp4": DeepSeek's mixed rows, ``storelab.ops.quant.entry_bytes``, 584 B
at V4-Pro's widths in fp8), whatever the context: ``window * entry`` bytes per sequence, nothing
per token. RoPE here is the plain "main" rope at ``rope_theta`` (10000 in the published configs;
transformers gives the YaRN scaling of the released configs to the compressed layers only).

Agreement: the layer and a whole tiny model match transformers' ``DeepseekV4Attention`` of a
``sliding_attention`` layer on the same weights (tests/test_v4_window.py).

Shape legend: B batch, T tokens in this call, N rows kept before the call plus the call's own,
W window, H query heads, C head width, r stored row width, X queries folded into the batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from storelab.ops.attention import attend_lse, merge_parts
from storelab.ops.norm import rms_norm
from storelab.ops.quant import FORMATS, entry_bytes
from storelab.state import State, tensor_bytes
from storelab.stores.base import TOKEN, DTYPE_BYTES, Card, Footprint, ParamCount, StoreConfig, check_input, register
from storelab.stores.v4_parts import add_v4_projections, check_v4_fields, v4_rope

__all__ = ["V4WindowConfig", "V4WindowAttention", "V4WindowCache"]

READ_BUDGET = 1 << 17  # numbers of one gathered window part (queries x (logits + rows)), as in compressed.py


@register("v4_window")
@dataclass(kw_only=True)
class V4WindowConfig(StoreConfig):
    """DeepSeek-V4's attention over its window alone; defaults are V4-Pro's published widths."""

    d_model: int
    n_heads: int = 128
    head_dim: int = 512
    rope_dim: int = 64
    q_lora: int = 1536
    o_groups: int = 16
    o_lora: int = 1024
    window: int = 128
    rope_theta: float = 10000.0
    eps: float = 1e-6
    cache_format: str | None = None
    quant_block: int = 64

    SLOTS, FAMILY, CARD_ORDER, MIX_LABEL = (TOKEN,), "window", 95, "window"
    CARD = Card(
        name="Window of own entries (DeepSeek-V4 window-only layer)",
        written_by="each token: one entry, key and value at once, for all heads",
        holds="the last 128 tokens' entries, uncompressed",
        reading_costs="the 128-token window, whatever the context",
        forgets="everything older than the window",
        source="arXiv 2606.19348",
    )

    def __post_init__(self) -> None:
        self.check_positive("d_model", "n_heads", "head_dim", "q_lora", "o_groups", "o_lora", "window", "quant_block",
                            "rope_theta", "eps")
        check_v4_fields(self)

    def build(self) -> "V4WindowAttention":
        return V4WindowAttention(self)

    def cache_window(self) -> int:
        return self.window

    def cache_entry_bytes(self, fmt: str) -> float:
        """One entry: fp8/fp4 in DeepSeek's mixed layout, else a plain row of ``head_dim`` numbers."""
        if fmt in FORMATS:
            return entry_bytes(self.head_dim, self.rope_dim, fmt, self.quant_block)
        return self.head_dim * DTYPE_BYTES[fmt]

    def num_params(self) -> ParamCount:
        D, H, C, Q = self.d_model, self.n_heads, self.head_dim, self.q_lora
        n = D * Q + Q + Q * H * C + D * C + C + H * C * self.o_lora + self.o_groups * self.o_lora * D + H
        return ParamCount(n, n)

    def footprint(self, context: int, *, dtype: str = "bf16") -> Footprint:
        kept = min(context, self.window)
        row = self.cache_entry_bytes(dtype)
        return Footprint(context=context, kept=kept, read=kept, state_bytes=-int(-(kept * row) // 1),
                         read_flops=4 * self.n_heads * self.head_dim * kept, note=f"window {self.window}")


@dataclass
class V4WindowCache(State):
    """The last ``window`` entries, oldest first, rows in the cache format."""

    window_kv: Tensor | None = None  # [B, min(seen, W), r]

    @property
    def entries(self) -> int:
        return 0 if self.window_kv is None else self.window_kv.shape[1]

    def nbytes(self) -> int:
        return tensor_bytes(self.window_kv)


class V4WindowAttention(nn.Module):
    """See the module docstring. Parameter names are CSA/HCA's (``storelab.stores.compressed``)."""

    def __init__(self, cfg: V4WindowConfig):
        super().__init__()
        self.cfg = cfg
        add_v4_projections(self, cfg)

    def _rope(self, x_BTHC: Tensor, pos_T: Tensor) -> Tensor:
        """Interleaved RoPE on the trailing ``rope_dim`` channels (V4 lays heads out [nope | rope])."""
        return v4_rope(x_BTHC, pos_T, rope_dim=self.cfg.rope_dim, theta=self.cfg.rope_theta)

    def forward(self, x_BTD: Tensor, state: V4WindowCache | None = None, *, token_ids: Tensor | None = None):
        cfg = self.cfg
        check_input(x_BTD, cfg.d_model, "x_BTD")
        state = V4WindowCache() if state is None else state
        B, T, _ = x_BTD.shape
        H, C, W = cfg.n_heads, cfg.head_dim, cfg.window
        seen = state.seen
        pos_T = torch.arange(seen, seen + T, device=x_BTD.device)

        q_res = self.q_a_norm(self.q_a(x_BTD))
        q_BTHC = self._rope(rms_norm(self.q_b(q_res).view(B, T, H, C), None, cfg.eps), pos_T)
        kv_BTC = self._rope(self.kv_norm(self.kv_proj(x_BTD))[:, :, None], pos_T)[:, :, 0]
        rows_BNr = self.fmt.encode(kv_BTC, cfg.rope_dim)
        if state.window_kv is not None:
            rows_BNr = torch.cat([state.window_kv, rows_BNr], dim=1)   # at most W - 1 + T rows

        o_BTHC = self._rope(self._read(q_BTHC, rows_BNr), -pos_T)       # undo the rotation the values carry
        o_BTGI = o_BTHC.reshape(B, T, cfg.o_groups, -1)
        y_BTD = self.o_b(torch.einsum("btgi,goi->btgo", o_BTGI, self.o_a.to(x_BTD.dtype)).flatten(2))
        # a copy: the kept window must not hold the call's rows alive
        state.window_kv, state.seen = rows_BNr[:, -W:].clone(), seen + T
        return y_BTD, state

    def _read(self, q_BTHC: Tensor, rows_BNr: Tensor) -> Tensor:
        """Each query over its own window rows (the call's queries are the last T of the N rows),
        gathered a chunk of queries at a time, the H heads on the query axis (one KV head)."""
        cfg = self.cfg
        B, T, H, C = q_BTHC.shape
        W, dev = cfg.window, q_BTHC.device
        step = max(1, READ_BUDGET // (B * (H * W + W * C)))
        outs = []
        for a, q_chunk in zip(range(0, T, step), q_BTHC.split(step, dim=1)):  # split: one backward per chunk
            t = q_chunk.shape[1]
            own_t = torch.arange(a, a + t, device=dev) + rows_BNr.shape[1] - T
            idx_tW = own_t[:, None] + torch.arange(1 - W, 1, device=dev)
            kv_XW1C = self.fmt.decode(rows_BNr[:, idx_tW.clamp_min(0)], C, cfg.rope_dim, q_BTHC.dtype)
            kv_XW1C = kv_XW1C.reshape(B * t, W, 1, C)
            valid_XW = (idx_tW >= 0).expand(B, t, W).reshape(B * t, 1, W)
            o_XH1C, lse_X1H = attend_lse(q_chunk.reshape(B * t, H, 1, C), kv_XW1C, kv_XW1C, scale=C ** -0.5,
                                         mask_TL=valid_XW)
            part = (o_XH1C.reshape(B, t, H, C), lse_X1H.reshape(B, t, H).transpose(1, 2))
            outs.append(merge_parts([part], sinks_H=self.sinks))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=1)
