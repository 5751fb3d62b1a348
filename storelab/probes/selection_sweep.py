"""Probe: selection on real text, against context length and top-k (essay section 3, "Selection is
learned retrieval"; GLM-5 arXiv 2602.15763, DeepSeek-V4 arXiv 2606.19348, MSA arXiv 2606.13392).

For every layer whose store config says ``SELECTS`` (dsa and its IndexShare groups, hierarchical,
msa, csa) the probe reads documents (token ids; text goes through the folder's tokenizer first)
concatenated, and repeated, to each context length of a sweep, prefills the model in chunks (the
cache of each layer is what the forward keeps) and asks each layer's module for its
``selection_scores`` (``storelab.stores.selection_scores``): the exact attention weights over every
entry, the indexer's scores and the forced entries, at the **last ``queries`` positions** of the
context (the queries that see the whole context: the figure is "at context C"; the cost per point is
Q x C, held ``QUERY_BUDGET`` logits at a time, so memory stays bounded at 64K). Per layer, context and
top-k multiplier m (the layer reads m * k entries, ``--topk``):

* ``recall``: of the exact attention's top m*k candidate entries per query, the fraction the indexer
  selected (forced entries, which are always read, are not candidates);
* ``mass_missed``: the exact softmax weight on entries the layer does not read;
* ``oracle_mass_missed``: the same for the exact top m*k itself (the floor for any indexer of that
  budget: the mass outside the top-k of the layer's own attention);
* for a layer that reuses another's selection (IndexShare; hierarchical reuse layers): ``owner``, the
  layer whose indexer chose, and ``sharing_cost``: the owner's recall (on its own attention) minus this
  layer's, and this layer's mass missed minus the oracle's (what its own exact top-k would miss).

Only queries with more candidates than m*k count (``queries`` in each point; below that every entry
is read).
"""

from __future__ import annotations

import torch
from torch import Tensor

from storelab.models.model import prefill
from storelab.probes.common import document_inputs
from storelab.ops.indexer import selection_mask, top_positions
from storelab.stores.selection_scores import SelectionScores, selected

ESSAY_SWEEP = {"source": "GLM-5 (arXiv 2602.15763), DeepSeek-V4 (arXiv 2606.19348), MSA (arXiv 2606.13392)",
               "finding": "an entry the indexer did not choose cannot be read; users of GLM-family models report "
                          "answers that degrade past a few thousand tokens until top-k is raised"}


def selecting_layers(model) -> list[int]:
    """Layers whose token store reads a selection of its entries (the config's ``SELECTS``)."""
    return [i for i, lay in enumerate(model.cfg.layers) if lay.token.SELECTS]


@torch.no_grad()
def layer_scores(model, inputs_BT: Tensor, *, queries: int, chunk: int = 1024) -> dict[int, SelectionScores]:
    """Each selecting layer's ``SelectionScores`` at the last ``queries`` positions of ``inputs_BT``."""
    model.eval()
    layers = selecting_layers(model)
    if not layers:
        raise ValueError("model: has no layer whose store selects entries (dsa, hierarchical, msa, csa)")
    Q = min(queries, inputs_BT.shape[1])
    xs: dict[int, Tensor] = {}

    def keep_last(i: int, x_BTD: Tensor) -> None:  # the last Q rows over the chunks: memory stays bounded
        xs[i] = x_BTD[:, -Q:] if i not in xs else torch.cat([xs[i], x_BTD], dim=1)[:, -Q:]
    hooks = [model.blocks[i].token.register_forward_pre_hook(lambda m, a, i=i: keep_last(i, a[0].detach()))
             for i in layers]
    try:
        _, cache = prefill(model, inputs_BT, chunk=chunk)
    finally:
        for h in hooks:
            h.remove()
    out: dict[int, SelectionScores] = {}
    latest: dict[str, SelectionScores] = {}   # the group's latest selection, per kind (as SelectionShare)
    for i in layers:
        lay = model.cfg.layers[i]
        handed = lay.token.CACHE_SHARING == "handed" and lay.cache_owner is not None
        state = cache[lay.cache_owner].token if handed else cache[i].token
        s = model.blocks[i].token.selection_scores(xs[i], state, owner=latest.get(lay.token.KIND))
        out[i] = latest[lay.token.KIND] = s
    return out


def layer_metrics(s: SelectionScores, k: int) -> dict:
    """Recall of the exact top ``k`` candidates, mass missed, and the oracle's mass missed, over the queries
    with more than ``k`` candidates."""
    B, G, Q, N = s.exact_BGQN.shape
    eligible_BGQ = s.candidate_BGQN.sum(-1) > k
    if not bool(eligible_BGQ.any()):
        return {"queries": 0, "recall": None, "mass_missed": None, "oracle_mass_missed": None}
    read = selected(s, k)
    exact = s.exact_BGQN.masked_fill(~s.candidate_BGQN, float("-inf")).reshape(B * G, Q, N)
    idx, valid = top_positions(exact, k)
    top = selection_mask(idx, valid, N).view(B, G, Q, N)
    e = eligible_BGQ
    recall = (top & read).sum(-1).float()[e] / k
    missed = (s.exact_BGQN * ~read).sum(-1)[e]
    oracle = (s.exact_BGQN * ~(top | s.forced_BGQN)).sum(-1)[e]
    return {"queries": int(e.sum()), "recall": recall.mean().item(), "mass_missed": missed.mean().item(),
            "oracle_mass_missed": oracle.mean().item()}


@torch.no_grad()
def selection_sweep(model, documents: list[list[int]], *, contexts: tuple[int, ...], topk: tuple[int, ...] = (1,),
                    queries: int = 64, batch: int = 1, chunk: int = 1024) -> dict:
    """Recall and mass missed of every selecting layer, per context length and top-k multiplier."""
    if not contexts or min(contexts) < 1:
        raise ValueError(f"contexts: give one or more lengths >= 1, got {contexts}")
    if not topk or min(topk) < 1:
        raise ValueError(f"topk: give one or more multipliers >= 1, got {topk}")
    if queries < 1:
        raise ValueError(f"queries: must be >= 1, got {queries}")
    rows: dict[int, dict] = {}
    for C in sorted(set(contexts)):
        scores = layer_scores(model, document_inputs(documents, C, batch), queries=queries, chunk=chunk)
        for i, s in scores.items():
            lay = model.cfg.layers[i]
            row = rows.setdefault(i, {"layer": i, "kind": lay.token.KIND, "k": s.k, "own_indexer": s.own_indexer,
                                      "owner": None if s.own_indexer else lay.selection_owner, "points": []})
            for m in sorted(set(topk)):
                row["points"].append({"context": C, "topk_multiplier": m, "k": m * s.k, **layer_metrics(s, m * s.k)})
    for row in rows.values():  # IndexShare: what reusing the owner's selection costs this layer
        if row["owner"] is None or row["owner"] not in rows:
            continue
        for p, q in zip(row["points"], rows[row["owner"]]["points"]):
            if p["recall"] is not None and q["recall"] is not None:
                p["sharing_cost"] = {"owner_recall": q["recall"], "recall": q["recall"] - p["recall"],
                                     "mass_missed": p["mass_missed"] - p["oracle_mass_missed"]}
    return {"probe": "selection_sweep", "contexts": sorted(set(contexts)), "topk": sorted(set(topk)),
            "queries": queries, "batch": batch, "documents": len(documents), "query_positions": "last",
            "layers": [rows[i] for i in sorted(rows)], "essay": ESSAY_SWEEP}
