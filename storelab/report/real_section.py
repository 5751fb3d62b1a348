"""The report's section "On language models that learned": the essay's measurements on the real subjects.

The real subjects (``storelab.subjects.real``: SmolLM2-135M-Instruct, 30 full-attention layers; Gemma 3
270M, 15 window layers of 512 and 3 global layers) are language models trained elsewhere, read from
their GGUF files. On each, live:

1. **where the value goes** (``probes.group_swap``): prompt pairs that differ in one fact, asked at a
   distance from it (``probes.real_tasks.distance_pairs``, inside and beyond a 512-token window); the
   share of the answer's shift moved by swapping each store group (window caches, global caches,
   recurrent states: ``probes.store_groups``) and each layer, and retrieval with one group kept;
2. **sinks** and **the miss** (``probes.reads``): each head's share on the first token, what window
   heads do past their window, and the mass an exact top-k misses by k and context; with the task's
   accuracy when each global layer reads only its top-k (``probes.topk_reads``);
3. **interference** (``probes.interference``): retrieval as the dictionary grows, random against
   near-duplicate keys;
4. **feed-forward keys** (``probes.reads.ffn_keys``): the share of units whose top contexts share
   their last token, by layer, on the documents the package ships.

Sizes (``SIZES``) are stated in the section; ``quick`` and ``full`` (``ctx.full``, when the report's
command passes it) pick the smaller and larger ones. A figure whose check failed (the model does not do
the task above chance, or the swap moved nothing) is not printed; its reason is. Without the real
extra the section says so and how to install it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from storelab.outputs import atomic_path
from storelab.report.core import Claim, Context, SectionResult, Table

S = "language models that learned"
SIZES: dict[str, dict[str, Any]] = {
    "quick": {"distances": (32, 640), "pairs": 2, "seeds": (0,), "context": 768, "contexts": (256, 768),
              "ks": (64, 256), "sizes": (4, 16), "n": 4, "topk": (64,), "topk_pairs": 2, "layer_points": 1,
              "layer_pairs": 1},
    "default": {"distances": (32, 640), "pairs": 3, "seeds": (0,), "context": 1024,
                "contexts": (256, 1024), "ks": (64, 256, 512), "sizes": (4, 16, 64), "n": 4,
                "topk": (64,), "topk_pairs": 2, "layer_points": 2, "layer_pairs": 1},
    "full": {"distances": (32, 128, 384, 640, 1024), "pairs": 12, "seeds": (0, 1), "context": 4096,
             "contexts": (512, 1024, 2048, 4096), "ks": (64, 128, 256, 512, 1024, 2048),
             "sizes": (4, 16, 64, 256), "n": 24, "topk": (64, 256, 1024, 2048), "topk_pairs": 12,
             "layer_points": None, "layer_pairs": 4},
}
SINK_HEAD = 20   # percent of a head's attention on the first token for it to count as using the sink
ESSAY_MIMO = ("In MiMo, most of it went into the 10 global layers' caches, where every later token can reach it, "
              "and the 60 window layers kept only the last 128 tokens.")


def size_name(ctx: Context) -> str:
    return "full" if ctx.full else "quick" if ctx.quick else "default"


def _txt(share: dict | None, verdict: str = "not measured") -> str:
    return verdict if share is None else share["text"]


def open_subject(name: str):
    """(model, tokenizer, the subject's record) of an installed real subject."""
    import torch

    from storelab.checkpoint import load
    from storelab.subjects.real import real_subject
    from storelab.text import Tokenizer

    s = real_subject(name)
    path = s.path()
    torch.manual_seed(0)
    return load(path, dtype="fp32"), Tokenizer.load(path), s


def probe_subject(name: str, sz: dict[str, Any], docs: list[str]) -> dict[str, Any]:
    """Every probe of the section on one real subject; seconds per probe."""
    from storelab.probes.group_swap import group_swap
    from storelab.probes.interference import retrieval_curve
    from storelab.probes.real_tasks import VALUE_CHANCE, distance_pairs
    from storelab.probes.reads import attention_reads
    from storelab.probes.store_groups import groups_of
    from storelab.probes.topk_reads import topk_accuracy

    t0 = time.perf_counter()
    model, tok, subj = open_subject(name)
    out: dict[str, Any] = {"subject": subj.title, "source": subj.source, "format": subj.fmt,
                           "layers": model.cfg.n_layers, "groups": groups_of(model), "seconds": {}}
    out["seconds"]["load"] = time.perf_counter() - t0

    def count(s: str) -> int:
        return len(tok.encode(s, special=False))

    recs = [r for seed in sz["seeds"] for d in sz["distances"]
            for r in distance_pairs(sz["pairs"], distance=d, count=count, seed=seed)]
    for key, run in (
            ("swap", lambda: group_swap(model, tok, recs, by="asked_distance", chance=VALUE_CHANCE,
                                        layer_points=sz["layer_points"], layer_pairs=sz["layer_pairs"])),
            ("reads", lambda: attention_reads(model, [tok.encode(t) for t in docs], context=sz["context"],
                                              contexts=sz["contexts"], ks=sz["ks"])),
            ("topk", lambda: topk_accuracy(model, tok, [r for r in recs if r["asked_distance"] == max(sz["distances"])]
                                           [:sz["topk_pairs"]], ks=sz["topk"], chance=VALUE_CHANCE,
                                           by="asked_distance")),
            ("interference", lambda: retrieval_curve(model, tok, sizes=sz["sizes"], n=sz["n"], seeds=sz["seeds"]))):
        t = time.perf_counter()
        out[key] = run()
        out["seconds"][key] = time.perf_counter() - t
    return out


# -- tables -------------------------------------------------------------------------------------
def swap_rows(p: dict) -> list[list]:
    rows = []
    for d, pt in p["swap"]["points"].items():
        for g, x in pt["groups"].items():
            if not x["applies"]:
                rows.append([d, f"{pt['tokens']:.0f}", _txt(pt["accuracy"]), g, x["why"], x["why"]])
                continue
            v = pt["valid"]
            rows.append([d, f"{pt['tokens']:.0f}", _txt(pt["accuracy"]), f"{x['words']} ({len(x['layers'])})",
                         _txt(x["swap_share"]) if v else pt["reason"], _txt(x["keep_retrieval"]) if v else "not measured"])
    return rows


def layer_rows(p: dict) -> list[list]:
    out = []
    for d, pt in p["swap"]["points"].items():
        if not pt.get("layers"):
            continue
        top = sorted(pt["layers"], key=lambda r: -(r["swap_share"] or {"percent": 0})["percent"])[:4]
        said = "; ".join(f"layer {r['layer']} ({r['group']}): {_txt(r['swap_share'])}" for r in top
                         if r["swap_share"]) or "not measured (the swept prompts' check failed)"
        out.append([d, pt["layer_prompts"], said])
    return out


def sink_rows(p: dict) -> list[list]:
    rows = []
    for r in p["reads"]["layers"]:
        past = r.get("past_window")
        rows.append([r["layer"], r["group"], r["window_tokens"] or "", r["first_token_share"]["text"],
                     past["oldest_entry_share"]["text"] if past else "", past["own_entry_share"]["text"] if past else "",
                     f"{past['uniform_percent']:.2f} %" if past else ""])
    return rows


def miss_rows(p: dict) -> list[list]:
    by: dict[tuple[int, int], list[float]] = {}
    for m in p["reads"]["miss"]:
        by.setdefault((m["context"], m["k"]), []).append(m["mass_missed"]["percent"])
    return [[c, k, f"{sum(v) / len(v):.1f} %", f"{min(v):.1f} %", f"{max(v):.1f} %", len(v)]
            for (c, k), v in sorted(by.items())]


def topk_rows(p: dict) -> list[list]:
    t = p["topk"]
    if not t["applies"]:
        return [["", "no global (full-attention) layers", "", ""]]
    return [[d, f"{pt['tokens']:.0f}", _txt(pt["full"]),
             "; ".join(f"k={k}: {_txt(v, pt['reason'])}" for k, v in pt["topk"].items())]
            for d, pt in t["points"].items()]


def interference_rows(p: dict) -> list[list]:
    return [[r["keys"], r["entries"], f"{r['tokens']:.0f}", _txt(r["accuracy"]), "" if r["valid"] else r["reason"]]
            for r in p["interference"]["points"]]


def ffn_rows(p: dict) -> list[list]:
    f = p["reads"].get("ffn_keys")
    if not f:
        return []
    return [[r["layer"], r["units"], r["shared_last_token"]["text"], r["chance"]["text"]] for r in f["layers"]]


# -- figures ------------------------------------------------------------------------------------
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _colours() -> dict[str, str]:
    from storelab.probes.store_groups import CHUNK, GLOBAL, LATENT, RECURRENT, SELECTED, WINDOW

    return {WINDOW: "tab:green", GLOBAL: "tab:blue", RECURRENT: "tab:orange", LATENT: "tab:purple",
            SELECTED: "tab:red", CHUNK: "tab:olive"}


def _save(fig, path: Path) -> Path:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100)
    _plt().close(fig)
    return path


def figures(out: Path, probes: dict[str, dict]) -> list[Path]:
    plt = _plt()
    names = list(probes)
    paths = []
    # 1. per-layer shares of the shift, coloured by store group, at each distance measured
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 3.4), squeeze=False)
    for ax, n in zip(axes[0], names):
        pts = [(d, pt) for d, pt in probes[n]["swap"]["points"].items()
               if pt.get("layers") and any(r["swap_share"] for r in pt["layers"])]
        if not pts:
            ax.text(0.5, 0.5, "nothing measured (check failed)", ha="center", transform=ax.transAxes)
        width = 0.8 / max(1, len(pts))
        for j, (d, pt) in enumerate(pts):
            xs = [r["layer"] + j * width for r in pt["layers"]]
            ys = [(r["swap_share"] or {"percent": 0})["percent"] for r in pt["layers"]]
            ax.bar(xs, ys, width=width, color=[_colours().get(r["group"], "grey") for r in pt["layers"]],
                   alpha=0.4 + 0.6 * (j + 1) / len(pts), edgecolor="black", linewidth=0.3)
        ax.set_title(f"{probes[n]['subject']}: shift moved per layer (distances {', '.join(d for d, _ in pts)})",
                     fontsize=8)
        ax.set_xlabel("layer (colour: store group; darker: farther fact)")
        ax.set_ylabel("% of the answer's shift")
        for g in probes[n]["groups"]:
            ax.bar([], [], color=_colours().get(g, "grey"), label=g)
        ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(_save(fig, out / "real_layers.png"))
    # 2. sink share per head, by layer
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 3.4), squeeze=False)
    for ax, n in zip(axes[0], names):
        for r in probes[n]["reads"]["layers"]:
            hs = r["first_token_share_per_head"]
            ax.scatter([r["layer"]] * len(hs), hs, s=12, color=_colours().get(r["group"], "grey"))
            if r.get("past_window"):
                ax.scatter([r["layer"]] * len(hs), r["past_window"]["oldest_entry_share_per_head"], s=12,
                           marker="x", color="tab:red")
        ax.set_title(f"{probes[n]['subject']}: share on the first token per head "
                     "(x: window heads past their window, on their oldest entry)", fontsize=8)
        ax.set_xlabel("layer")
        ax.set_ylabel("% of attention")
    fig.tight_layout()
    paths.append(_save(fig, out / "real_sinks.png"))
    # 3. mass missed against k, one line per context
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 3.4), squeeze=False)
    for ax, n in zip(axes[0], names):
        rows = miss_rows(probes[n])
        for c in sorted({r[0] for r in rows}):
            sel = [r for r in rows if r[0] == c]
            ax.plot([r[1] for r in sel], [float(r[2][:-2]) for r in sel], marker="o", label=f"context {c}")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{probes[n]['subject']}: attention mass an exact top-k misses (mean over global layers)",
                     fontsize=8)
        ax.set_xlabel("k")
        ax.set_ylabel("% of attention missed")
        if rows:
            ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(_save(fig, out / "real_miss.png"))
    # 4. accuracy against dictionary size
    fig, axes = plt.subplots(1, len(names), figsize=(6 * len(names), 3.4), squeeze=False)
    for ax, n in zip(axes[0], names):
        pts = probes[n]["interference"]["points"]
        for kind, colour in (("random", "tab:blue"), ("near", "tab:red")):
            sel = [r for r in pts if r["keys"] == kind and r["accuracy"]]
            if not sel or not sel[0]["valid"]:   # the smallest dictionary must be done for a curve to mean anything
                continue
            m = [r["accuracy"]["percent"] for r in sel]
            err = [[x - r["accuracy"]["interval"][0] for x, r in zip(m, sel)],
                   [r["accuracy"]["interval"][1] - x for x, r in zip(m, sel)]]
            ax.errorbar([r["entries"] for r in sel], m, yerr=err, marker="o", capsize=3, color=colour,
                        label=f"{kind} keys")
        ax.axhline(100 * probes[n]["interference"]["chance"]["percent"] / 100, color="grey", ls="--", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("entries in the dictionary")
        ax.set_ylabel("% retrieved")
        ax.set_title(f"{probes[n]['subject']}: retrieval as the dictionary grows", fontsize=8)
        ax.legend(fontsize=7)
    fig.tight_layout()
    paths.append(_save(fig, out / "real_interference.png"))
    return paths


# -- claims -------------------------------------------------------------------------------------
def _far_near(p: dict) -> tuple[dict | None, dict | None]:
    pts = [pt for pt in p["swap"]["points"].values() if pt["valid"]]
    return (pts[0], pts[-1]) if pts else (None, None)


def claims(probes: dict[str, dict]) -> list[Claim]:
    out = []
    for n, p in probes.items():
        near, far = _far_near(p)
        from storelab.probes.store_groups import GLOBAL, WINDOW

        g = p["groups"]
        if WINDOW in g and GLOBAL in g:
            if far is None:
                out.append(Claim(f"{S}: {p['subject']}", ESSAY_MIMO, "global layers carry what is past the window",
                                 None, reason="not measured: no distance's check passed", status="not measured"))
            else:
                sg, sw = far["groups"][GLOBAL]["swap_share"], far["groups"][WINDOW]["swap_share"]
                said = (f"at the farthest distance measured ({far['tokens']:.0f} tokens) the {len(g[GLOBAL])} global "
                        f"layers moved {sg['text']} of the answer's shift, the {len(g[WINDOW])} window layers "
                        f"{sw['text']}")
                res = "global layers carry what is past the window" if sg["percent"] > sw["percent"] else "window layers"
                out.append(Claim(f"{S}: {p['subject']}", ESSAY_MIMO, "global layers carry what is past the window",
                                 res, reason=said))
        else:
            out.append(Claim(f"{S}: {p['subject']}", ESSAY_MIMO, "global layers carry what is past the window", None,
                             reason=f"does not apply: no window layers (every layer of {p['subject']} is global)"))
        sinks = [r["first_token_share"]["percent"] for r in p["reads"]["layers"]]
        heavy = sum(x >= SINK_HEAD for r in p["reads"]["layers"] for x in r["first_token_share_per_head"])
        heads = sum(len(r["first_token_share_per_head"]) for r in p["reads"]["layers"])
        out.append(Claim(f"{S}: {p['subject']}", "the first block holds the attention sink that many heads use as a "
                         "default", "many heads", f"{heavy} of {heads} heads put {SINK_HEAD} % or more of their "
                         "attention on the first token",
                         reason=f"mean over layers {sum(sinks) / len(sinks):.0f} % on the first token (a uniform read "
                         f"of {p['reads']['tokens']} tokens would give under 1 %); a head counts at {SINK_HEAD} % or more",
                         status="reproduced" if heavy >= heads / 4 else "differs"))
        f = p["reads"].get("ffn_keys")
        if f and f["overall"]:
            out.append(Claim(f"{S}: {p['subject']}", "65 to 80 percent of a key's top inputs share a pattern (Geva et "
                             "al.; shallow ones such as a common last word in lower layers)", "65-80 %",
                             f["overall"]["text"], reason="units whose top 10 contexts on the shipped documents mostly "
                             "end in one token; only the last-word pattern is counted (a lower bound on any pattern)",
                             status="not checkable"))
    return out


def not_installed(missing: list[str], why: dict[str, str]) -> SectionResult:
    from storelab.subjects.real import INSTALL

    return SectionResult(
        text=(f"The real subjects are not installed here ({'; '.join(f'{n}: {why[n]}' for n in missing)}), so this "
              f"section measured nothing. Install them with {INSTALL}; nothing is downloaded at run time."),
        data={"installed": False, "missing": missing, "install": INSTALL})


def real_section(ctx: Context) -> SectionResult:
    from storelab.probes.prompts import shipped
    from storelab.subjects.real import REAL, SubjectError

    name = size_name(ctx)
    sz = SIZES[name]
    why: dict[str, str] = {}
    for s in REAL:
        try:
            s.path()
        except SubjectError as e:
            why[s.name] = str(e)
    if why:
        return not_installed(list(why), why)
    docs = [r["text"] for r in shipped("document")]
    t0 = time.perf_counter()
    probes = {s.name: probe_subject(s.name, sz, docs) for s in REAL}
    seconds = time.perf_counter() - t0
    figs = figures(ctx.out, probes)
    tables = []
    for n, p in probes.items():
        t = p["subject"]
        tables += [
            Table(f"{t}: the answer's shift moved by each store group, and retrieval with that group alone, by the "
                  "fact's distance (tokens before the question; % [95 % interval over prompts])",
                  ["asked distance", "prompt tokens", "clean answers right", "group (layers)", "shift moved",
                   "retrieval with this group only"], swap_rows(p)),
            Table(f"{t}: the layers that carry the value (largest shares of the shift, one layer swapped)",
                  ["asked distance", "prompts swept", "layers"], layer_rows(p) or [["", 0, "no layer sweep ran"]]),
            Table(f"{t}: attention sinks (share on the first token, mean over heads [2.5th, 97.5th percentile of "
                  "heads]); window heads past their window: share on their oldest entry and on their own",
                  ["layer", "group", "window (tokens)", "on the first token", "past the window: oldest entry", "own entry",
                   "uniform"], sink_rows(p)),
            Table(f"{t}: attention mass an exact top-k misses, mean over the global layers' heads (min, max over "
                  "layers)", ["context", "k", "mass missed", "lowest layer", "highest layer", "layers"], miss_rows(p)),
            Table(f"{t}: the task's accuracy when each global layer reads only its top k",
                  ["asked distance", "prompt tokens", "full attention", "top-k only"], topk_rows(p)),
            Table(f"{t}: retrieval as the dictionary grows (list form; chance 11 %)",
                  ["keys", "entries", "prompt tokens", "retrieved", "check"], interference_rows(p)),
            Table(f"{t}: feed-forward keys whose top 10 contexts mostly share their last token (by layer; chance: "
                  "the same count for random positions)", ["layer", "units", "shared last token", "chance"],
                  ffn_rows(p)),
        ]
    said = ", ".join(f"{k} = {v}" for k, v in sz.items())
    which = ", ".join(f"{p['subject']} ({p['format']})" for p in probes.values())
    took = "; ".join(p["subject"] + ": " + ", ".join(f"{k} {v:.0f} s" for k, v in p["seconds"].items())
                     for p in probes.values())
    text = (f"Two language models trained elsewhere, read from their GGUF files ({which}). "
            f"Sizes ({name}): {said}. Section time {seconds:.0f} s ({took}). "
            "Prompts are list dictionaries of pseudo-word keys and two-digit values; the question asks a key at a "
            "chosen distance from its entry, and the scored token is the value's first digit (chance 1 in 9). A share "
            "is printed only where the model answers the clean prompts above chance by 20 points and the swap "
            "moves the answer by at least one nat; elsewhere the reason is printed instead.")
    return SectionResult(text=text, tables=tables, figures=figs, claims=claims(probes),
                         data={"installed": True, "sizes": name, "settings": {k: list(v) if isinstance(v, tuple) else v
                                                                              for k, v in sz.items()},
                               "seconds": seconds, "probes": probes})
