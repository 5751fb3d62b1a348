"""The task's accuracy when each global layer reads only its exact top-k (essay section 3: the miss).

``topk_reads(model, k, layers)`` is a context manager: inside it, each attention layer in ``layers``
(by default every layer of the ``global`` group, ``store_groups``) returns, for every query of every
call, softmax attention over only the ``k`` entries its own scores rank highest (the exact top-k: an
indexer that never errs in ranking, so what is lost is the mass outside the top-k alone). It is a
forward hook that recomputes the store's output from its ``project`` and the cache the call wrote;
the store, its state and its class are untouched. ``topk_accuracy`` reads the answers of prompt pairs'
A prompts at each k beside full attention, each with its Wilson interval; the check
(``storelab.probes.validity``) is the full model's accuracy above the task's chance.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import Tensor

from storelab.probes.group_swap import encode_pairs
from storelab.probes.reads import attention_layers
from storelab.probes.store_groups import GLOBAL, groups_of, rate_share
from storelab.probes.validity import learned

__all__ = ["topk_reads", "topk_accuracy"]


def _topk_output(store, x_BTD: Tensor, state, k: int) -> Tensor:
    c = store.cfg
    T = x_BTD.shape[1]
    L = state.seen
    q_BTHK, _, _, gate = store.project(x_BTD, torch.arange(L - T, L, device=x_BTD.device))
    k_BLGK, v_BLGV = state.same_width()
    rep = c.n_heads // c.n_kv_heads
    k_BLHK, v_BLHV = k_BLGK.repeat_interleave(rep, dim=2), v_BLGV.repeat_interleave(rep, dim=2)
    s_BHTL = torch.einsum("bthk,blhk->bhtl", q_BTHK.float(), k_BLHK.float()) * c.scale
    if c.softcap is not None:
        s_BHTL = c.softcap * torch.tanh(s_BHTL / c.softcap)
    see_TL = torch.arange(L, device=x_BTD.device)[None, :] <= torch.arange(L - T, L, device=x_BTD.device)[:, None]
    s_BHTL = s_BHTL.masked_fill(~see_TL, float("-inf"))
    if k < L:
        kth = s_BHTL.topk(k, dim=-1).values[..., -1:]
        s_BHTL = s_BHTL.masked_fill(s_BHTL < kth, float("-inf"))
    if store.sinks is not None:
        sink = store.sinks.float()[None, :, None, None].expand(*s_BHTL.shape[:3], 1)
        w_BHTL = torch.softmax(torch.cat([s_BHTL, sink], dim=-1), dim=-1)[..., :-1]
    else:
        w_BHTL = torch.softmax(s_BHTL, dim=-1)
    o_BTHV = torch.einsum("bhtl,blhv->bthv", w_BHTL, v_BLHV.float()).to(x_BTD.dtype)
    return store.finish(o_BTHV, gate)


@contextmanager
def topk_reads(model, k: int, layers: list[int] | None = None):
    """Within the block, ``layers`` (default: the global group's attention layers) read their top ``k`` only."""
    if k < 1:
        raise ValueError(f"k: must be >= 1, got {k}")
    att = set(attention_layers(model))
    layers = [i for i in groups_of(model).get(GLOBAL, []) if i in att] if layers is None else layers
    bad = [i for i in layers if i not in att or model.cfg.layers[i].token.cache_window()]
    if bad:
        raise ValueError(f"layers: layer {bad[0]} is not a full-attention layer")

    def hook(module, args, output):
        y, state = output
        return _topk_output(module, args[0], state, k), state

    handles = [model.blocks[i].token.register_forward_hook(hook) for i in layers]
    try:
        yield layers
    finally:
        for h in handles:
            h.remove()


@torch.no_grad()
def topk_accuracy(model, tok, records: list[dict], *, ks: tuple[int, ...], chance: float, by: str = "distance") -> dict:
    """Accuracy on the records' A prompts with full attention and with each global layer reading its top k."""
    model.eval()
    pairs, skipped = encode_pairs(tok, records, model.cfg.vocab_size)
    if not pairs:
        raise ValueError(f"records: no usable prompt (skipped: {skipped or 'none given'})")

    def answers() -> list[bool]:
        return [int(model(torch.tensor([x["ia"]]), keep_logits=1)[0][0, -1].argmax()) == x["a"] for x in pairs]

    full = answers()
    runs = {}
    layers: list[int] = []
    for k in ks:
        with topk_reads(model, k) as layers:
            if not layers:
                break
            runs[k] = answers()
    points = {}
    for key in sorted({x[by] for x in pairs}):
        idx = [j for j, x in enumerate(pairs) if x[by] == key]
        f = sum(full[j] for j in idx)
        check = learned(f / len(idx), chance)
        points[str(key)] = {"prompts": len(idx), "tokens": sum(pairs[j]["tokens"] for j in idx) / len(idx),
                            "full": rate_share(f, len(idx)).as_dict(), "valid": check.valid, "reason": check.reason,
                            "topk": {str(k): check.keep(rate_share(sum(r[j] for j in idx), len(idx)).as_dict())
                                     for k, r in runs.items()}}
    return {"probe": "topk_accuracy", "layers": layers, "ks": list(ks), "by": by, "skipped": skipped,
            "applies": bool(layers), "points": points}
