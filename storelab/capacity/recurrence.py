"""Affine recurrences, their scan, and parity (essay section 6): experiment 11.

* Composition: (A2, b2) o (A1, b1) = (A2 A1, A2 b1 + b2) is associative, so L updates
  combine in ceil(log2 L) rounds (storelab.ops.scan.affine_scan) and equal the sequential
  recurrence S_t = A_t S_{t-1} + b_t.
* Gated DeltaNet (Yang, Kautz and Hatamizadeh, arXiv 2412.06464): the transition
  alpha (I - beta k k^T) with unit k has eigenvalues alpha (d-1 times) and alpha (1 - beta):
  in [0, alpha] for beta in [0, 1], down to -alpha for beta in [0, 2] (Grazzi et al., arXiv
  2411.12537; Olmo Hybrid, arXiv 2604.03444).
* Parity by construction, one layer, a 2 x 2 state (state layout S [K, V] as in storelab.ops.delta):
  a first token writes S_0 = e1 e1^T (beta = 1, k = v = e1); then bit x_t writes k = e1,
  v = 0, beta = 2 x_t, so S_t = (I - 2 x_t e1 e1^T) S_{t-1} flips the sign of the read
  e1^T S_t e1 = (-1)^(x_1 + ... + x_t). With beta in [0, 1] the same read is
  (1 - beta)^(number of ones) >= 0, a non-increasing function of the count: any threshold
  on it separates small counts from large ones, never even from odd.
* Parity by training, every recurrent kind: a one-layer model (token mixer, SwiGLU, residual) per store
  table, trained on running parity of 2..16 bits and read at every position of 64-bit strings. Each
  recurrent config in the registry says which tables it brings at a width (``parity_stores(d_model,
  n_heads, head_dim)``: the delta rules twice, beta up to 1 and up to 2; Mamba, Mamba-2 and RG-LRU at the
  delta rules' state size) and what its transition is (``transition()``), from which the prediction
  follows: a diagonal recurrence with decays in (0, 1] (Mamba, Mamba-2, RG-LRU, GLA, linear attention) is
  in TC0 (Merrill, Petty and Sabharwal, arXiv 2404.08819) and no transition with eigenvalues all >= 0
  tracks parity at every length, while one whose eigenvalues reach -1 (beta up to 2) can (Grazzi et al.,
  arXiv 2411.12537); a negative eigenvalue short of -1 (1 < beta_max < 2) leaves it open. The rows print
  the accuracy at trained lengths (positions 4..15: the prefix is longer than a width-4 convolution sees)
  and past them (positions 32..63) beside that prediction; the report marks a run whose accuracy at
  trained lengths is not above chance as not learned. ``--quick`` trains a few steps, to show the rows:
  no model learns there, and they are not findings.
  A new kind joins by declaring both; ``exp_parity_trained(stores=[...])`` runs any list of tables.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor

from storelab.capacity.common import Curve, Result, gen, row, unit_rows
from storelab.ops.scan import affine_compose, affine_scan
from storelab.stores.base import Transition


def associativity_error(d: int, seed: int) -> float:
    compose = affine_compose
    g = gen(seed)
    A = torch.randn(3, d, d, generator=g, dtype=torch.float64) / math.sqrt(d)
    b = torch.randn(3, d, 2, generator=g, dtype=torch.float64)
    left = compose(*compose(A[2], b[2], A[1], b[1]), A[0], b[0])
    right = compose(A[2], b[2], *compose(A[1], b[1], A[0], b[0]))
    return max(float((left[0] - right[0]).abs().max()), float((left[1] - right[1]).abs().max()))


def gated_delta_transitions(L: int, d: int, g: torch.Generator, beta_max: float = 1.0) -> tuple[Tensor, Tensor]:
    """L random Gated DeltaNet updates: A_t = alpha_t (I - beta_t k k^T), b_t = beta_t k v^T."""
    k = unit_rows(L, d, g, torch.float64)
    v = torch.randn(L, d, generator=g, dtype=torch.float64)
    alpha = torch.rand(L, generator=g, dtype=torch.float64)
    beta = beta_max * torch.rand(L, generator=g, dtype=torch.float64)
    eye = torch.eye(d, dtype=torch.float64)
    A = alpha[:, None, None] * (eye - beta[:, None, None] * k[:, :, None] * k[:, None, :])
    return A, beta[:, None, None] * k[:, :, None] * v[:, None, :]


def scan_vs_sequential(L: int, d: int, seed: int) -> tuple[float, int]:
    A, b = gated_delta_transitions(L, d, gen(seed), beta_max=2.0)
    _, b_pref, rounds = affine_scan(A, b)
    S, err = torch.zeros(d, d, dtype=torch.float64), 0.0
    for t in range(L):
        S = A[t] @ S + b[t]
        err = max(err, float((S - b_pref[t]).abs().max()))
    return err, rounds


def transition_eigenvalues(beta_max: float, d: int, n: int, seed: int, alpha: float = 1.0) -> tuple[float, float]:
    """Smallest and largest eigenvalue of alpha (I - beta k k^T) over n random k, beta in [0, beta_max]."""
    g = gen(seed)
    k = unit_rows(n, d, g, torch.float64)
    beta = torch.cat([torch.tensor([0.0, beta_max], dtype=torch.float64),
                      beta_max * torch.rand(n - 2, generator=g, dtype=torch.float64)])
    A = alpha * (torch.eye(d, dtype=torch.float64) - beta[:, None, None] * k[:, :, None] * k[:, None, :])
    ev = torch.linalg.eigvalsh(A)
    return float(ev.min()), float(ev.max())


def parity_read(bits: Tensor, beta_one: float) -> Tensor:
    """The parity construction run through the delta rule: reads e1^T S_t e1 for every prefix.

    bits [B, L] in {0, 1}; a bit 1 writes with step ``beta_one``, a bit 0 with step 0.
    """
    B, L = bits.shape
    e1 = torch.tensor([1.0, 0.0], dtype=torch.float64)
    S = torch.outer(e1, e1).expand(B, 2, 2).clone()           # first token: beta = 1, k = v = e1
    reads = []
    for t in range(L):
        beta = beta_one * bits[:, t].double()
        # delta rule with k = e1, v = 0: S <- S - beta k (k^T S) + beta k v^T
        S = S - beta[:, None, None] * e1[None, :, None] * (e1 @ S)[:, None, :]
        reads.append(S[:, 0, 0])
    return torch.stack(reads, 1)


def parity_accuracy(beta_one: float, L: int, n: int, seed: int) -> float:
    """Best accuracy over thresholds of the read, predicting the parity of every prefix."""
    bits = torch.randint(0, 2, (n, L), generator=gen(seed))
    parity = bits.cumsum(1) % 2
    read = parity_read(bits, beta_one).flatten()
    parity = parity.flatten()
    best = 0.0
    for th in torch.unique(torch.cat([read, read + 1e-9, read - 1e-9])).tolist():
        pred = (read < th).long()
        best = max(best, float((pred == parity).double().mean()), float((pred != parity).double().mean()))
    return best


def monotone_parity_bound(L: int) -> float:
    """Best accuracy, over every prefix of uniform random L-bit strings, of any rule that
    thresholds the number of ones (what a read monotone in that count can express).

    The rule "odd iff count >= c" is right with P(count >= c, odd) + P(count < c, even),
    summed over prefix lengths t; the complement rule scores one minus that.
    """
    right = [0.0] * (L + 2)                                    # indexed by the threshold c
    for t in range(1, L + 1):
        pmf = [math.comb(t, j) / 2 ** t for j in range(t + 1)]
        odd_tail, even_head = [0.0] * (L + 2), [0.0] * (L + 2)
        for c in range(t, -1, -1):
            odd_tail[c] = odd_tail[c + 1] + (pmf[c] if c % 2 else 0.0)
        for c in range(t + 2, L + 2):
            odd_tail[c] = 0.0
        for c in range(1, L + 2):
            j = c - 1
            even_head[c] = even_head[c - 1] + (pmf[j] if j <= t and j % 2 == 0 else 0.0)
        for c in range(L + 2):
            right[c] += odd_tail[c] + even_head[c]
    return max(max(r / L, 1 - r / L) for r in right)


# ---------------------------------------------------------------------------- parity by training, any rule
PARITY_WIDTH = dict(n_heads=1, head_dim=16)        # what each kind's parity_stores(d_model, ...) is asked for
PARITY_MODEL = dict(d_model=32, d_ff=64)
PARITY_TRAIN = dict(steps=300, batch=32, lr=3e-3, warmup=20, len_max=16, eval_len=64, eval_n=64, past_conv=4)
# --quick: the same model, a few steps, to show the rows and their checks; no model learns parity in them
PARITY_QUICK = dict(PARITY_TRAIN, steps=8, batch=8, warmup=2, eval_n=8)
PARITY_CHANCE = 0.5


def parity_stores() -> list[dict]:
    """The store tables of every recurrent kind registered, in the cards' order: each config's own
    ``parity_stores(d_model, n_heads, head_dim)`` at ``PARITY_MODEL`` / ``PARITY_WIDTH`` (the rules of the
    shared pipeline at their defaults, delta rules with beta_max 1 and 2; Mamba, Mamba-2, RG-LRU their own)."""
    from storelab.stores import REGISTRY

    out = []
    for _, cls in sorted(REGISTRY.items(), key=lambda kc: (kc[1].CARD_ORDER, kc[0])):
        if cls.RECURRENT:
            out += [dict(t) for t in cls.parity_stores(PARITY_MODEL["d_model"], **PARITY_WIDTH)]
    return out


def store_label(store: dict) -> str:
    """``kind`` and the fields a table sets beyond its kind's own parity tables (``gated_deltanet n_v_heads=2``);
    beta_max is said apart (the experiment's axis)."""
    from storelab.stores import REGISTRY

    own: dict = {}
    for t in REGISTRY[store["kind"]].parity_stores(PARITY_MODEL["d_model"], **PARITY_WIDTH):
        own.update(t)
    extra = [f"{k}={v}" for k, v in store.items() if k not in ("kind", "beta_max") and (k not in own or own[k] != v)]
    return " ".join([store["kind"], *extra])


def parity_theory(tr) -> tuple[bool | None, str]:
    """Whether one layer of transition ``tr`` (``storelab.stores.base.Transition``) can track parity at every
    length (None: theory does not settle it), and why, in a few words with the source."""
    if tr.reflection:
        return True, "can: eigenvalue -1 flips a sign per 1 bit and keeps it (arXiv 2411.12537)"
    if tr.negative:
        return None, "not settled: a negative eigenvalue (needed), not down to -1 (arXiv 2411.12537)"
    if tr.diagonal:
        return False, "cannot at every length: diagonal, decays in (0, 1]: TC0 (arXiv 2404.08819, 2411.12537)"
    return False, "cannot at every length: eigenvalues all >= 0 (arXiv 2411.12537)"


@dataclass
class ParityRun:
    """One store table trained on running parity: what it is, what theory says, what it reached."""

    store: dict
    label: str
    transition: Transition
    can: bool | None             # theory: one layer of it can track parity at every length (None: not settled)
    theory: str                  # the same in words, with its source
    trained: float               # accuracy at positions past_conv .. len_max - 1 (trained lengths), mean over seeds
    long: float                  # accuracy at positions 2 len_max .. eval_len - 1, mean over seeds
    per_seed: list[tuple[float, float]]
    steps: int
    chance: float = PARITY_CHANCE

    def as_dict(self) -> dict:
        return {**asdict(self), "transition": asdict(self.transition)}


def parity_by_training(store: dict, *, seed: int = 0, steps: int | None = None,
                       train: dict = PARITY_TRAIN) -> tuple[float, float]:
    """Train a one-layer model whose token mixer is ``store`` (a store table) on running parity.

    Strings of 2..16 bits (``storelab.tasks.Parity``), AdamW with warmup and a cosine schedule; returns
    the accuracy over ``eval_n`` strings of 64 bits at positions 4..15 (trained lengths, past what a width-4
    short convolution sees of the prefix: parity of <= 4 bits needs no state) and at positions >= 32.
    """
    from storelab.models.config import ModelConfig
    from storelab.models.model import Model
    from storelab.tasks.base import IGNORE
    from storelab.tasks.state_tracking import Parity

    c = train
    steps = c["steps"] if steps is None else steps
    torch.manual_seed(seed)
    model = Model(ModelConfig.from_dict({
        "name": "parity", "vocab_size": 2, "n_layers": 1, "d_model": PARITY_MODEL["d_model"],
        "stores": {"mixer": store, "ffn": {"kind": "ffn", "d_ff": PARITY_MODEL["d_ff"]}, "depth": {"kind": "residual"}},
        "layers": [{"at": "all", "token": "mixer", "channel": "ffn", "depth": "depth"}]}, source=store_label(store)))
    task = Parity(len_min=2, len_max=c["len_max"], eval_len=c["eval_len"])
    opt = torch.optim.AdamW(model.parameters(), lr=c["lr"], betas=(0.9, 0.98), weight_decay=0.1)
    for step in range(steps):
        warm = (step + 1) / c["warmup"]
        cos = 0.1 + 0.45 * (1 + math.cos(math.pi * (step - c["warmup"]) / max(1, steps - c["warmup"])))
        for group in opt.param_groups:
            group["lr"] = c["lr"] * (warm if step < c["warmup"] else cos)
        b = task.sample(c["batch"], 1000 * seed + step)
        logits, _ = model(b.inputs)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), b.targets.flatten(), ignore_index=IGNORE)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    b = task.sample_eval(c["eval_n"], 10_000 + seed)
    with torch.no_grad():
        logits, _ = model(b.inputs)
    ok = (logits.argmax(-1) == b.targets).float().mean(0)
    L = c["len_max"]
    return ok[c["past_conv"]:L].mean().item(), ok[2 * L:].mean().item()


def parity_runs(stores: Iterable[dict] | None = None, *, seeds: Iterable[int] = (0,), quick: bool = False,
                steps: int | None = None) -> list[ParityRun]:
    """Train each of ``stores`` (default: ``parity_stores()``, every recurrent kind registered) on parity at
    the full or ``quick`` sizes (``steps`` overrides), one run per seed, beside what theory predicts."""
    from storelab.stores import build_store

    train = PARITY_QUICK if quick else PARITY_TRAIN
    steps = train["steps"] if steps is None else steps
    stores, seeds = list(parity_stores() if stores is None else stores), list(seeds)
    out = []
    for st in stores:
        tr = build_store({"d_model": PARITY_MODEL["d_model"], **st}).transition()
        can, theory = parity_theory(tr)
        runs = [parity_by_training(st, seed=s, steps=steps, train=train) for s in seeds]
        trained, long = (sum(r[i] for r in runs) / len(runs) for i in (0, 1))
        out.append(ParityRun(dict(st), store_label(st), tr, can, theory, trained, long, runs, steps))
    return out


def run_title(run: ParityRun) -> str:
    """The table's name for a run: its label and, for a table that sets one, the write step's bound."""
    bm = run.store.get("beta_max")
    return run.label + ("" if bm is None else f", beta <= {bm:g}")


def parity_result(runs: list[ParityRun], *, train: dict = PARITY_TRAIN) -> Result:
    """Rows (accuracy at positions >= 32 beside theory's 1 where a construction exists, chance where none
    can, nothing where theory does not settle it) and a curve over beta_max, one line per rule that sets it."""
    from storelab.stores import build_store

    res, lines = Result(), {}
    L = train["len_max"]
    for run in runs:
        d = build_store({"d_model": PARITY_MODEL["d_model"], **run.store}).head_k_dim
        res.rows.append(row("11 parity, trained", d, f"{run_title(run)}: accuracy at positions {2 * L}..63",
                            {True: 1.0, False: run.chance, None: None}[run.can], None, run.long,
                            f"A_t = {run.transition.form}; theory: {run.theory}; positions {train['past_conv']}.."
                            f"{L - 1} (trained lengths): {run.trained:.3f}; chance {run.chance:g}; one layer, "
                            f"{run.steps} steps, {len(run.per_seed)} seed(s): "
                            + ", ".join(f"{r[1]:.3f}" for r in run.per_seed)))
        if run.store.get("beta_max") is not None:
            lines.setdefault(run.label, []).append((run.store["beta_max"], run.long))
    curve = Curve("11 parity, trained one-layer models", "largest write step beta_max", "accuracy, positions 32..63",
                  hline=PARITY_CHANCE)
    for label, pts in lines.items():
        curve.measured(label, [p[0] for p in pts], [p[1] for p in pts])
    res.curves.append(curve)
    return res


def exp_parity_trained(stores: Iterable[dict] | None = None, *, seeds: Iterable[int] = (0,),
                       steps: int | None = None, quick: bool = False) -> Result:
    """Rows (accuracy at positions >= 32, the mean over ``seeds``) and a curve over beta_max, one line per
    rule, for ``stores`` (default: ``parity_stores()``, every recurrent kind registered)."""
    runs = parity_runs(stores, seeds=seeds, quick=quick, steps=steps)
    return parity_result(runs, train=PARITY_QUICK if quick else PARITY_TRAIN)


def exp_recurrence(quick: bool, *, trained: bool = True) -> Result:
    """The rows and curves of experiment 11; ``trained``: with the parity training of every recurrent kind
    (``exp_parity_trained``, at the quick sizes under ``quick``: a few steps, rows that say no model learned)."""
    d, L, n = (8, 33, 64) if quick else (16, 257, 256)
    res = Result()
    assoc = max(associativity_error(d, s) for s in range(5))
    res.rows.append(row("11 affine composition", d, "associativity: max |(c o b) o a - c o (b o a)|", 0.0, None,
                        assoc, "float64 rounding only"))
    err, rounds = scan_vs_sequential(L, d, 11)
    res.rows.append(row("11 parallel scan", d, f"rounds for L = {L} updates", math.ceil(math.log2(L)),
                        math.ceil(math.log2(L)), rounds, "Hillis-Steele doubling (storelab.ops.scan)"))
    res.rows.append(row("11 parallel scan", d, f"max |scan - sequential| over L = {L}", 0.0, None, err,
                        "random Gated DeltaNet updates with beta in [0, 2], float64"))
    lo1, hi1 = transition_eigenvalues(1.0, d, 512, 12, alpha=0.9)
    lo2, _ = transition_eigenvalues(2.0, d, 512, 13, alpha=0.9)
    res.rows.append(row("11 Gated DeltaNet eigenvalues", d, "min eigenvalue, alpha = 0.9, beta in [0, 1]", 0.0, 0.0,
                        lo1, f"largest {hi1:.3f} = alpha"))
    res.rows.append(row("11 Gated DeltaNet eigenvalues", d, "min eigenvalue, alpha = 0.9, beta in [0, 2]", -0.9, -0.9,
                        lo2, "beta = 2 reflects k: eigenvalue -alpha"))
    acc2 = parity_accuracy(2.0, L, n, 14)
    betas = [0.0, 0.25, 0.5, 0.75, 1.0]
    accs = [parity_accuracy(b, L, n, 15) for b in betas]
    res.rows.append(row("11 parity, beta = 2", 2, f"accuracy on every prefix of {n} random {L}-bit strings",
                        1.0, 1.0, acc2, "one layer, 2 x 2 state, exact by construction"))
    res.rows.append(row("11 parity, beta <= 1", 2, "best accuracy over beta in {0, .25, .5, .75, 1} and thresholds",
                        monotone_parity_bound(L), None, max(accs),
                        "the read (1-beta)^count is monotone in the count; theory: the best any threshold on the "
                        "count can do, near chance (0.5) for long strings"))
    res.curves.append(Curve("11 parity by one Gated DeltaNet layer", "write step beta for a 1 bit", "accuracy",
                            hline=0.5).measured("measured", betas + [2.0], accs + [acc2])
                      .theory("exact parity needs beta = 2", [2.0, 2.0], [0.5, 1.0]))
    if trained:  # a few seconds of training per store table (under a second each at the quick sizes)
        runs = exp_parity_trained(quick=quick)
        res.rows += runs.rows
        res.curves += runs.curves
    return res
