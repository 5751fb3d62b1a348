"""Compression pools positions (essay section 3): experiment 10.

A compressed store (DeepSeek-V4's compressed attention, arXiv 2606.19348) pools P
consecutive tokens into one entry: in each channel separately, softmax weights over the P
tokens (here from a fixed random scoring matrix, as a learned compressor's would be) average
the tokens' keys and values. The pooling never sees the query, so every query reads the
same entry for all positions of a pool:

* two facts (k1, v1), (k2, v2) written into one pool: the queries k1 and k2 read the same
  pooled value, up to what other pools contribute, so at most one of them can get its own
  value back (theory: neither pair member separated; per-query accuracy 1/2);
* one fact spread over two tokens of a pool, its key on one token and its value on the next:
  the pooled entry holds both, and the query k reads v (theory: accuracy 1). Plain
  attention over the uncompressed tokens cannot, since the token keyed by k holds no v.

Tokens that carry no fact have keys and values of norm 0.2. Reads: softmax attention over
the entries with sharpness beta = 2 sqrt(d) on unit-normalized
pooled keys; the answer is argmax_c v_c^T read over the values of every fact in the context.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from storelab.capacity.common import Curve, Result, gen, row, unit_rows


def pool(x_TD: Tensor, w_TD: Tensor, P: int) -> Tensor:
    """Per-channel softmax pooling of non-overlapping groups of P tokens: [T, d] -> [T/P, d]."""
    T, d = x_TD.shape
    w = torch.softmax(w_TD.view(T // P, P, d), dim=1)
    return (w * x_TD.view(T // P, P, d)).sum(1)


def read(q_QD: Tensor, k_ND: Tensor, v_ND: Tensor, beta: float) -> Tensor:
    k_ND = k_ND / k_ND.norm(dim=-1, keepdim=True)
    return torch.softmax(beta * q_QD @ k_ND.T, dim=-1) @ v_ND


FILLER = 0.2  # norm of the keys and values of tokens that carry no fact


def _context(d: int, pools: int, P: int, g: torch.Generator):
    T = pools * P
    return (FILLER * unit_rows(T, d, g), FILLER * unit_rows(T, d, g),
            torch.randn(d, d, generator=g) / math.sqrt(d))


def trial(layout: str, d: int, pools: int, P: int, g: torch.Generator) -> tuple[list[bool], list[bool]]:
    """One context; returns (pooled store correct?, uncompressed store correct?) per query.

    layout "shared": one pair of facts per pool at two random positions of that pool;
    "separate": facts in different pools; "spread": key on one token, value on the next.
    """
    k, v, G = _context(d, pools, P, g)
    n_facts = pools if layout != "separate" else pools // 2
    fk, fv = unit_rows(n_facts * (2 if layout == "shared" else 1), d, g), None
    fv = unit_rows(fk.shape[0], d, g)
    if layout == "shared":
        for p in range(pools):
            a, b = (torch.randperm(P, generator=g)[:2] + p * P).tolist()
            k[a], v[a], k[b], v[b] = fk[2 * p], fv[2 * p], fk[2 * p + 1], fv[2 * p + 1]
    elif layout == "separate":
        for f in range(fk.shape[0]):
            a = int(torch.randint(P, (1,), generator=g)) + 2 * f * P
            k[a], v[a] = fk[f], fv[f]
    else:  # spread
        for f in range(fk.shape[0]):
            a = int(torch.randint(P - 1, (1,), generator=g)) + f * P
            k[a], v[a + 1] = fk[f], fv[f]
    beta = 2 * math.sqrt(d)
    w = k @ G                                                   # the compressor's per-channel scores
    pooled = read(fk, pool(k, w, P), pool(v, w, P), beta)
    plain = read(fk, k, v, beta)
    target = torch.arange(fk.shape[0])
    return ((pooled @ fv.T).argmax(-1) == target).tolist(), ((plain @ fv.T).argmax(-1) == target).tolist()


def exp_compression(quick: bool) -> Result:
    d, pools, P, trials = (32, 8, 8, 40) if quick else (64, 16, 8, 200)
    g = gen(10_000)
    stats = {}
    for layout in ("shared", "separate", "spread"):
        pooled, plain, both = [], [], []
        for _ in range(trials):
            a, b = trial(layout, d, pools, P, g)
            pooled += a
            plain += b
            if layout == "shared":
                both += [a[i] and a[i + 1] for i in range(0, len(a), 2)]
        stats[layout] = (sum(pooled) / len(pooled), sum(plain) / len(plain), (sum(both) / len(both)) if both else None)
    res = Result()
    res.rows.append(row("10 compression, two facts in one pool", d, f"both facts of a pool read back (P = {P})", 0.0,
                        0.0, stats["shared"][2],
                        f"per-query accuracy {stats['shared'][0]:.2f} (theory 1/2): both queries read the same "
                        f"entry; the uncompressed store gets {stats['shared'][1]:.2f}"))
    res.rows.append(row("10 compression, facts in separate pools", d, "per-query accuracy (control)", 1.0, None,
                        stats["separate"][0], "one fact per pool: pooling loses nothing a query needs"))
    res.rows.append(row("10 compression, one fact over two tokens", d, "per-query accuracy (key on t, value on t+1)",
                        1.0, 1.0, stats["spread"][0],
                        f"the pooled entry holds key and value; the uncompressed store gets {stats['spread'][1]:.2f}"))
    names = ["two facts, one pool", "facts in separate pools", "fact over two tokens"]
    keys = ["shared", "separate", "spread"]
    res.curves.append(Curve("10 compression: per-query accuracy", "case (0, 1, 2)", "accuracy", hline=0.5)
                      .measured("pooled store", range(3), [stats[k][0] for k in keys])
                      .measured("uncompressed store", range(3), [stats[k][1] for k in keys])
                      .theory("pooled theory", range(3), [0.5, 1.0, 1.0]))
    res.curves[-1].title += ": " + "; ".join(f"{i}={n}" for i, n in enumerate(names))
    return res
