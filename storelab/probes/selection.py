"""Probe 5: what the indexers select (essay section 3, "Selection is learned retrieval").

For every selection layer (``msa`` blocks, MiniMax arXiv 2606.13392; ``dsa`` / ``hierarchical``
positions, arXiv 2602.15763 and 2609.19969) the probe runs the model once on real inputs,
recomputes the layer's *full* attention weights over every visible entry (the weights the
main attention would give if it could read everything; averaged over the heads that share
a selection), and compares them with what the indexer selected. Only queries that see more
entries than the layer may read count (below that, everything is selected).

* ``miss_rate``: of the ``budget`` entries the full attention weights most, the fraction
  the indexer did not select;
* ``top1_miss``: how often the single most-weighted entry was not selected;
* ``mass_missed``: the full attention weight that falls on unselected entries;
* ``first_block_rate``: how often the selection includes the first block (positions
  ``0 .. first_block - 1``: an MSA block, or the first position for DSA) -- the attention
  sink MiniMax's indexers learn to select;
* ``first_block_weight``: the full attention weight on the first block (how much the heads
  use it as a sink).
"""

from __future__ import annotations

import torch

from storelab.ops.attention import causal_mask
from storelab.ops.indexer import selection_mask
from storelab.ops.msa import block_mask
from storelab.stores.base import observe
from storelab.stores.dsa import SelectionAttention
from storelab.stores.msa import BlockSparseAttention

ESSAY_SELECT = {"source": "MiniMax's analysis of its 109B research models (MSA, arXiv 2606.13392)",
                "finding": "the indexer learns to select the first block (the attention sink); a miss cannot be read"}


def selection_layers(model) -> list[int]:
    return [i for i, b in enumerate(model.blocks) if isinstance(b.token, (BlockSparseAttention, SelectionAttention))]


def _softmax_causal(logits_BHTL: torch.Tensor) -> torch.Tensor:
    T, L = logits_BHTL.shape[-2:]
    return torch.softmax(logits_BHTL.float().masked_fill(~causal_mask(T, L, logits_BHTL.device), float("-inf")),
                         dim=-1)


def msa_view(store: BlockSparseAttention, x_BTD: torch.Tensor, blocks_BGTk: torch.Tensor) \
        -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """(full weights [B, G, T, L], selected [B, G, T, L], budget, first block size) of one MSA call from 0,
    given the blocks the call chose (what the store emitted as ``"blocks"``)."""
    c = store.cfg
    B, T, _ = x_BTD.shape
    pos = torch.arange(T, device=x_BTD.device)
    q_BTHK, k_BTGK, _, _ = store.project(x_BTD, pos)
    k_BTHK = k_BTGK.repeat_interleave(c.n_heads // c.n_kv_heads, dim=2)
    w_BHTL = _softmax_causal(torch.einsum("bthk,blhk->bhtl", q_BTHK, k_BTHK) * c.scale)
    w_BGTL = w_BHTL.view(B, c.n_kv_heads, -1, T, T).mean(2)
    sel = block_mask(blocks_BGTk, positions_T=pos, length=T, block_size=c.block_size)
    return w_BGTL, sel, c.budget, c.block_size


def dsa_view(store: SelectionAttention, x_BTD: torch.Tensor, sel_pos_BTk: torch.Tensor) \
        -> tuple[torch.Tensor, torch.Tensor, int, int]:
    """(full weights [B, 1, T, L], selected [B, 1, T, L], budget, 1) of one DSA call from 0 (absorbed MLA),
    given the positions the call selected (what it emitted as ``"selection"``)."""
    B, T, _ = x_BTD.shape
    pos = torch.arange(T, device=x_BTD.device)
    p = store.mla.project(x_BTD, pos)
    q_BTHX = store.mla.absorbed_query(p)
    keys_BLX = torch.cat([p.latent_BTC, p.k_rope_BTR], dim=-1)
    w_BHTL = _softmax_causal(torch.einsum("bthx,blx->bhtl", q_BTHX, keys_BLX) * store.mla.cfg.scale)
    sel = selection_mask(sel_pos_BTk, torch.ones_like(sel_pos_BTk, dtype=torch.bool), T)
    return w_BHTL.mean(1, keepdim=True), sel[:, None] & causal_mask(T, T, sel.device), store.selector.k, 1


def selection_metrics(w_BGTL: torch.Tensor, sel_BGTL: torch.Tensor, budget: int, first: int) -> dict:
    """The probe's figures for one layer, over the queries that see more than ``budget`` entries."""
    T = w_BGTL.shape[2]
    elig_T = torch.arange(T, device=w_BGTL.device) + 1 > budget
    if not elig_T.any():
        return {"eligible_queries": 0}
    w, sel = w_BGTL[:, :, elig_T], sel_BGTL[:, :, elig_T]
    top = w.topk(budget, dim=-1).indices
    missed = ~sel.gather(-1, top)
    return {
        "eligible_queries": int(w.shape[0] * w.shape[2]),
        "miss_rate": missed.float().mean().item(),
        "top1_miss": (~sel.gather(-1, w.argmax(-1, keepdim=True))).float().mean().item(),
        "mass_missed": (w * ~sel).sum(-1).mean().item(),
        "first_block_rate": sel[..., :first].any(-1).float().mean().item(),
        "first_block_weight": w[..., :first].sum(-1).mean().item(),
    }


@torch.no_grad()
def selection(model, task=None, *, inputs=None, n: int = 8, seed: int = 0) -> dict:
    """Miss rate and first-block rate of every selection layer, on ``n`` documents of ``task``."""
    model.eval()
    layers = selection_layers(model)
    if not layers:
        from storelab.stores.base import REGISTRY  # the configs say which kinds select, not a list here

        kinds = ", ".join(sorted(k for k, c in REGISTRY.items() if c.SELECTS))
        raise ValueError(f"model: has no selection layer (the kinds that select: {kinds})")
    if inputs is None:
        inputs = task.sample(n, seed).inputs
    xs: dict[int, torch.Tensor] = {}
    hooks = [model.blocks[i].token.register_forward_pre_hook(lambda m, a, i=i: xs.__setitem__(i, a[0].detach()))
             for i in layers]
    try:
        # one call from an empty cache, so every layer's selection covers the whole input
        with observe(*(model.blocks[i].token for i in layers)) as seen:
            model(inputs)
    finally:
        for h in hooks:
            h.remove()
    rows = []
    for i in layers:
        store = model.blocks[i].token
        if isinstance(store, BlockSparseAttention):
            w, sel, budget, first = msa_view(store, xs[i], seen.last(store, "blocks"))
        else:
            w, sel, budget, first = dsa_view(store, xs[i], seen.last(store, "selection"))
        rows.append({"layer": i, "kind": model.cfg.layers[i].token.KIND, "budget": budget, "first_block": first,
                     **selection_metrics(w, sel, budget, first)})
    scored = [r for r in rows if r.get("eligible_queries")]

    def mean(k: str) -> float | None:
        return sum(r[k] for r in scored) / len(scored) if scored else None

    return {"probe": "selection", "documents": int(inputs.shape[0]), "tokens": int(inputs.shape[1]), "layers": rows,
            "miss_rate": mean("miss_rate"), "top1_miss": mean("top1_miss"), "mass_missed": mean("mass_missed"),
            "first_block_rate": mean("first_block_rate"), "essay": ESSAY_SELECT}
