"""``storelab bench [gdn|kda|mamba2|decode|prefill|train|all]``: ours against the peer, in one process, as ratios.

Every bench prints our time, the peer's time measured in the same run, their ratio, and
the machine's fp32 matrix-product rate measured in the same run (see storelab/bench).
``--quick`` runs tiny sizes (seconds; for tests and smoke checks, not for figures).
``train`` (the ops, the tiny models' training steps and their peak memory, under autograd) takes
tens of minutes at its full sizes and is not part of ``all``. ``dist`` (``storelab.bench.dist``:
bytes per process and step time of a ~50M-parameter model under DDP and FSDP2 on two torchrun
processes) is not part of ``all`` either, nor is ``mamba2`` (``storelab.bench.mamba2``: the SSD op and the
Mamba-2 mixer, forward + backward, against transformers' torch path), nor ``families`` (``storelab.bench.families``:
a tiny Nemotron-H's training step against transformers' same model, B = 4, T = 512 and 2,048), nor ``engines``
(``storelab.bench.engines``: ``storelab bench engines MODEL``, a GGUF file or a real subject, prefill and
decode against transformers and llama.cpp on the same weights, at 1 and 2 threads).
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
from pathlib import Path
from typing import Any

import typer

from storelab import options as opt
from storelab.console import console, emit_json, table

WHICH = ("gdn", "kda", "mamba2", "families", "decode", "prefill", "train", "dist", "engines", "all")

# full sizes (the targets) and quick sizes (smoke checks)
FULL = {
    # 30 rounds (about 10 s of GDN; KDA's peer stops at the 60 s budget): on a shared machine a
    # slow spell can last several seconds, and the best of rounds spread over more time is more
    # likely to come from a quiet one, for every side alike
    "kernel": dict(T=4096, H=8, K=64, repeats=30),
    "decode": dict(contexts=(1024, 65536), D=512, H=8, K=64, window=128, topk=512, repeats=40),
    "prefill": dict(length=131072, speed_length=16384),
    # issue 16's sizes: the ops at B=1, 8 heads of 64, T=4,096 (KDA's peer takes tens of seconds a
    # call: its rounds stop at the budget); the models' steps at B=4, T=2,048; memory at 4,096 and 16,384
    "train": dict(ops=dict(T=4096, H=8, K=64, repeats=10, budget_s=120.0),
                  step=dict(B=4, T=2048, repeats=3, budget_s=120.0), memory_lengths=(4096, 16384)),
    "mamba2": dict(T=4096, H=8, P=64, N=64, D=256, repeats=10, budget_s=120.0),
    "families": dict(lengths=(512, 2048), B=4, repeats=3, budget_s=120.0),
}
# `all` reads 4,096-token prompts (memory and speed in one run per model); the target
# lengths (131,072 and 16,384) take many minutes: `storelab bench prefill` runs them
ALL_PREFILL = dict(length=4096, speed_length=4096)
QUICK = {
    "kernel": dict(T=256, H=2, K=16, repeats=2, matmul_n=256),
    "decode": dict(contexts=(64, 256), D=64, H=2, K=16, window=16, topk=16, repeats=3),
    "prefill": dict(length=512, speed_length=256),
    "train": dict(ops=dict(T=256, H=2, K=16, repeats=1), step=dict(B=1, T=64, repeats=1),
                  memory_lengths=(128, 512)),
    "mamba2": dict(T=128, H=2, P=8, N=8, D=16, repeats=1),
    "families": dict(lengths=(64,), B=1, repeats=1, quick=True),
}


def machine() -> dict[str, Any]:
    import torch

    return {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "torch": torch.__version__,
            "platform": platform.platform(), "processor": platform.processor() or platform.machine()}


def run_benches(which: str, *, quick: bool = False, repeats: int | None = None, models: list[str] | None = None,
                length: int | None = None, speed_length: int | None = None, chunk: int | None = None,
                peer: bool = True, memory_chunk: int | None = None, target: str | None = None,
                threads: tuple[int, ...] = (1, 2), progress=None, f32: bool = False) -> dict[str, Any]:
    """Run the chosen benches; one dict keyed by bench name, plus the machine and the date."""
    if which not in WHICH:
        raise ValueError(f"which: must be one of {', '.join(WHICH)}, got {which!r}")
    sizes = QUICK if quick else FULL
    names = ["gdn", "kda", "decode", "prefill"] if which == "all" else [which]
    out: dict[str, Any] = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
                           "quick": quick, "machine": machine()}
    for name in names:
        if name in ("gdn", "kda"):
            from storelab.bench.kernels import bench_delta

            kw = dict(sizes["kernel"])
            if repeats:
                kw["repeats"] = repeats
            out[name] = bench_delta(name, **kw)
        elif name == "train":
            from storelab.bench.train import bench_train

            kw = {k: dict(v) if isinstance(v, dict) else v for k, v in sizes["train"].items()}
            if repeats:
                kw["ops"]["repeats"] = kw["step"]["repeats"] = repeats
            out[name] = bench_train(models=models or None, progress=not quick, **kw)
        elif name == "mamba2":
            from storelab.bench.mamba2 import bench_mamba2

            kw = dict(sizes["mamba2"])
            if repeats:
                kw["repeats"] = repeats
            out[name] = bench_mamba2(**kw)
        elif name == "families":
            from storelab.bench.families import bench_families

            kw = dict(sizes["families"])
            if repeats:
                kw["repeats"] = repeats
            out[name] = bench_families(**kw)
        elif name == "engines":
            from storelab.bench.engines import bench_engines

            if not target:
                raise ValueError("engines: MODEL is needed (a .gguf file or a real subject: smollm2-135m, gemma3-270m)")
            kw = dict(prompt=64, chunk=32, new_tokens=4, rounds=1, threads=threads[:1]) if quick else \
                dict(threads=threads)
            if repeats:
                kw["rounds"] = repeats
            out[name] = bench_engines(target, peers=peer, progress=progress, f32=f32, **kw)
        elif name == "dist":
            from storelab.bench.dist import bench_dist

            out[name] = bench_dist(quick=quick, steps=repeats or (1 if quick else 3))
        elif name == "decode":
            from storelab.bench.decode import bench_decode

            kw = dict(sizes["decode"])
            if repeats:
                kw["repeats"] = repeats
            out[name] = bench_decode(**kw)
        else:
            from storelab.bench.prefill import bench_prefill

            kw = dict(sizes["prefill"])
            if which == "all" and not quick:  # shorter prompts keep `all` to minutes
                kw.update(ALL_PREFILL)
            if length:
                kw["length"] = length
            if speed_length:
                kw["speed_length"] = speed_length
            out[name] = bench_prefill(models=models or None, chunk=chunk, memory_chunk=memory_chunk, quick=quick,
                                      peer=peer, **kw)
    return out


# -- tables for people ----------------------------------------------------------------------------------

def _round(v: float | None, digits: int = 0) -> float | int | None:
    if v is None:
        return None
    return int(round(v)) if digits == 0 else round(v, digits)


def _ok(v: Any) -> str:
    return {True: "yes", False: "NO", None: "n/a"}.get(v, str(v))


def print_train(r: dict[str, Any]) -> None:
    """The three tables of ``storelab bench train``: the ops, the models' steps, the memory."""
    rows = []
    for name, o in r["ops"].items():
        f = o["flops"]
        speed_ok, frac_ok = o["targets"].values()
        rows.append([name, _round(o["ours_ms"], 1), _round(o["peer_ms"], 1), _round(o["speedup"], 2), _ok(speed_ok),
                     f"{f['total'] / 1e9:.3g}", float(f"{o['ours_gflops']:.3g}"),
                     _round(o["matmul_gflops"], 1), float(f"{o['fraction_of_matmul']:.3g}"), _ok(frac_ok)])
    o = next(iter(r["ops"].values()), None)
    if o is not None:
        s, t = o["shape"], list(o["targets"])
        console.print(table(f"train ops: forward + backward under autograd, B={s['B']} H={s['H']} K={s['K']} "
                            f"T={s['T']} fp32, {r['threads']} threads; GFLOP counted (WY form, forward + "
                            f"backward); matmul of {o['matmul_n']}^3 in the same rounds",
                            ["op", "ours ms", "peer ms", "speedup", t[0].replace("speedup ", ""), "GFLOP",
                             "GFLOP/s", "matmul GFLOP/s", "of matmul", t[1].replace("fraction_of_matmul ", "")],
                            rows))
    rows = []
    for m in r["models"]:
        if "error" in m:
            rows.append([m["model"], None, None, None, None, None, m["error"]])
            continue
        rows.append([m["model"], _round(m["ours_ms"]), _round(m["peer_ms"]), _round(m["speedup"], 2),
                     f">= {m['target']:g}", _ok(m["meets_target"]), (m.get("peer") or "").replace("transformers ", "")])
    m0 = next((m for m in r["models"] if "B" in m), {})
    console.print(table(f"train step (forward, cross-entropy, backward), B={m0.get('B')} T={m0.get('T')}, "
                        "ms, best of rounds", ["model", "ours", "transformers", "speedup", "target", "pass",
                                               "peer"], rows))
    mem = r["memory"]
    Ls = mem["lengths"]
    rows = []
    for m in mem["models"]:
        if "error" in m:
            rows.append([m["model"], None, *[None] * len(Ls), None, m["error"]])
            continue
        rows.append([m["model"], _round(m["weights_mb"], 1), *[_round(m["peak_mb"][str(L)], 1) for L in Ls],
                     _round(m["ratio"], 2), f"{_ok(m['meets_target'])} (<= {m['ratio_target']:g})"])
    console.print(table("train step peak memory, B=1, MB of tensors above the weights (torch profiler)",
                        ["model", "weights", *[f"T={L:,}" for L in Ls], f"{Ls[-1]:,} / {Ls[0]:,}", "linear"],
                        rows))


def print_dist(r: dict[str, Any]) -> None:
    """``storelab bench dist``: bytes each process holds and the step time, per engine."""
    rows = []
    for row in r["rows"]:
        if "error" in row:
            rows.append([row["parallel"], None, None, None, None, row["error"]])
            continue
        held = max(row["per_process"], key=lambda h: h["params"] + h["optimizer"])
        rows.append([row["parallel"], row["parameters"], _round(held["params"] / 2**20, 1),
                     _round(held["optimizer"] / 2**20, 1), _round(held["grads"] / 2**20, 1),
                     _round(row["step_s"], 2)])
    console.print(table(f"bench dist: {r['nproc']} processes, MiB per process (largest), fp32",
                        ["engine", "parameters", "params MiB", "AdamW MiB", "grads MiB", "step s"], rows))


def print_mamba2(r: dict[str, Any]) -> None:
    """``storelab bench mamba2``: the op and the mixer, forward + backward."""
    rows = []
    for name, o in r.items():
        peer = "unavailable" if o["peer_ms"] is None else o["peer"].split()[1].split(".")[-1]  # the function's name
        rows.append([name, o["ours_ms"], o["peer_ms"], o["speedup"], o["grad_max_abs_diff"],
                     float(f"{o['ours_gflops']:.3g}"), float(f"{o['fraction_of_matmul']:.3g}"), peer])
    o = r["op"]
    s, c = o["shape"], o["chunk"]
    console.print(table(f"mamba2: forward + backward, B={s['B']} H={s['H']} P={s['P']} N={s['N']} G={s['G']} "
                        f"T={s['T']} fp32, {o['threads']} threads; chunks of {c['ours']} (ours) and {c['peer']} "
                        f"(peer); of matmul: counted GFLOP/s over a {o['matmul_n']}^3 product's",
                        ["", "ours ms", "peer ms", "speedup", "max |dgrad|", "GFLOP/s", "of matmul", "peer"], rows))


def print_families(r: dict[str, Any]) -> None:
    """``storelab bench families``: a hybrid family's training step against transformers' same tiny model."""
    rows = [[o["family"], o["B"], o["T"], o["ours_ms"], o["peer_ms"], o["speedup"], _ok(o["meets_target"]),
             float(f"{o['logits_rel_diff']:.2g}")] for o in r["rows"]]
    console.print(table("families: one training step (forward, loss, backward), fp32, same weights",
                        ["family", "B", "T", "ours ms", "transformers ms", "speedup", ">= 2x", "logits diff"], rows))


def print_engines(r: dict[str, Any]) -> None:
    """``storelab bench engines``: tokens per second of each engine, then storelab's ratios to each peer."""
    rows = [[x["engine"], x["threads"], _round(x["prefill_tok_s"]), _round(x["decode_tok_s"], 1)] for x in r["rows"]]
    console.print(table(f"engines: {Path(r['path']).name}, prefill of {r['prompt']:,} tokens in chunks of "
                        f"{r['chunk']}, decode of {r['new_tokens']}, tokens/s ({r['statistic']})",
                        ["engine", "threads", "prefill", "decode"], rows))
    rows = [[x["engine"], x["peer"], x["threads"], _round(x["prefill"], 2), _round(x["decode"], 2)] for x in r["ratios"]]
    console.print(table("storelab / peer (tokens/s over tokens/s)", ["storelab", "peer", "threads", "prefill",
                                                                       "decode"], rows))
    rows = [[x["engine"], x["threads"], _round(x["decode_gb_s"], 1), f"{x['decode_of_memory']:.0%}",
             _round(x["prefill_gflops"], 1) if "prefill_gflops" in x else "-",
             f"{x['prefill_of_matmul']:.0%}" if "prefill_of_matmul" in x else "-"]
            for x in r["rows"] if "decode_gb_s" in x]
    if rows:
        console.print(table("against the machine: decode's bytes read per second (weights and cache once a step) and "
                            "its share of the memory read rate; prefill's linear-layer FLOP/s and share of the "
                            "matmul rate", ["engine", "threads", "decode GB/s", "of read rate", "prefill GFLOP/s",
                                            "of matmul"], rows))
    mm = ", ".join(f"{_round(v, 1)} GFLOP/s at {k} threads" for k, v in r["matmul_gflops"].items())
    rd = ", ".join(f"{_round(v, 1)} GB/s at {k} threads" for k, v in r.get("read_gb_s", {}).items())
    console.print(f"llama.cpp: {r['llama_cpp']}; machine fp32 matmul {mm}; memory read {rd}")


def print_tables(res: dict[str, Any]) -> None:
    if "engines" in res:
        print_engines(res["engines"])
    if "families" in res:
        print_families(res["families"])
    if "dist" in res:
        print_dist(res["dist"])
    if "mamba2" in res:
        print_mamba2(res["mamba2"])
    for name in ("gdn", "kda"):
        if name not in res:
            continue
        r = res[name]
        s = r["shape"]
        rows = [["ours", r["ours"], r["ours_ms"], r["ours_gflops"]],
                ["peer", r["peer"], r["peer_ms"], r.get("peer_gflops")]]
        if name == "kda":
            rows.append(["ours GDN", "storelab.ops.gated_delta_rule (chunk)", r["ours_gdn_ms"], None])
        c = r["chunk"]
        console.print(table(f"{name}: B={s['B']} H={s['H']} K={s['K']} T={s['T']} fp32, {r['threads']} threads; "
                            f"chunks of {c['ours']} (ours, {r['flops'] / 1e9:.2f} GFLOP counted) and "
                            f"{c['peer']} (peer, {r['peer_flops'] / 1e9:.2f})",
                            ["", "function", "ms", "GFLOP/s"], rows))
        facts = [["speedup (peer / ours)", r["speedup"]], ["machine fp32 matmul GFLOP/s", r["matmul_gflops"]],
                 ["ours / matmul rate", r["fraction_of_matmul"]], ["max |ours - peer|", r["max_abs_diff"]]]
        if name == "kda":
            facts.append(["KDA / GDN time", r["kda_over_gdn"]])
        facts += [[f"target {k}", _ok(v)] for k, v in r["targets"].items()]
        console.print(table(None, ["figure", "value"], facts))
    if "decode" in res:
        r = res["decode"]
        cs = r["contexts"]
        rows = []
        for s in r["stores"]:
            if not s.get("available"):
                rows.append([s["store"], *[None] * len(cs), None, s.get("reason")])
                continue
            rows.append([s["store"] + " step", *[s["step_ms"][c] if c in s["step_ms"] else s["step_ms"][str(c)]
                                                 for c in cs], s["step_ratio"],
                         "; ".join(f"{k}: {_ok(v)}" for k, v in s["targets"].items() if "step" in k)])
            for part in ("indexer", "read", "read_cold"):
                if f"{part}_ms" in s:
                    d = s[f"{part}_ms"]
                    verdict = "; ".join(f"{k}: {_ok(v)}" for k, v in s["targets"].items() if k.startswith(part + "_"))
                    rows.append([f"  {part}", *[d[c] if c in d else d[str(c)] for c in cs], s[f"{part}_ratio"],
                                 verdict])
        console.print(table(f"decode: one token's step (ms, best of rounds), d_model {r['width']['d_model']}",
                            ["store", *[f"L={c:,}" for c in cs], f"ratio {cs[-1]:,}/{cs[0]:,}", "target"], rows))
    if "train" in res:
        print_train(res["train"])
    if "prefill" in res:
        r = res["prefill"]
        mem_rows, speed_rows = [], []
        for m in r["models"]:
            mem, spd = m.get("memory") or {}, m.get("speed") or {}
            peer = (spd.get("peer") or "").replace("transformers ", "")
            mem_rows.append([m["model"], _round(mem.get("analytic_mb"), 1), _round(mem.get("tensor_peak_mb"), 1),
                             _round(mem.get("tensor_ratio"), 3), _ok(mem.get("within_10pct")),
                             _round(mem.get("peak_above_weights_mb"), 1), _round(mem.get("ratio"), 3)])
            speed_rows.append([m["model"], _round(spd.get("ours_tok_s")), _round(spd.get("peer_tok_s")),
                               _round(spd.get("speedup"), 2), _ok(spd.get("target")), peer])
        mem_chunk = r.get("memory_chunk", r["chunk"])
        console.print(table(f"prefill memory at {r['length']:,} tokens (chunks of {mem_chunk}), MB above the "
                            "weights: the tensors' peak (the target) and the process's",
                            ["model", "cache", "tensors", "ratio", "<= 10%", "process", "ratio"], mem_rows))
        console.print(table(f"prefill speed at {r['speed_length']:,} tokens (chunks of {r['chunk']}), tokens/s",
                            ["model", "ours", "transformers", "speedup", ">= 1.5", "peer"], speed_rows))
        for m in failed(res):
            console.print(f"[red]prefill {m['model']} failed[/red]: {m['error']}")
    m = res["machine"]
    console.print(f"{res['date']}  {m['cpus']} CPUs, torch {m['torch']} with {m['torch_threads']} threads"
                  + ("  (--quick sizes: not figures)" if res.get("quick") else ""))


def failed(res: dict[str, Any]) -> list[dict[str, Any]]:
    """The prefill bench's models that failed on our side (not a missing peer)."""
    return [m for m in (res.get("prefill") or {}).get("models", []) if m.get("error")]


def register(app: typer.Typer) -> None:
    @app.command()
    def bench(
        which: str = typer.Argument("all", help="gdn, kda, mamba2, families, decode, prefill, train, dist, engines "
                                    "or all (all but mamba2, families, train, dist and engines)."),
        target: str = typer.Argument(None, metavar="[MODEL]", help="engines: a .gguf file or a real subject "
                                     "(smollm2-135m, gemma3-270m)."),
        quick: bool = typer.Option(False, "--quick", help="Tiny sizes: a smoke check in seconds, not figures."),
        repeats: int = opt.count(0, "--repeats", zero=True, help="Timed rounds (0: the bench's default)."),
        models: list[str] = typer.Option(None, "--model", help="prefill, train: zoo models to run "
                                         "(default: the seven)."),
        length: int = opt.count(0, "--length", zero=True, help="prefill: prompt length of the memory check "
                                "(0: 131,072; 4,096 with `all`)."),
        speed_length: int = opt.count(0, "--speed-length", zero=True, help="prefill: prompt length timed "
                                      "(0: 16,384; 4,096 with `all`)."),
        chunk: int = opt.count(0, "--chunk", zero=True, help="prefill: tokens per call of the speed run (0: 1,024)."),
        memory_chunk: int = opt.count(0, "--memory-chunk", zero=True, help="prefill: tokens per call of the memory "
                                      "run (0: 256)."),
        no_peer: bool = typer.Option(False, "--no-peer", help="prefill, engines: skip the peers (transformers, "
                                     "llama.cpp)."),
        threads: int = opt.count(0, "--threads", zero=True, help="torch threads (0: torch's default, one per core; "
                                 "engines: 1 and 2)."),
        f32: bool = typer.Option(False, "--f32", help="engines: every engine reads an fp32 copy of MODEL (made once "
                                 "under ~/.cache/storelab/bench), llama.cpp included: the same weights in all."),
        json_: bool = typer.Option(False, "--json", help="Print one JSON document."),
    ) -> None:
        """Time our ops, stores and models against transformers' in the same run; print ratios."""
        if which not in WHICH:
            opt.fail(f"which: must be one of {', '.join(WHICH)}, got {which!r}")
        if models:
            from storelab.zoo import zoo_names

            bad = [m for m in models if m not in zoo_names()]
            if bad:
                opt.fail(f"--model: unknown zoo model {bad[0]!r} (known: {', '.join(zoo_names())})")
        if which == "engines" and not target:
            opt.fail("engines: MODEL is needed (a .gguf file or a real subject: smollm2-135m, gemma3-270m)")
        if which != "engines" and target:
            opt.fail(f"MODEL: only `bench engines` takes one (got {target!r} for {which})")
        if f32 and which != "engines":
            opt.fail(f"--f32: only `bench engines` reads a GGUF (got {which})")
        engine_threads = (threads,) if threads else tuple(t for t in (1, 2) if t <= (os.cpu_count() or 1))
        if threads and which != "engines":
            import torch

            torch.set_num_threads(threads)
        from storelab.allocator import keep_freed_memory

        keep_freed_memory()  # both sides of every comparison run in this process, with the same allocator
        res = run_benches(which, quick=quick, repeats=repeats or None, models=models, length=length or None,
                          speed_length=speed_length or None, chunk=chunk or None, peer=not no_peer,
                          memory_chunk=memory_chunk or None, target=target, threads=engine_threads,
                          progress=None if json_ else (lambda msg: console.print(f"[dim]{msg}[/dim]")), f32=f32)
        if json_:
            emit_json(res)
        else:
            print_tables(res)
        if failed(res):
            raise typer.Exit(1)  # a model's own run failed: the figures are incomplete
