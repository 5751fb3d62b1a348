"""Trained subjects: small models that learned the dictionary task, shipped for the probes (issue 29).

The report's sections 7 and 8 probe what a trained hybrid keeps in its recurrent states and in its
attention caches. A probe of a model that did not learn measures nothing (``storelab.probes.validity``),
so the models it reads are trained here, by storelab's own trainer, until they do the task on held-out
prompts, and ship as package data beside their recipes:

==================  =========  ===================================================================
subject             layers     what it is for
==================  =========  ===================================================================
``kda-hybrid``      K K K A    Kimi's 3:1 KDA:attention layout (arXiv 2510.26692)
``gdn-hybrid``      G G G A    Qwen's 3:1 Gated DeltaNet:attention layout (arXiv 2412.06464)
``attention``       W A A A    control: only caches, which hold every entry (W: a two-token window)
``recurrent``       K K K K    control: only states, which cannot hold n >> d entries
``kda-small``       K K K A    the hybrid trained on small dictionaries only (item 4's control)
==================  =========  ===================================================================

Every subject has the same width: d_model 64, 4 heads of d = 8 (``HEAD_DIM``: a recurrent head's state
is d x d and holds about d associations, arXiv 2102.11174), SwiGLU 128, the plain residual. The task
is the dictionary-and-language task (``storelab.tasks.dictionary``; after Afendulev et al., arXiv
2609.04434) with 40 keys and values and 4 languages. The first four train on one mixture of sizes
(``MIXTURE``): a quarter of the prompts hold 1 to 4 entries (d/8 to d/2, far below what a state
holds), 15 % hold 5 to 15, and 60 % hold 16 to 32 (2 d to 4 d, far above it); ``kda-small`` trains on
1 to 4 entries only. Three seeds each (``SEEDS``). A seed that does not pass its recipe's bar (``PASS`` at
every size of ``must_learn``) ships too, marked ("learned": false, with its verdict), and the recipe adds the next
seed (``Recipe.seeds``): the report probes the seeds that learned and names the others. So it went for the two
3:1 hybrids: KDA seed 1 settled on a lookup through its recurrent states, capped by their capacity (0.36 retrieval
at 32 entries after 8,000 steps), and Gated DeltaNet seed 0 reached 0.89 at 32 entries (0.97 at 16). The
one-head recurrent control fails far above d in every seed (0.07 to 0.28 at 32 entries), as it must, but learned
the small dictionaries in only 1 of its 4 seeds within 5,000 steps (the others stall at 0.35 to 0.87 on 2 to 4
entries). A four-head KDA stack, tried first, did not fail at 4 d (0.78 at 32 entries): its heads' reads add up to
about H d associations a layer, so the control has one head a layer.

Files, in ``storelab/subjects/data``: ``<name>-seed<k>.safetensors`` (the weights, fp32, with the
model and task configs in its metadata) and ``<name>-seed<k>.json`` (the recipe: the training config,
the command that re-creates it, steps, wall time, torch version, and the held-out figures at every
probed size). ``storelab subjects train`` re-creates them (``--all``: every subject and seed);
``storelab report --retrain`` trains them afresh into the report's folder and probes those instead.
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

DATA = Path(__file__).parent / "data"
SEEDS = (0, 1, 2)
HEAD_DIM = 8
N_SYMBOLS = 40          # keys, and values: 32 entries at most, and spare values for the swap
SIZES = (1, 2, 4, 8, 16, 32)   # the sizes every subject is scored and probed at: d/8 to 4 d
MIXTURE = ((0.25, 1, 4), (0.15, 5, 15), (0.6, 16, 32))
SMALL = ((1.0, 1, 4),)
FORMAT = "storelab-subject-1"
# what a subject must do on held-out prompts to ship (issue 29): retrieval and compliance, each
PASS = 0.9


@dataclass(frozen=True)
class Recipe:
    name: str
    pattern: str            # one letter per layer (storelab.train.models.LETTERS)
    about: str
    mix: tuple              # the training mixture of sizes: ((share, fewest, most), ...)
    steps: int
    lr: float = 3e-3
    batch_size: int = 32
    warmup: int = 100
    must_learn: tuple = SIZES   # the sizes where retrieval must reach PASS; the others are reported only
    options: tuple = ()         # further model options, as (name, value) pairs (a window's width)
    seeds: tuple = SEEDS        # the seeds that ship (a seed that did not learn ships too, marked, and another is added)

    @property
    def pairs(self) -> tuple[int, int]:
        return min(p[1] for p in self.mix), max(p[2] for p in self.mix)


RECIPES: dict[str, Recipe] = {r.name: r for r in (
    Recipe("kda-hybrid", "KKKA", "3:1 KDA:attention (Kimi Linear, Kimi K3)", MIXTURE, steps=8000,
           seeds=(0, 1, 2, 3)),
    Recipe("gdn-hybrid", "GGGA", "3:1 Gated DeltaNet:attention (Qwen3.5, Qwen3.8)", MIXTURE, steps=8000,
           seeds=(0, 1, 2, 3)),
    Recipe("attention", "WAAA", "attention only: a two-token window (the previous token, which the hybrids' short "
           "convolutions give them) then three full-attention layers; the caches hold every entry", MIXTURE,
           steps=5000, options=(("window", 2),)),
    Recipe("recurrent", "KKKK", "KDA only, one head of d = 8 a layer (its state: four 8 x 8 matrices), no cache; "
           "must fail at n >> d", MIXTURE, steps=5000, must_learn=(1, 2, 4), options=(("n_heads", 1),),
           seeds=(0, 1, 2, 3)),
    Recipe("kda-small", "KKKA", "the 3:1 KDA hybrid trained on 1 to 4 entries only (the capacity control)",
           SMALL, steps=3000, must_learn=(1, 2, 4)),
)}


def recipe(name: str) -> Recipe:
    if name not in RECIPES:
        raise ValueError(f"subject: no subject {name!r} (known: {', '.join(RECIPES)})")
    return RECIPES[name]


def check_seed(seed: int, name: str | None = None) -> int:
    seeds = recipe(name).seeds if name is not None else SEEDS
    if seed not in seeds:
        raise ValueError(f"seed: {name or 'the subjects'} ship{'s' if name else ''} seeds "
                         f"{', '.join(map(str, seeds))}; got {seed}")
    return seed


def task_options(r: Recipe) -> dict[str, Any]:
    lo, hi = r.pairs
    return dict(n_languages=4, n_keys=N_SYMBOLS, n_values=N_SYMBOLS, pairs_min=lo, pairs_max=hi, n_queries=4,
                queries_repeat=True, pairs_mix=[list(p) for p in r.mix])


def train_config(name: str, seed: int, *, threads: int = 1):
    """The exact ``TrainConfig`` of a subject (what its recipe file records)."""
    from storelab.train.loop import TrainConfig

    r = recipe(name)
    return TrainConfig(model=f"pattern:{r.pattern}",
                       model_options={**dict(d_model=64, n_heads=4, head_dim=HEAD_DIM, d_ff=128), **dict(r.options)},
                       task="dictionary", task_preset="small", task_options=task_options(r),
                       steps=r.steps, batch_size=r.batch_size, lr=r.lr, warmup=r.warmup, seed=seed,
                       eval_every=max(1, r.steps // 4), eval_examples=256, checkpoint_every=r.steps,
                       log_every=50, threads=threads)


def sized(task, n: int):
    """The subject's task with exactly ``n`` entries a prompt (one vocabulary and language mapping for all)."""
    from storelab.tasks import make_task, task_dict

    d = task_dict(task)
    d.pop("name")
    d.update(pairs_min=n, pairs_max=n, pairs_mix=[], pairs_dist="uniform", n_queries=min(d["n_queries"], n),
             queries_repeat=False, vocab_size=0)
    return make_task("dictionary", **d)


def score_sizes(model, task, *, n: int = 256, seed: int = 0, sizes: tuple[int, ...] = SIZES) -> dict[str, dict]:
    """Held-out retrieval and compliance at each size (the eval split's prompts, drawn apart from training's)."""
    from storelab.train.loop import evaluate

    out = {}
    for k in sizes:
        ev = evaluate(model, sized(task, k), seed, n, split="eval")
        out[str(k)] = {"retrieval": round(ev["retrieval"], 4), "compliance": round(ev["compliance"], 4)}
    return out


def learned(meta: dict) -> tuple[bool, str]:
    """Whether a subject does its task: retrieval and compliance >= PASS at every size its recipe requires."""
    r = recipe(meta["name"])
    bad = [f"{k} entries: retrieval {s['retrieval']:.3f}, compliance {s['compliance']:.3f}"
           for k, s in meta["held_out"].items() if int(k) in r.must_learn
           and min(s["retrieval"], s["compliance"]) < PASS]
    return (not bad), ("learned" if not bad else f"below {PASS} at " + "; ".join(bad))


def command(name: str, seed: int) -> str:
    return f"storelab subjects train {name} --seed {seed}"


def train_command(name: str, seed: int) -> str:
    """The same run through ``storelab train`` (into a run folder; the weights are the same, the evaluations
    use their own prompts and draw nothing from the training's random stream)."""
    import shlex

    c = train_config(name, seed)
    opts = [f"--model-opt {k}={json.dumps(v)}" for k, v in c.model_options.items()]
    opts += [f"--task-opt {shlex.quote(k + '=' + json.dumps(v, separators=(',', ':')))}"
             for k, v in c.task_options.items()]
    return (f"storelab train --model {c.model} --task {c.task} --size {c.task_preset} {' '.join(opts)} "
            f"--steps {c.steps} --batch-size {c.batch_size} --lr {c.lr} --warmup {c.warmup} --seed {c.seed} "
            f"--threads {c.threads} --out runs/{name}-seed{seed}")


def paths(name: str, seed: int, folder: str | Path = DATA) -> tuple[Path, Path]:
    stem = Path(folder) / f"{name}-seed{seed}"
    return stem.with_suffix(".safetensors"), stem.with_suffix(".json")


def train_subject(name: str, seed: int, folder: str | Path = DATA, *, threads: int = 1,
                  progress: bool = False) -> dict[str, Any]:
    """Train one subject by its recipe and write its weights and recipe file into ``folder`` (atomically)."""
    from safetensors.torch import save_file

    from storelab.outputs import atomic_path, atomic_write
    from storelab.tasks import task_dict
    from storelab.train.loop import train

    check_seed(seed, name)
    cfg = train_config(name, seed, threads=threads)
    t0 = time.time()
    r = train(cfg, None, resume=False, progress=progress)
    seconds = time.time() - t0
    model = r.model.eval()
    meta = {"format": FORMAT, "name": name, "seed": seed, "about": recipe(name).about,
            "command": command(name, seed), "train_command": train_command(name, seed),
            "train_config": cfg.to_dict(),
            "model_config": r.model_config.to_dict(), "task": task_dict(r.task),
            "steps": r.step, "seconds": round(seconds, 1), "threads": threads, "final_loss": r.final_loss,
            "torch": torch.__version__, "machine": platform.machine(),
            "params": sum(p.numel() for p in model.parameters()),
            "held_out": score_sizes(model, r.task, seed=seed),
            "history": [h for h in r.history if any(k.startswith("eval_") for k in h)]}
    ok, why = learned(meta)
    meta["learned"], meta["verdict"] = ok, why
    weights, recipe_file = paths(name, seed, folder)
    Path(folder).mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}
    with atomic_path(weights) as tmp:
        save_file(state, str(tmp), metadata={"format": FORMAT, "name": name, "seed": str(seed)})
    atomic_write(recipe_file, json.dumps(meta, indent=1) + "\n")
    return meta


def _train_one(args: tuple[str, int, str]) -> dict:
    name, seed, folder = args
    return train_subject(name, seed, folder, threads=1)


def train_many(jobs: list[tuple[str, int]], folder: Path, *, workers: int, say=None) -> list[dict]:
    """Train ``jobs`` (name, seed), ``workers`` processes at a time (one thread each), then index the folder."""
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor, as_completed

    folder.mkdir(parents=True, exist_ok=True)
    done = []
    if workers <= 1:
        for j in jobs:
            done.append(_train_one((*j, str(folder))))
            write_index(folder)
            if say:
                say(done[-1])
        return done
    with ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn")) as ex:
        futs = [ex.submit(_train_one, (*j, str(folder))) for j in jobs]
        for f in as_completed(futs):
            done.append(f.result())
            write_index(folder)
            if say:
                say(done[-1])
    return done


def read_meta(name: str, seed: int, folder: str | Path = DATA) -> dict[str, Any]:
    weights, recipe_file = paths(name, check_seed(seed, name), folder)
    if not recipe_file.is_file() or not weights.is_file():
        raise FileNotFoundError(f"subject: {name} seed {seed} is not in {folder} (missing "
                                f"{recipe_file.name if not recipe_file.is_file() else weights.name}); "
                                f"`{command(name, seed)}` re-creates it")
    try:
        meta = json.loads(recipe_file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"subject: {recipe_file} cannot be read as JSON ({e})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("name") != name:
        raise ValueError(f"subject: {recipe_file} is not a {FORMAT} recipe of {name!r}")
    return meta


def load_subject(name: str, seed: int = 0, folder: str | Path = DATA):
    """(model in eval mode, its task, its recipe) of a shipped (or retrained) subject."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    from storelab.models.config import ModelConfig
    from storelab.models.model import Model
    from storelab.tasks import make_task

    recipe(name)
    meta = read_meta(name, seed, folder)
    weights, _ = paths(name, seed, folder)
    model = Model(ModelConfig.from_dict(meta["model_config"], source=str(weights)))
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError) as e:
        raise ValueError(f"subject: {weights} cannot be read as safetensors ({e})") from None
    missing = sorted(set(model.state_dict()) - set(state))
    extra = sorted(set(state) - set(model.state_dict()))
    if missing or extra:
        raise ValueError(f"subject: {weights} does not match its recipe's model "
                         f"({'missing ' + missing[0] if missing else 'unexpected ' + extra[0]})")
    model.load_state_dict(state)
    t = dict(meta["task"])
    return model.eval(), make_task(t.pop("name"), **t), meta


def shipped(folder: str | Path = DATA) -> list[tuple[str, int]]:
    """The (name, seed) pairs present in ``folder``, in the recipes' order."""
    return [(n, s) for n, r in RECIPES.items() for s in r.seeds if all(p.is_file() for p in paths(n, s, folder))]


def every() -> list[tuple[str, int]]:
    """Every (name, seed) the recipes ship."""
    return [(n, s) for n, r in RECIPES.items() for s in r.seeds]


FILES = ("subjects.json", "*-seed*.safetensors", "*-seed*.json")   # what a subjects folder holds


def write_index(folder: str | Path = DATA) -> Path:
    """``subjects.json``: the index of the subjects in ``folder`` (rebuilt from their recipe files; it marks
    the folder as a subjects folder, ``storelab.outputs``)."""
    from storelab.outputs import atomic_write

    return atomic_write(Path(folder) / "subjects.json",
                        json.dumps({"format": FORMAT, "subjects": summary(folder)}, indent=1) + "\n")


def check_index(folder: str | Path) -> None:
    """A ValueError naming ``folder/subjects.json`` when it is there but is not an index this module wrote
    (not JSON, another format, no list of subjects): a damaged index is not "no subjects"."""
    p = Path(folder) / "subjects.json"
    if not p.exists():
        return
    try:
        d = json.loads(p.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"{p}: not a subjects index (unreadable JSON: {str(e)[:80]})") from None
    if not isinstance(d, dict) or d.get("format") != FORMAT or not isinstance(d.get("subjects"), list):
        raise ValueError(f"{p}: not a subjects index (expected {{\"format\": \"{FORMAT}\", \"subjects\": "
                         f"[...]}}, as storelab subjects train writes it)")


def summary(folder: str | Path = DATA) -> list[dict[str, Any]]:
    """One row per subject and seed: its recipe's figures (what ``storelab subjects`` prints); a damaged
    ``subjects.json`` is a ValueError naming it (``check_index``)."""
    check_index(folder)
    rows = []
    for n, s in shipped(folder):
        m = read_meta(n, s, folder)
        rows.append({"name": n, "seed": s, "layers": recipe(n).pattern, "steps": m["steps"], "seconds": m["seconds"],
                     "params": m["params"], "learned": m["learned"], "verdict": m["verdict"],
                     "held_out": m["held_out"]})
    return rows


__all__ = ["train_many", "DATA", "SEEDS", "SIZES", "RECIPES", "Recipe", "recipe", "train_config", "train_subject", "load_subject",
           "read_meta", "shipped", "summary", "sized", "score_sizes", "learned", "check_index"]
