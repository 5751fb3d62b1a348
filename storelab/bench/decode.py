"""``storelab bench decode``: what one generated token costs at 1,024 and 65,536 tokens of context.

The essay's claim, measured: a window or recurrent store's step costs the same at any
context (it keeps and reads a fixed amount); a selection store's main attention reads a
fixed k entries while its indexer scores all L; full attention reads all L.

Each store is built directly at a small but realistic width (d_model 512, 8 heads of 64)
and given the state that a prefill of L tokens of random input leaves. That state is made
without the prefill's reads where the reads cannot change it:

* full attention and the selection store (``dsa``): a token's cache entries (key and value;
  latent, rotary key and index key) depend only on the token and its position, so the
  state is the store's own projections of the L inputs, written chunk by chunk -- exactly
  what a prefill writes, in linear time (a test holds the two equal at a small L);
* window: the projections of the last W inputs at their positions (all the window keeps);
* recurrent stores (``gated_deltanet``, ``kda``): the state depends on every token, so the
  store runs a real chunked prefill (chunks of 8,192 tokens).

Every state is checked against the store's analytic accounting (``state.nbytes()`` equals
``footprint(L, dtype="fp32").state_bytes``). Then single-token steps are timed, the context
lengths interleaved in rounds (see ``timing.compare``). For ``dsa`` the step is also split
into its parts: the indexer's scoring (index queries, scores over all L, top-k) and the main
attention's read of the selected entries (``read_selected``), each timed in rounds of its
own (the read's k rows then sit in the CPU caches, as the work of the read is what is
measured), and the read once more in rounds right after the indexer ("read_cold": its rows
come from memory, scattered over the whole cache at 65,536 tokens). The whole step also
includes appending the new entry to the cache.

Verdicts: "constant" holds when t(65,536) / t(1,024) <= 1.2; "linear" when the time per
added entry, (t(65,536) - t(1,024)) / 64,512, is positive and the ratio at least 2.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from storelab.bench.timing import compare

CONSTANT_RATIO = 1.2
LINEAR_MIN_RATIO = 2.0
PREFILL_CHUNK = 8192


def store_specs(D: int = 512, H: int = 8, K: int = 64, *, window: int = 128, topk: int = 512) -> list[dict]:
    """The stores the decode bench builds: kind, config dict, expected growth."""
    common = {"d_model": D, "n_heads": H, "head_dim": K}
    rec = {"d_model": D, "n_heads": H, "head_k_dim": K}
    return [
        {"name": f"attention (full, {H} heads, {max(1, H // 4)} KV)", "expect": "linear",
         "config": {"kind": "attention", **common, "n_kv_heads": max(1, H // 4)}},
        {"name": f"window {window}", "expect": "constant",
         "config": {"kind": "window", **common, "n_kv_heads": max(1, H // 4), "window": window}},
        {"name": "gated_deltanet", "expect": "constant", "config": {"kind": "gated_deltanet", **rec}},
        {"name": "kda", "expect": "constant", "config": {"kind": "kda", **rec}},
        {"name": f"mamba2 ({H} heads of {K}, state {K})", "expect": "constant",
         "config": {"kind": "mamba2", "d_model": D, "n_heads": H, "head_dim": K, "d_state": K}},
        {"name": "mamba (2D channels, state 16)", "expect": "constant",
         "config": {"kind": "mamba", "d_model": D, "d_inner": 2 * D, "d_state": 16}},
        {"name": f"dsa (top {topk})", "expect": "selection",
         "config": {"kind": "dsa", "d_model": D, "n_heads": H, "kv_lora_rank": 2 * K, "qk_nope_head_dim": K,
                    "qk_rope_head_dim": K // 2, "v_head_dim": K, "q_lora_rank": 3 * D // 8,
                    "index_n_heads": 4, "index_head_dim": K, "index_topk": topk}},
    ]


SPARE_ROWS = 8  # cache rows reserved past the context for the timed steps

# -- states a prefill of L tokens leaves ---------------------------------------------------------

def written_state(module: torch.nn.Module, kind: str, x_BLD: torch.Tensor, *, chunk: int = PREFILL_CHUNK):
    """The state after the store has seen ``x_BLD`` (see the module docstring for how)."""
    from storelab.state import KVCache, WindowCache, upcoming
    from storelab.stores.dsa import SelectionCache

    B, L, _ = x_BLD.shape
    spans = [(i, min(L, i + chunk)) for i in range(0, L, chunk)]
    pos = lambda i, j: torch.arange(i, j, device=x_BLD.device)  # noqa: E731
    with torch.inference_mode():
        if kind == "attention":
            ks, vs = zip(*[module.project(x_BLD[:, i:j], pos(i, j))[1:3] for i, j in spans])
            state = KVCache()
            with upcoming(SPARE_ROWS):  # room for the timed steps: a step writes in place
                state.append(torch.cat(ks, 1), torch.cat(vs, 1))
            state.seen = L
            return state
        if kind == "window":
            W = module.cfg.window
            state = WindowCache(window=W)
            i = max(0, L - W)
            _, k, v, _ = module.project(x_BLD[:, i:], pos(i, L))
            state.write(k, v)
            state.seen = L
            return state
        if kind == "dsa":
            lat, rope, idx = [], [], []
            for i, j in spans:
                p = module.mla.project(x_BLD[:, i:j], pos(i, j))
                lat.append(p.latent_BTC), rope.append(p.k_rope_BTR)
                idx.append(module.indexer.keys(x_BLD[:, i:j], pos(i, j)))
            state = SelectionCache()
            with upcoming(SPARE_ROWS):
                state.append(torch.cat(lat, 1), torch.cat(rope, 1))
                state.append_index(torch.cat(idx, 1))
            state.seen = L
            return state
        state = None
        for i, j in spans:
            _, state = module(x_BLD[:, i:j], state)
        return state


def _clone(state):
    """A copy whose tensors the timed steps may replace or grow without touching the original.

    The copy shares the original's cache buffers and writes its step's row just past the
    original's rows (as a real decode step does, in place); the original's views never reach
    that row, and the timed steps run one after another, so each overwrites the last one's.
    """
    import copy

    c = copy.copy(state)
    rows = state.__dict__.get("_rows")
    if rows:
        c.__dict__["_rows"] = {names: {**rec, "filled": getattr(state, names[0]).shape[1]}
                               for names, rec in rows.items()}
    return c


# -- the parts of a selection store's step ---------------------------------------------------------

def dsa_parts(module, state, x_B1D: torch.Tensor) -> dict[str, Callable[[], object]]:
    """Callables for the indexer's scoring and the main attention's read of one new token."""
    from storelab.ops.attention import causal_mask
    from storelab.ops.indexer import index_scores, top_positions, top_positions_streamed
    from storelab.stores.dsa import SCORE_BUDGET

    L = state.seen + 1
    positions = torch.arange(state.seen, L)
    p = module.mla.project(x_B1D, positions)
    latent = torch.cat([state.latent, p.latent_BTC], 1)
    k_rope = torch.cat([state.k_rope, p.k_rope_BTR], 1)
    index_k = torch.cat([state.index_k, module.indexer.keys(x_B1D, positions)], 1)
    mask = causal_mask(1, L)
    ix = module.indexer

    def score():  # what the store runs: scores a block at a time, a running top-k
        q, w = ix.queries(x_B1D, p.q_src_BTQ, positions)
        fn = lambda s, e: index_scores(q, index_k[:, s:e], w, scale=ix.scale)  # noqa: E731 (one query: all visible)
        block = max(1, SCORE_BUDGET // q.shape[2])
        return top_positions_streamed(fn, L, module.cfg.index_topk, block=block)

    with torch.inference_mode():  # the same choice as the plain form: every score, one sort
        q, w = ix.queries(x_B1D, p.q_src_BTQ, positions)
        plain = top_positions(index_scores(q, index_k, w, scale=ix.scale, mask_TL=mask), module.cfg.index_topk)
        if not torch.equal(score()[0], plain[0]):
            raise AssertionError("dsa: the streamed indexer chose other entries than the plain form")

    with torch.inference_mode():
        pos_BTk, valid_BTk = score()

    def read():
        return module.mla.read_selected(p, latent, k_rope, pos_BTk, valid_BTk)

    return {"indexer": score, "read": read}


# -- the bench ---------------------------------------------------------------------------------------

def _verdict(expect: str, t_small: float, t_large: float) -> bool:
    ratio = t_large / t_small
    if expect == "constant":
        return ratio <= CONSTANT_RATIO
    return ratio >= LINEAR_MIN_RATIO


def bench_decode(*, contexts: tuple[int, ...] = (1024, 65536), D: int = 512, H: int = 8, K: int = 64,
                 window: int = 128, topk: int = 512, repeats: int = 30, seed: int = 0) -> dict[str, Any]:
    """Time one token's step through each store at each context length; see the module docstring."""
    from storelab.stores import REGISTRY, build_store

    torch.manual_seed(seed)
    small, large = min(contexts), max(contexts)
    gen = torch.Generator().manual_seed(seed)
    x_all = torch.randn(1, large + 1, D, generator=gen)
    rows: list[dict[str, Any]] = []
    for spec in store_specs(D, H, K, window=window, topk=topk):
        kind = spec["config"]["kind"]
        row: dict[str, Any] = {"store": spec["name"], "kind": kind, "expect": spec["expect"]}
        if kind not in REGISTRY:
            rows.append({**row, "available": False, "reason": f"store kind {kind!r} is not registered"})
            continue
        cfg = build_store(spec["config"])
        module = cfg.build().eval()
        x_step = x_all[:, large:large + 1]
        states, fns, parts = {}, {}, {}
        for L in contexts:
            st = written_state(module, kind, x_all[:, :L])
            fp = cfg.footprint(L, dtype="fp32")
            states[L] = {"state_bytes": st.nbytes(), "footprint_bytes": fp.state_bytes,
                         "matches_footprint": st.nbytes() == fp.state_bytes and st.entries == fp.kept,
                         "read": fp.read, "scored": fp.scored, "read_flops": fp.read_flops}
            fns[f"step@{L}"] = (lambda st=st: module(x_step, _clone(st)))
            if kind == "dsa":
                for part, fn in dsa_parts(module, st, x_step).items():
                    parts[f"{part}@{L}"] = fn
        t = compare(fns, repeats=repeats, warmup=2)
        if parts:
            # each part in rounds of its own; then the read right after the indexer (cold rows)
            for part in ("indexer", "read"):
                t.update(compare({k: f for k, f in parts.items() if k.startswith(part)}, repeats=repeats, warmup=2))
            cold = compare(parts, repeats=repeats, warmup=2)
            t.update({f"read_cold@{L}": cold[f"read@{L}"] for L in contexts})
        row.update(available=True, contexts=states,
                   step_ms={L: t[f"step@{L}"].best * 1e3 for L in contexts},
                   timings={k: v.as_dict() for k, v in t.items()})
        row["step_ratio"] = t[f"step@{large}"].best / t[f"step@{small}"].best
        if kind == "dsa":
            for part in ("indexer", "read", "read_cold"):
                row[f"{part}_ms"] = {L: t[f"{part}@{L}"].best * 1e3 for L in contexts}
                row[f"{part}_ratio"] = t[f"{part}@{large}"].best / t[f"{part}@{small}"].best
            row["targets"] = {
                f"read_ratio <= {CONSTANT_RATIO:g} (constant)": row["read_ratio"] <= CONSTANT_RATIO,
                f"indexer_ratio >= {LINEAR_MIN_RATIO:g} (grows)": row["indexer_ratio"] >= LINEAR_MIN_RATIO,
            }
        else:
            word = "constant" if spec["expect"] == "constant" else "grows"
            op = "<=" if spec["expect"] == "constant" else ">="
            bound = CONSTANT_RATIO if spec["expect"] == "constant" else LINEAR_MIN_RATIO
            row["targets"] = {f"step_ratio {op} {bound:g} ({word})": _verdict(
                spec["expect"], t[f"step@{small}"].best, t[f"step@{large}"].best)}
        per_entry = (t[f"step@{large}"].best - t[f"step@{small}"].best) / (large - small)
        row["step_ns_per_added_entry"] = per_entry * 1e9
        rows.append(row)
    return {"bench": "decode", "contexts": list(contexts), "width": {"d_model": D, "n_heads": H, "head_dim": K},
            "threads": torch.get_num_threads(), "dtype": "fp32", "statistic": "best of interleaved rounds",
            "stores": rows}
