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

``attend_causal(q_BTHK, k_BLGK, v_BLGV, *, scale, sinks_H=None)`` is ``attend`` with that
causal mask, computed without it: the T queries read the L - T older entries with no mask
and their own T entries with a square causal mask, each part through torch's fused
(flash) CPU kernel, which returns the log-sum-exp of each row; the parts (and the sink,
a part whose value is zero) are merged by their log-sum-exps,

    o = sum_i exp(lse_i - lse) o_i,   lse = log sum_i exp(lse_i)

(the merge of blockwise softmax, Milakov & Gimelshein, arXiv 1805.02867; FlashAttention,
arXiv 2205.14135). Nothing of size [T, L] is built, and the kernel skips the blocks above
the diagonal. The kernel wants one head width for keys and values; when they differ the
narrower side is zero-padded, ``KEY_BLOCK`` cache rows at a time, so the copy stays small.
That kernel runs on CPU tensors without autograd (its log-sum-exp carries no gradient, so merged
parts would get a wrong one); for other tensors (on CUDA, or in training) a whole sequence without
sinks goes through ``scaled_dot_product_attention(is_causal=True)`` (no [T, T] array, in forward or
backward), anything else is ``attend`` with the causal mask. ``attend_lse`` follows the same rule.

A store takes its kernel once, at construction, from ``KERNELS`` by its config's ``kernel``:

* ``"fused"``: ``attend_causal`` for causal reads of a cache, ``attend`` for masked ones;
* ``"reference"``: ``attend_causal_reference`` / ``attend_reference``, every score materialised;
* ``softcapped(cap)``: the reference form with each scaled score s read as cap tanh(s / cap) before the
  mask (Gemma 2's ``attn_logit_softcapping``, arXiv 2408.00118), taken by a store whose config sets
  ``softcap``: torch's fused kernels have no hook for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from storelab.ops._inputs import float_tensors
from storelab.ops.precision import at_least_fp32, compute_dtype

__all__ = ["attend", "attend_causal", "attend_causal_blocks", "attend_causal_reference", "attend_lse", "merge_parts",
           "attend_reference", "causal_mask", "window_mask", "Kernel", "KERNELS", "softcapped"]

KEY_BLOCK = 8192
FLASH_CPU = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu  # (out, lse); in every torch we pin


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
                     sinks_H: Tensor | None = None, softcap: float | None = None) -> Tensor:
    """The plain form: materialise the [T, L] scores, softmax with the sink in the denominator.
    ``softcap`` c: each scaled score s becomes c tanh(s / c) before the mask (Gemma 2's soft cap)."""
    float_tensors("attend_reference", q=q_BTHK, k=k_BLGK, v=v_BLGV, sinks_H=sinks_H)
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
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
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
    float_tensors("attend", q=q_BTHK, k=k_BLGK, v=v_BLGV, sinks_H=sinks_H)
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


def _flash_takes(*tensors: Tensor) -> bool:
    """Whether ``FLASH_CPU`` may take these tensors: on the CPU, and no gradient wanted through them."""
    return tensors[0].device.type == "cpu" and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))


def _part(q_BHTX: Tensor, k_BGLK: Tensor, v_BGLV: Tensor, *, scale: float, causal: bool, width: int) \
        -> tuple[Tensor, Tensor]:
    """One part through the flash kernel: (output [B, H, T, V], log-sum-exp [B, H, T], fp32).
    ``width`` is the common head width the kernel is given (q is already padded to it)."""
    K, V = k_BGLK.shape[-1], v_BGLV.shape[-1]
    if K < width:
        k_BGLK = F.pad(k_BGLK, (0, width - K))
    if V < width:
        v_BGLV = F.pad(v_BGLV, (0, width - V))
    o, lse = FLASH_CPU(q_BHTX, k_BGLK, v_BGLV, 0.0, causal, scale=scale)
    return o[..., :V], lse


def attend_causal(q_BTHK: Tensor, k_BLGK: Tensor, v_BLGV: Tensor, *, scale: float,
                  sinks_H: Tensor | None = None, v_dim: int | None = None) -> Tensor:
    """``attend(q, k, v, mask_TL=causal_mask(T, L), ...)`` without the mask (see the module docstring).

    The T queries sit at the last T of the L positions; k and v may be strided views (of a cache
    buffer): they are read in place. ``v_dim``: only the first v_dim value channels are values
    (the rest ride along to give keys and values one width, ``KVCache.same_width``); the output
    keeps those. Keys wider than the query score the query's channels only.
    """
    float_tensors("attend_causal", q=q_BTHK, k=k_BLGK, v=v_BLGV, sinks_H=sinks_H)
    if v_dim is not None and v_dim < v_BLGV.shape[-1]:
        return attend_causal(q_BTHK, k_BLGK, v_BLGV, scale=scale, sinks_H=sinks_H)[..., :v_dim]
    B, T, H, K = q_BTHK.shape
    if k_BLGK.shape[-1] > K:  # the query scores its own K channels: zero-pad it to the keys' width
        q_BTHK = F.pad(q_BTHK, (0, k_BLGK.shape[-1] - K))
        K = k_BLGK.shape[-1]
    L, G, V = k_BLGK.shape[1], k_BLGK.shape[2], v_BLGV.shape[-1]
    if not _flash_takes(q_BTHK, k_BLGK, v_BLGV):
        if H % G:
            raise ValueError(f"n_heads: {H} query heads do not divide into {G} key heads")
        if L == T and sinks_H is None:  # training on a whole sequence: the fused kernel's own causal backward
            return _causal_sdpa(q_BTHK, k_BLGK, v_BLGV, scale=scale)
        return attend(q_BTHK, k_BLGK, v_BLGV, scale=scale, mask_TL=causal_mask(T, L, q_BTHK.device), sinks_H=sinks_H)
    return attend_causal_blocks(q_BTHK, lambda s, e: (k_BLGK[:, s:e], v_BLGV[:, s:e]), L, G=G, V=V, scale=scale,
                                sinks_H=sinks_H, block=L if K == V else KEY_BLOCK)  # else: padded block by block


def _causal_sdpa(q_BTHK: Tensor, k_BTGK: Tensor, v_BTGV: Tensor, *, scale: float) -> Tensor:
    """T queries over their own T entries through ``scaled_dot_product_attention(is_causal=True)``, which
    autograd differentiates without a [T, T] array (flash on the CPU); key and value widths padded to one."""
    K, V = k_BTGK.shape[-1], v_BTGV.shape[-1]
    W = max(K, V)
    q, k, v = (x.transpose(1, 2) if x.shape[-1] == W else F.pad(x, (0, W - x.shape[-1])).transpose(1, 2)
               for x in (q_BTHK, k_BTGK, v_BTGV))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, enable_gqa=k.shape[1] != q.shape[1])
    return o.transpose(1, 2)[..., :V]


def attend_causal_reference(q_BTHK: Tensor, k_BLGK: Tensor, v_BLGV: Tensor, *, scale: float,
                            sinks_H: Tensor | None = None, v_dim: int | None = None,
                            softcap: float | None = None) -> Tensor:
    """``attend_causal`` in the plain form: the [T, L] causal mask and every score materialised."""
    T, K, L = q_BTHK.shape[1], q_BTHK.shape[-1], k_BLGK.shape[1]
    o_BTHV = attend_reference(q_BTHK, k_BLGK[..., :K], v_BLGV, scale=scale, mask_TL=causal_mask(T, L, q_BTHK.device),
                              sinks_H=sinks_H, softcap=softcap)
    return o_BTHV if v_dim is None else o_BTHV[..., :v_dim]


def attend_causal_blocks(q_BTHK: Tensor, kv, L: int, *, G: int, V: int, scale: float,
                         sinks_H: Tensor | None = None, block: int = KEY_BLOCK) -> Tensor:
    """Causal attention whose keys and values are produced ``block`` rows at a time:
    ``kv(s, e)`` returns (k [B, e - s, G, K], v [B, e - s, G, V]) for positions s..e-1 (MLA's
    naive read expands its latent cache this way, never all at once). Inference only."""
    B, T, H, K = q_BTHK.shape
    if H % G:
        raise ValueError(f"n_heads: {H} query heads do not divide into {G} key heads")
    if L < T:
        raise ValueError(f"k: {L} entries cannot hold the {T} queries' own")
    width = max(K, V)
    q = q_BTHK.transpose(1, 2)
    if K < width:
        q = F.pad(q, (0, width - K))

    def part(s: int, e: int, causal: bool) -> tuple[Tensor, Tensor]:
        k, v = kv(s, e)
        return _part(q, k.transpose(1, 2), v.transpose(1, 2), scale=scale, causal=causal, width=width)

    block = max(1, block)
    L0 = L - T if T > 1 else L  # one query reads everything: no causal part
    spans = [(s, min(L0, s + block), False) for s in range(0, L0, block)]
    if T > 1:
        spans.append((L0, L, True))
    if len(spans) == 1 and sinks_H is None:
        return part(*spans[0])[0].transpose(1, 2)
    parts = ((o.transpose(1, 2), lse) for o, lse in (part(*span) for span in spans))  # made one at a time
    return merge_parts(parts, sinks_H=sinks_H).to(q_BTHK.dtype)


def attend_lse(q_BTHK: Tensor, k_BLGK: Tensor, v_BLGV: Tensor, *, scale: float, mask_TL: Tensor | None = None,
               causal: bool = False) -> tuple[Tensor, Tensor]:
    """One part of a blockwise softmax: (output [B, T, H, V], log-sum-exp [B, H, T] in fp32).

    Without a mask (``causal``: the square causal mask, T == L) it runs the fused kernel and
    reads k and v in place. With ``mask_TL`` ([T, L], or [B, T, L] / [B, H, T, L]) it builds the
    scores of this part, so keep masked parts small (a window, a gathered selection). A row
    with nothing readable has lse = -inf and output 0: it adds nothing when merged.
    Parts over disjoint entries combine with ``merge_parts``.
    """
    B, T, H, K = q_BTHK.shape
    L, G, V = k_BLGK.shape[1], k_BLGK.shape[2], v_BLGV.shape[-1]
    if H % G:
        raise ValueError(f"n_heads: {H} query heads do not divide into {G} key heads")
    if L == 0:
        return q_BTHK.new_zeros(B, T, H, V), q_BTHK.new_full((B, H, T), float("-inf"), dtype=torch.float32)
    if mask_TL is None and _flash_takes(q_BTHK, k_BLGK, v_BLGV):
        width = max(K, V)
        q = q_BTHK.transpose(1, 2)
        if K < width:
            q = F.pad(q, (0, width - K))
        o, lse = _part(q, k_BLGK.transpose(1, 2), v_BLGV.transpose(1, 2), scale=scale, causal=causal, width=width)
        return o.transpose(1, 2), lse
    if causal:
        mask_TL = causal_mask(T, L, q_BTHK.device)
    rep = H // G
    q = q_BTHK.transpose(1, 2)
    k = k_BLGK.transpose(1, 2).repeat_interleave(rep, dim=1)
    v = v_BLGV.transpose(1, 2).repeat_interleave(rep, dim=1)
    logits = at_least_fp32(torch.matmul(q, k.transpose(-1, -2))) * scale          # B H T L
    if mask_TL is not None:
        m = mask_TL if mask_TL.dim() == 4 else (mask_TL[:, None] if mask_TL.dim() == 3 else mask_TL)
        logits = logits.masked_fill(~m, float("-inf"))
    lse = torch.logsumexp(logits, dim=-1)                                   # B H T
    p = torch.exp(logits - lse.clamp_min(-1e30)[..., None])
    out = torch.matmul(p.to(v.dtype), v)
    return out.transpose(1, 2), lse


def merge_parts(parts, *, sinks_H: Tensor | None = None, keep_lse: bool = False):
    """Combine ``attend_lse`` parts (outputs [B, T, H, V], lse [B, H, T]) over disjoint entries into
    one softmax: o = sum_i exp(lse_i - lse) o_i; a sink adds exp(sink_h) to the denominator.

    The merge runs: ``parts`` may be a generator, and only the running output and log-sum-exp are
    held, so merging many key blocks costs no more memory than one. ``keep_lse``: also return the
    merged log-sum-exp (a part to merge again later). Rows nothing reads stay zero.
    """
    out = lse = None
    dtype = None
    for o, l_ in parts:
        if out is None:
            out, lse, dtype = o.to(compute_dtype(o.dtype), copy=True), l_, o.dtype
            continue
        new = torch.logaddexp(lse, l_).clamp_min(-1e30)
        out.mul_(torch.exp(lse - new).transpose(1, 2)[..., None])
        out.addcmul_(at_least_fp32(o), torch.exp(l_ - new).transpose(1, 2)[..., None])
        lse = new
    if out is None:
        raise ValueError("parts: nothing to merge")
    if sinks_H is not None:
        B, T, H, _ = out.shape
        new = torch.logaddexp(lse, at_least_fp32(sinks_H).view(1, H, 1).expand(B, H, T)).clamp_min(-1e30)
        out.mul_(torch.exp(lse - new).transpose(1, 2)[..., None])
        lse = new
    return (out.to(dtype), lse) if keep_lse else out.to(dtype)


@dataclass(frozen=True)
class Kernel:
    """The two reads of a softmax store, in one form (see the module docstring):
    ``causal(q, k, v, *, scale, sinks_H=None, v_dim=None)`` of a whole cache, and
    ``masked(q, k, v, *, scale, mask_TL=None, sinks_H=None)``."""

    causal: Callable[..., Tensor]
    masked: Callable[..., Tensor]


KERNELS = {"fused": Kernel(causal=attend_causal, masked=attend),
           "reference": Kernel(causal=attend_causal_reference, masked=attend_reference)}


def softcapped(cap: float) -> Kernel:
    """The reference kernel with each scaled score s read as cap tanh(s / cap) (Gemma 2's
    ``attn_logit_softcapping``; torch's fused kernels have no such hook, so a capped store reads in the
    plain form)."""
    return Kernel(causal=partial(attend_causal_reference, softcap=cap), masked=partial(attend_reference, softcap=cap))
