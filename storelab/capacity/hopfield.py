"""Hopfield networks and dense associative memory (essay section 2): experiment 8.

N binary neurons, patterns xi^mu in {-1, 1}^N.

* Hebb's rule (Hopfield, PNAS 79, 1982): W = sum_mu xi^mu xi^mu^T / N, zero diagonal; recall
  by asynchronous updates s_i <- sign(sum_j W_ij s_j) (here in 10 random blocks per sweep)
  from the stored pattern. Retrieval states exist up to alpha_c N (Amit, Gutfreund and
  Sompolinsky, PRL 55, 1985): at zero temperature y (sqrt(2 alpha) + 2/sqrt(pi) e^{-y^2})
  = erf(y), m = erf(y); alpha_c = 0.138 is the largest alpha with a solution, where
  (1 - m)/2 = 1.6 % of the bits are wrong. Retrieved = final overlap >= 0.9.
* Exact recall (McEliece et al., IEEE Trans. IT 33, 1987): a pattern is recalled exactly when
  it is a fixed point. The crosstalk on each bit is Gaussian with variance (M-1)(N-1)/N^2,
  so a bit flips with p = Phi(-sqrt((N-1)/(M-1))). "Most" = at least 90 % of the patterns
  fixed, asymptotically N / (2 ln N); "all" = every pattern fixed with probability 0.9,
  asymptotically N / (4 ln N).
* A perceptron rule (Gardner, J. Phys. A 21, 1988; Krauth and Mezard): for each neuron,
  add xi_i^mu xi^mu / N whenever xi_i^mu h_i^mu <= 0 (batch form, zero diagonal) until every
  pattern is a fixed point. Gardner's bound is 2N; at finite N Cover's count of separable
  dichotomies gives P(one neuron) = 2^(1-M) sum_{k<N-1} C(M-1, k), and all N neurons must succeed.
* Dense associative memory (Krotov and Hopfield, arXiv 1606.01164): energy
  E = -sum_mu F(xi^mu . s) with F(x) = x^n; bit i is stable when flipping it raises E.
  Each other pattern adds +-D(y), D(y) = F(y+1) - F(y-1), y a sum of N-1 random signs;
  the self term is D(N-1). Criterion: at most 1 % unstable bits; the capacity grows as
  N^(n-1) (n = 2 is the classical case).
* Exponential energy F(x) = e^x (Demircigil et al., arXiv 1702.01929): 2^(N/2) patterns can
  be fixed points. At the sizes we can run the limit is a pair of patterns at Hamming
  distance 1 (a tie between them), which appears with probability 1/2 near
  C(K, 2) N / 2^N = (4/3) ln 2; the exponent of K* in 2^N tends to 1/2.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from storelab.capacity.common import (Curve, Result, bisect_last_ok, bisect_mean, fit_exponent, gen, normal_cdf,
                                      normal_quantile, row, signs, solve_increasing)

# ------------------------------------------------------------------------------ theory


def ags_retrieval() -> tuple[float, float]:
    """(alpha_c, fraction of wrong bits at alpha_c) from the T = 0 AGS equations."""
    best = (0.0, 0.0)
    for i in range(1, 40001):
        y = i * 1e-4
        gy = math.erf(y) / y - 2 / math.sqrt(math.pi) * math.exp(-y * y)
        if gy > 0 and gy * gy / 2 > best[0]:
            best = (gy * gy / 2, (1 - math.erf(y)) / 2)
    return best


def hebb_flip_prob(M: float, N: int) -> float:
    return normal_cdf(-math.sqrt((N - 1) / max(M - 1, 1e-9)))


def mceliece_theory(N: int, level: float = 0.9) -> tuple[float, float]:
    """Finite-N loads where 90 % of patterns are fixed, and where all are with probability 0.9."""
    most = solve_increasing(lambda M: 1 - (1 - hebb_flip_prob(M, N)) ** N, 1 - level, 2, N)
    alll = solve_increasing(lambda M: 1 - (1 - hebb_flip_prob(M, N)) ** (N * M), 1 - level, 2, N)
    return most, alll


def cover_all_neurons(N: int) -> float:
    """Load M at which all N neurons' dichotomies are separable with probability 1/2 (Cover, 1965)."""
    def p_fail(M: float) -> float:
        M = int(round(M))
        n_in = N - 1                                            # no self-coupling
        logs = [math.lgamma(M) - math.lgamma(k + 1) - math.lgamma(M - k) for k in range(min(n_in, M))]
        mx = max(logs)
        p_one = min(1.0, math.exp(mx + math.log(sum(math.exp(x - mx) for x in logs)) + (1 - M) * math.log(2)))
        return 1 - p_one ** N
    return solve_increasing(p_fail, 0.5, N, 3 * N, iters=60)


def dense_theory(N: int, n: int, err: float = 0.01) -> float:
    """Load K at which a fraction ``err`` of bits of a stored pattern is unstable (Gaussian crosstalk)."""
    y = torch.arange(-(N - 1), N, 2, dtype=torch.float64)
    logp = torch.tensor([math.lgamma(N) - math.lgamma((N - 1 + v) / 2 + 1) - math.lgamma((N - 1 - v) / 2 + 1)
                         for v in y.tolist()], dtype=torch.float64) - (N - 1) * math.log(2)
    D = (y + 1) ** n - (y - 1) ** n
    var = float((logp.exp() * D * D).sum())
    signal = (N ** n - (N - 2) ** n)
    z = -normal_quantile(err)
    return 1 + (signal / z) ** 2 / var


def exponential_theory(N: int) -> float:
    """K with P(no pair at distance 1 breaks a pattern) = 1/2: C(K,2) N/2^N * 3/4 = ln 2."""
    return 0.5 + math.sqrt(0.25 + 2 * math.log(2) * 2 ** N / (0.75 * N))


# --------------------------------------------------------------------------- measurements


def hebb_weights(X_MN: Tensor) -> Tensor:
    W = X_MN.T @ X_MN / X_MN.shape[1]
    W.fill_diagonal_(0.0)
    return W


def async_recall(W: Tensor, S_PN: Tensor, g: torch.Generator, blocks: int = 10, sweeps: int = 30) -> Tensor:
    N = W.shape[0]
    S = S_PN.clone()
    for _ in range(sweeps):
        changed = False
        for idx in torch.randperm(N, generator=g).chunk(blocks):
            h = S @ W[:, idx]
            new = torch.where(h == 0, S[:, idx], torch.sign(h))
            if not torch.equal(new, S[:, idx]):
                changed = True
                S[:, idx] = new
        if not changed:
            break
    return S


def hebb_overlaps(M: int, N: int, seed: int, probes: int = 48) -> Tensor:
    g = gen(8000 + seed * 100_003 + M)
    X = signs(M, N, g)
    P = X[:probes]
    return (async_recall(hebb_weights(X), P, g) * P).mean(-1)


def unstable_bits(X_MN: Tensor) -> Tensor:
    """Per pattern, the number of bits that one Hebbian update would flip."""
    N = X_MN.shape[1]
    H = (X_MN @ X_MN.T) @ X_MN / N - X_MN.shape[0] / N * X_MN      # zero self-coupling
    return (X_MN * H <= 0).sum(-1)


def perceptron_all_fixed(M: int, N: int, seed: int, epochs: int) -> bool:
    g = gen(8800 + seed)
    X = signs(M, N, g)
    J = hebb_weights(X)
    for _ in range(epochs):
        wrong = (X * (X @ J.T) <= 0).to(X.dtype)                    # [M, N]
        if not bool(wrong.any()):
            return True
        J += (wrong * X).T @ X / N
        J.fill_diagonal_(0.0)
    return False


def flip_cost(P_PN: Tensor, X_KN: Tensor, F) -> Tensor:
    """Energy cost of flipping each bit of each probe state, E = -sum_mu F(xi^mu . s): [P, N].

    Flipping bit i changes the overlap with pattern mu by -2 T_mu,i, T = xi^mu_i s_i = +-1, so
    cost_i = sum_mu a_mu (1 + T)/2 + b_mu (1 - T)/2 with a = F(o) - F(o-2), b = F(o) - F(o+2):
    one matrix product instead of a [P, K, N] tensor.
    """
    O = P_PN @ X_KN.T
    a, b = F(O) - F(O - 2), F(O) - F(O + 2)
    return 0.5 * (a + b).sum(1, keepdim=True) + 0.5 * ((a - b) @ X_KN) * P_PN


def dense_unstable_fraction(K: int, N: int, n: int, seeds: int, probes: int = 64) -> float:
    """Fraction of bits of stored patterns that one update would flip, for F(x) = x^n."""
    out = 0.0
    for s in range(seeds):
        X = signs(K, N, gen(8500 + 7 * s + K * 13 + n), torch.float64)
        out += float((flip_cost(X[:probes], X, lambda x: x.pow(n)) <= 0).double().mean())
    return out / seeds


def exp_all_fixed_exponential(K: int, N: int, seed: int) -> bool:
    """Whether every stored pattern is a fixed point under F(x) = e^x (scaled by e^-N)."""
    X = signs(K, N, gen(8600 + seed), torch.float64)
    return not any(bool((flip_cost(P, X, lambda x: torch.exp(x - N)) <= 0).any()) for P in X.split(1024))


def _quantile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    pos = q * (len(xs) - 1)
    lo = int(math.floor(pos))
    return xs[lo] + (pos - lo) * (xs[min(lo + 1, len(xs) - 1)] - xs[lo])


def exp_hopfield(quick: bool) -> Result:
    N, seeds = (300, 2) if quick else (1000, 2)
    res = Result()
    alpha_c, wrong_c = ags_retrieval()
    pts: list = []
    stat = lambda M: sum(float((hebb_overlaps(M, N, s) < 0.9).double().mean()) for s in range(seeds)) / seeds
    m_c = bisect_mean(stat, int(0.08 * N), int(0.25 * N), target=0.5, rel_tol=0.02, points=pts)
    res.rows.append(row("8 Hopfield (Hebb)", N, "retrieval: half the patterns end with overlap >= 0.9",
                        alpha_c * N, 0.138 * N, m_c,
                        "asynchronous recall from the stored pattern; finite N lets retrieval survive a little "
                        "past alpha_c (the transition sharpens as N grows)"))
    pts.sort()
    res.curves.append(Curve(f"8 Hopfield retrieval, N={N}", "load M/N", "fraction not retrieved", hline=0.5)
                      .measured("measured", [p[0] / N for p in pts], [p[1] for p in pts])
                      .theory("AGS alpha_c (step)", [0.05, alpha_c, alpha_c, 0.3], [0, 0, 1, 1]))
    M = int(round(0.138 * N))
    m = torch.cat([hebb_overlaps(M, N, s + 50) for s in range(seeds)])
    m = m[m >= 0.5]
    res.rows.append(row("8 Hopfield (Hebb)", N, f"wrong bits of retrieved states at M = 0.138 N = {M}", wrong_c, 0.015,
                        float((1 - m).mean() / 2) if len(m) else None,
                        "AGS: m = 0.967 at alpha_c; the essay rounds the wrong-bit fraction to 1.5 %"))
    # exact recall (McEliece et al.)
    most_th, all_th = mceliece_theory(N)
    n_seeds = 8 if quick else 16
    most = bisect_mean(lambda M: sum(float((unstable_bits(signs(M, N, gen(8100 + s * 7 + M))) > 0).double().mean())
                                     for s in range(n_seeds)) / n_seeds, 4, N // 4, target=0.1, rel_tol=0.01)
    res.rows.append(row("8 Hopfield exact recall", N, "most: >= 90 % of patterns are fixed points", most_th,
                        N / (2 * math.log(N)), most, "theory: Gaussian crosstalk at finite N; essay N/(2 ln N)"))
    firsts = [bisect_last_ok(lambda M: bool((unstable_bits(signs(M, N, gen(8200 + s))) == 0).all()), 4, N // 4)
              for s in range(40 if not quick else 24)]
    alll = _quantile(firsts, 0.1)
    res.rows.append(row("8 Hopfield exact recall", N, "all: every pattern fixed with probability 0.9", all_th,
                        N / (4 * math.log(N)), alll,
                        "N/(4 ln N) drops a ln ln N term: the theory column (the same Gaussian crosstalk at finite N) "
                        "is " + ", ".join(f"{mceliece_theory(x)[1] / (x / (4 * math.log(x))) - 1:+.0%} at N = {x:,}"
                                          for x in (N, 10 ** 4, 10 ** 6)) + " against it: a logarithmic approach"))
    # perceptron rule
    Np, epochs = (60, 400) if quick else (150, 600)
    perc = [bisect_last_ok(lambda M: perceptron_all_fixed(M, Np, s, epochs), Np, int(2.2 * Np), rel_tol=0.02)
            for s in range(3)]
    res.rows.append(row("8 perceptron rule", Np, f"all patterns fixed points ({epochs} batch epochs, median)",
                        cover_all_neurons(Np), 2 * Np, sorted(perc)[1],
                        "Gardner's 2N is the N -> infinity bound; theory: Cover's count with all N neurons required. "
                        "The perceptron's epochs grow without bound near it (at N=150, ~1,200 epochs at M=240). "
                        f"Hebb at this N holds all patterns only to ~{mceliece_theory(Np)[1]:.0f}"))
    # dense associative memory
    grids = {2: [64, 128, 256], 3: [32, 64, 128], 4: [16, 32, 64]} if not quick else \
        {2: [32, 64, 128], 3: [16, 32, 64], 4: [12, 16, 24]}
    dam = Curve("8 dense associative memory, F(x) = x^n", "N", "capacity K (1 % unstable bits)", logx=True, logy=True)
    for n, Ns in grids.items():
        caps = [bisect_mean(lambda K: dense_unstable_fraction(K, x, n, 4), max(2, int(dense_theory(x, n) / 3)),
                            int(3 * dense_theory(x, n)) + 3, target=0.01, rel_tol=0.02) for x in Ns]
        ths = [dense_theory(x, n) for x in Ns]
        dam.measured(f"n={n}", Ns, caps).theory(f"n={n} theory", Ns, ths)
        res.rows.append(row(f"8 dense associative memory, n={n}", Ns[-1], f"exponent of K*(N), N={Ns}",
                            fit_exponent(Ns, ths), n - 1, fit_exponent(Ns, caps),
                            "K* at <= 1 % unstable bits; n = 2 is the classical network"))
    res.curves.append(dam)
    # exponential energy
    Ns, n_seeds = ([10, 12, 14], 5) if quick else ([12, 14, 16, 18, 20, 22], 7)
    caps = [float(sorted(bisect_last_ok(lambda K: exp_all_fixed_exponential(K, x, s), max(2, int(exponential_theory(x) / 4)),
                                        int(3 * exponential_theory(x))) for s in range(n_seeds))[n_seeds // 2])
            for x in Ns]
    ths = [exponential_theory(x) for x in Ns]
    slope = lambda ys: float(torch.linalg.lstsq(torch.tensor([[x, 1.0] for x in Ns], dtype=torch.float64),
                                                torch.tensor([[math.log2(y)] for y in ys], dtype=torch.float64)
                                                ).solution[0, 0])
    res.rows.append(row("8 exponential energy", Ns[-1], f"d log2 K* / dN, all patterns fixed, N={Ns}", slope(ths), 0.5,
                        slope(caps), f"K*({Ns[-1]}) = {caps[-1]:.0f} against 2^(N/2) = {2 ** (Ns[-1] / 2):.0f}: ties "
                                     "between patterns at distance 1 bind first; the exponent tends to 1/2"))
    res.curves.append(Curve("8 exponential energy", "N", "K* (all fixed)", logy=True)
                      .measured("measured", Ns, caps).theory("tie-pair theory", Ns, ths)
                      .theory("2^(N/2)", Ns, [2 ** (x / 2) for x in Ns]))
    return res
