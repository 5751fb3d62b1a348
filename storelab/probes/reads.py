"""What the attention heads read and what the feed-forward keys respond to, from one pass over documents.

One forward over ``context`` tokens of documents (token ids), with forward pre-hooks that keep each
attention layer's input and each feed-forward layer's hidden activations (the ``down_proj`` input: the
coefficients of its keys, Geva et al., arXiv 2012.14913). Then, per layer, from the layer's own
``project`` (queries and keys as the store computes them, RoPE and norms included) the exact softmax
weights of a sample of query rows (its window's mask where the store's config has ``cache_window()``,
its learned sink logits in the denominator where it has them):

* **sinks** (StreamingLLM, arXiv 2309.17453): each head's share of attention on the first token, over
  the queries that can see it; for window heads, over the queries past their window (the first token out
  of reach), the share on the oldest entry they still see, beside a uniform read's 1 / (W + 1);
* **the miss** (essay section 3): for every layer that reads every entry, the attention mass an exact
  top-k of its own weights leaves out, at each k and context length C (the queries at positions
  C - ``queries`` .. C - 1 see C entries: one pass serves every C up to ``context``);
* **feed-forward keys**: for each unit its ``top`` most-activating positions; the share of units whose
  top contexts mostly (at least half) end in the same token, by layer, beside the same share for random
  positions (what chance gives). Only the documents' first pass counts (no repeated text).

Shares are percentages with their intervals (``store_groups.Share``): Wilson over heads x queries or
units, the interval of a mean over heads the spread of its 2.5th to 97.5th percentile of heads.
"""

from __future__ import annotations

import random

import torch
from torch import Tensor

from storelab.ops.attention import causal_mask
from storelab.probes.common import document_inputs
from storelab.probes.store_groups import groups_of, rate_share, store_group
from storelab.stores.attention import Attention
from storelab.stores.ffn import FFN

__all__ = ["attention_layers", "head_weights", "attention_reads", "ffn_keys", "topk_mass_missed"]

ESSAY_SINK = ("In MiniMax's analysis of its 109-billion-parameter research models, the indexer learns to select "
              "the first block of the sequence, which holds the \u201cattention sink\u201d that many heads use as a "
              "default.")
ESSAY_MISS = "The new failure that selection brings is the miss: an entry the indexer did not choose cannot be read."
ESSAY_GEVA = ("For 65 to 80 percent of the inputs that most activate a key, annotators found a shared pattern: shallow "
              "ones, such as a common last word, in the lower layers, and semantic ones in the upper layers.")


def attention_layers(model) -> list[int]:
    """Layers whose token store is softmax attention (full or window) with its own ``project``."""
    return [i for i, b in enumerate(model.blocks) if isinstance(b.token, Attention)]


def head_weights(store: Attention, x_BTD: Tensor, rows: Tensor) -> Tensor:
    """Softmax weights [H, len(rows), T] of the query positions ``rows`` over every position, from 0."""
    c = store.cfg
    T = x_BTD.shape[1]
    q_BTHK, k_BTGK, _, _ = store.project(x_BTD, torch.arange(T, device=x_BTD.device))
    k_BTHK = k_BTGK.repeat_interleave(c.n_heads // c.n_kv_heads, dim=2)
    s_HRT = torch.einsum("rhk,thk->hrt", q_BTHK[0, rows].float(), k_BTHK[0].float()) * c.scale
    if c.softcap is not None:
        s_HRT = c.softcap * torch.tanh(s_HRT / c.softcap)
    see_RT = causal_mask(T, T, x_BTD.device)[rows]
    W = c.cache_window()
    if W:
        see_RT &= torch.arange(T, device=x_BTD.device)[None, :] >= rows[:, None] - W
    s_HRT = s_HRT.masked_fill(~see_RT, float("-inf"))
    if store.sinks is not None:  # a learned logit in the denominator, read by no entry
        sink = store.sinks.float()[:, None, None].expand(-1, len(rows), 1)
        return torch.softmax(torch.cat([s_HRT, sink], dim=-1), dim=-1)[..., :-1]
    return torch.softmax(s_HRT, dim=-1)


def topk_mass_missed(w_HRT: Tensor, k: int) -> Tensor:
    """Per head and query, the weight outside the exact top ``k`` of that query's weights [H, R]."""
    k = min(k, w_HRT.shape[-1])
    return w_HRT.sum(-1) - w_HRT.topk(k, dim=-1).values.sum(-1)


def _spread(xs: list[float]) -> dict:
    s = sorted(xs)
    lo, hi = s[int(0.025 * (len(s) - 1))], s[int(0.975 * (len(s) - 1))]
    mean = sum(s) / len(s)
    return {"percent": round(100 * mean, 2), "interval": [round(100 * lo, 2), round(100 * hi, 2)], "n": len(s),
            "text": f"{100 * mean:.0f} % [{100 * lo:.0f}, {100 * hi:.0f}]"}


@torch.no_grad()
def _inputs(model, ids_BT: Tensor, layers: list[int], ffn_layers: list[int], top: int):
    """One pass: the token stores' inputs of ``layers``; each FFN unit's ``top`` positions (by activation)."""
    xs: dict[int, Tensor] = {}
    tops: dict[int, Tensor] = {}
    hooks = [model.blocks[i].token.register_forward_pre_hook(lambda m, a, i=i: xs.__setitem__(i, a[0].detach()))
             for i in layers]
    hooks += [model.blocks[i].channel.down_proj.register_forward_pre_hook(
        lambda m, a, i=i: tops.__setitem__(i, a[0][0].float().topk(top, dim=0).indices.T)) for i in ffn_layers]
    try:
        model(ids_BT, keep_logits=1)
    finally:
        for h in hooks:
            h.remove()
    return xs, tops


@torch.no_grad()
def attention_reads(model, documents: list[list[int]], *, context: int = 1024, stride: int = 8,
                    contexts: tuple[int, ...] = (256, 512, 1024), ks: tuple[int, ...] = (64, 128, 256, 512),
                    queries: int = 32, ffn_top: int = 10, ffn: bool = True, seed: int = 0) -> dict:
    """Sinks per head, the mass an exact top-k misses per (layer, k, context), and the FFN keys' last tokens.

    ``stride``: every ``stride``-th query row counts for the sinks; ``queries``: the rows at each of
    ``contexts`` (each <= ``context``) for the miss."""
    model.eval()
    ids = document_inputs(documents, context, 1)
    T = ids.shape[1]
    att = attention_layers(model)
    if not att:
        raise ValueError("model: has no softmax attention layer to read")
    unique = min(T, sum(len(d) for d in documents))           # the documents' first pass: no repeated text
    ffn_layers = [i for i, b in enumerate(model.blocks) if isinstance(b.channel, FFN)] if ffn else []
    if ffn_layers and unique < T:   # the keys' contexts from the documents' first pass only
        _, tops = _inputs(model, ids[:, :unique], [], ffn_layers, ffn_top)
        xs2, _ = _inputs(model, ids, att, [], ffn_top)
    else:
        xs2, tops = _inputs(model, ids, att, ffn_layers, ffn_top)
    groups = groups_of(model)
    kind_of = {i: g for g, ls in groups.items() for i in ls}
    sink_rows = torch.arange(0, T, stride)
    C = sorted({c for c in contexts if c <= T})
    miss_rows = torch.cat([torch.arange(c - min(queries, c), c) for c in C]) if C else torch.arange(0)
    layers_out, miss_out = [], []
    for i in att:
        store = model.blocks[i].token
        W = store.cfg.cache_window()
        w = head_weights(store, xs2[i], sink_rows)                       # [H, R, T]
        first = w[:, :, 0]
        seen0 = sink_rows <= W if W else torch.ones_like(sink_rows, dtype=torch.bool)
        row = {"layer": i, "group": kind_of[i], "kind": model.cfg.layers[i].token.KIND, "window_tokens": W,
               "first_token_share_per_head": [round(100 * float(first[h, seen0].mean()), 2)
                                              for h in range(w.shape[0])]}
        row["first_token_share"] = _spread([float(first[h, seen0].mean()) for h in range(w.shape[0])])
        past = sink_rows > W if W else torch.zeros_like(seen0)
        if W and bool(past.any()):
            oldest = torch.stack([w[:, j, int(p) - W] for j, p in enumerate(sink_rows.tolist()) if p > W], dim=1)
            selfw = torch.stack([w[:, j, int(p)] for j, p in enumerate(sink_rows.tolist()) if p > W], dim=1)
            row["past_window"] = {"queries": int(past.sum()),
                                  "oldest_entry_share": _spread([float(oldest[h].mean()) for h in range(w.shape[0])]),
                                  "own_entry_share": _spread([float(selfw[h].mean()) for h in range(w.shape[0])]),
                                  "uniform_percent": round(100 / (W + 1), 3),
                                  "oldest_entry_share_per_head": [round(100 * float(oldest[h].mean()), 2)
                                                                  for h in range(w.shape[0])]}
        layers_out.append(row)
        if not W and C:
            wm = head_weights(store, xs2[i], miss_rows)
            start = 0
            for c in C:
                q = min(queries, c)
                part = wm[:, start:start + q]
                start += q
                for k in ks:
                    if k >= c:
                        continue
                    m = topk_mass_missed(part, k)
                    miss_out.append({"layer": i, "group": kind_of[i], "context": c, "k": k,
                                     "mass_missed": _spread([float(m[h].mean()) for h in range(m.shape[0])]),
                                     "queries": q})
        del xs2[i]
    out = {"probe": "attention_reads", "tokens": T, "stride": stride, "layers": layers_out, "miss": miss_out,
           "contexts": C, "ks": list(ks), "essay": {"sink": ESSAY_SINK, "miss": ESSAY_MISS}}
    if ffn_layers:
        out["ffn_keys"] = ffn_keys(ids[0, :unique], tops, seed=seed)
    return out


def ffn_keys(ids_T: Tensor, tops: dict[int, Tensor], *, seed: int = 0) -> dict:
    """Per FFN layer the share of units whose top positions mostly end in one token, and chance's share."""
    r = random.Random(seed)
    T = ids_T.shape[0]
    rows = []
    for i, top_UN in sorted(tops.items()):
        U, N = top_UN.shape
        last_UN = ids_T[top_UN]
        most = torch.stack([torch.bincount(x).max() for x in last_UN]) if U else torch.zeros(0)
        shared = int((most * 2 >= N).sum())
        rnd = ids_T[torch.tensor([[r.randrange(T) for _ in range(N)] for _ in range(U)])]
        base = int((torch.stack([torch.bincount(x).max() for x in rnd]) * 2 >= N).sum())
        rows.append({"layer": i, "units": U, "top": N, "shared_last_token": rate_share(shared, U).as_dict(),
                     "chance": rate_share(base, U).as_dict()})
    total = sum(x["units"] for x in rows)
    hits = sum(round(x["shared_last_token"]["percent"] * x["units"] / 100) for x in rows)
    return {"tokens": T, "layers": rows, "overall": rate_share(hits, total).as_dict() if total else None,
            "essay": ESSAY_GEVA}
