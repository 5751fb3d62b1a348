"""Softmax attention as a pure function (Vaswani et al., arXiv 1706.03762), with
grouped-query heads (Ainslie et al., arXiv 2305.13245) and learned sinks.

``attend(q_BTHK, k_BLGK, v_BLGV, *, scale, mask_TL=None, sinks_H=None)``

* q has H heads, k and v have G heads; H must be a multiple of G and query head
  h reads key head h // (H / G).
* ``mask_TL`` (bool, True = may read) is shared by batch and heads, or given per
  batch/head as [B, H, T, L]; positions with no readable entry return zeros.
* ``sinks_H`` adds one learned logit per head to the softmax's denominator (an
  entry with no value: the head may attend to "nothing"), as in gpt-oss and MiMo.

``causal_mask(T, L)`` is the usual mask for T new queries after L - T older entries.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["attend", "attend_reference", "causal_mask", "window_mask"]


def causal_mask(T: int, L: int, device=None) -> Tensor:
    """[T, L] bool: query t (at absolute position L - T + t) may read entries 0..L-T+t."""
    q_pos = torch.arange(L - T, L, device=device)[:, None]
    k_pos = torch.arange(L, device=device)[None, :]
    return k_pos <= q_pos


def window_mask(T: int, L: int, window: int, device=None) -> Tensor:
    """[T, L] bool: causal and at most ``window`` entries back, the query's own included."""
    q_pos = torch.arange(L - T, L, device=device)[:, None]
    k_pos = torch.arange(L, device=device)[None, :]
    return (k_pos <= q_pos) & (k_pos > q_pos - window)


def attend_reference(q_BTHK: Tensor, k_BLGK: Tensor, v_BLGV: Tensor, *, scale: float, mask_TL: Tensor | None = None,
                     sinks_H: Tensor | None = None) -> Tensor:
    """The plain form: materialise the [T, L] scores, softmax with the sink in the denominator."""
    B, T, H, K = q_BTHK.shape
    G = k_BLGK.shape[2]
    if H % G:
        raise ValueError(f"n_heads: {H} query heads do not divide into {G} key heads")
    rep = H // G
    q = q_BTHK.transpose(1, 2)                                  # B H T K
    k = k_BLGK.transpose(1, 2).repeat_interleave(rep, dim=1)    # B H L K
    v = v_BLGV.transpose(1, 2).repeat_interleave(rep, dim=1)    # B H L V
    logits = torch.matmul(q, k.transpose(-1, -2))                # B H T L
    if logits.dtype not in (torch.float32, torch.float64):      # softmax in at least fp32
        logits = logits.float()
    logits = logits * scale
    if mask_TL is not None:
        logits = logits.masked_fill(~mask_TL, float("-inf"))
    if sinks_H is not None:
        sink = sinks_H.to(logits.dtype).view(1, H, 1, 1).expand(B, H, T, 1)
        logits = torch.cat([logits, sink], dim=-1)
    m = logits.amax(-1, keepdim=True).clamp_min(-1e30)  # rows with nothing readable stay finite
    p = torch.exp(logits - m)
    p = p / p.sum(-1, keepdim=True).clamp_min(1e-30)
    if sinks_H is not None:
        p = p[..., :-1]
    out = torch.matmul(p.to(v.dtype), v)                        # B H T V
    return out.transpose(1, 2)                                  # B T H V


def attend(q_BTHK: Tensor, k_BLGK: Tensor, v_BLGV: Tensor, *, scale: float, mask_TL: Tensor | None = None,
           sinks_H: Tensor | None = None) -> Tensor:
    """Same contract as ``attend_reference``, through torch's fused scaled-dot-product kernel.

    A sink is one more key that head h scores at exactly ``sinks_H[h]``, with a zero value:
    q' = [q, sink_h / scale], k' = [k, 0] and the sink key [0, ..., 0, 1]. Rows of the mask with
    nothing readable are opened for the kernel and zeroed afterwards, as the reference does.
    """
    B, T, H, K = q_BTHK.shape
    G = k_BLGK.shape[2]
    if H % G:
        raise ValueError(f"n_heads: {H} query heads do not divide into {G} key heads")
    q, k, v = q_BTHK.transpose(1, 2), k_BLGK.transpose(1, 2), v_BLGV.transpose(1, 2)
    mask = mask_TL
    if sinks_H is not None:
        L = k.shape[2]
        q = torch.cat([q, (sinks_H.to(q.dtype) / scale).view(1, H, 1, 1).expand(B, H, T, 1)], dim=-1)
        k = torch.cat([F.pad(k, (0, 1)), k.new_zeros(B, G, 1, K + 1)], dim=2)
        k[:, :, L, K] = 1.0
        v = torch.cat([v, v.new_zeros(B, G, 1, v.shape[-1])], dim=2)
        if mask is not None:
            mask = torch.cat([mask, mask.new_ones(*mask.shape[:-1], 1)], dim=-1)
    rows = None
    if mask is not None and not bool(mask.any(-1).all()):
        rows = mask.any(-1, keepdim=True)
        mask = mask | ~rows
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=(G != H))
    if rows is not None:
        out = out * rows
    return out.transpose(1, 2)
