"""Sparse distributed memory (Kanerva, 1988; RIACS TR 92.10): experiment 9.

H hard locations at random addresses in {-1, 1}^N, each with N counters. Writing word x at
address a adds x to every location within Hamming radius r of a; reading at a sums the
counters of the locations within r and takes the sign (a majority vote). Words are stored
autoassociatively (address = word). r is chosen so a read activates p ~ 1/sqrt(H) of the
locations (H p^2 ~ 1, as in Kanerva's 1,000-bit, million-location design).

Theory (one read at a stored word's own address): the word's own activations give a signal
H p; every other stored word w shares Binomial(H, p^2) locations with the read and adds +-1
per location, so a bit is wrong with p_b = Phi(-H p / sqrt((K-1)(H p^2 + H^2 p^4))) and the
word comes back exactly with probability (1 - p_b)^N. The load where half the words come
back exactly is about 5 % of H for N = 1,000: the top of Kanerva's 1-5 % guide.

Attention (Bricken and Pehlevan, arXiv 2111.05498): the locations shared by the read address
q and a stored address w, as a function of their Hamming distance, fall off nearly
exponentially, so the SDM read is approximately sum_w x_w exp(beta cos(q, w)), softmax
attention over the stored words with cos = 1 - 2 dist / N. We fit beta to the exact
combinatorial count (theory) and to the simulated counts (measured), and compare the reads.
"""

from __future__ import annotations

import math

import torch

from storelab.capacity.common import Curve, Result, bisect_mean, gen, normal_cdf, row, signs


def _log_binom(n: int, k: int) -> float:
    return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)


def activation_prob(N: int, r: int) -> float:
    return sum(math.exp(_log_binom(N, k) - N * math.log(2)) for k in range(r + 1))


def radius_for(N: int, H: int) -> int:
    """Largest radius whose activation probability stays below 1/sqrt(H)."""
    r = 0
    while activation_prob(N, r + 1) <= 1 / math.sqrt(H):
        r += 1
    return r


def overlap_prob(N: int, r: int, dist: int) -> float:
    """P(a random location lies within r of two addresses at Hamming distance ``dist``)."""
    total = 0.0
    for j in range(dist + 1):               # of the differing bits, j agree with the first address
        for m in range(0, r + 1):           # of the shared bits, m disagree with both
            if (dist - j) + m <= r and j + m <= r:
                total += math.exp(_log_binom(dist, j) + _log_binom(N - dist, m) - N * math.log(2))
    return total


def theory_bit_error(K: int, N: int, H: int, r: int) -> float:
    p = activation_prob(N, r)
    noise = (K - 1) * (H * p * p + (H * p * p) ** 2)
    return normal_cdf(-H * p / math.sqrt(noise)) if K > 1 else 0.0


def theory_exact_fraction(K: int, N: int, H: int, r: int) -> float:
    return (1 - theory_bit_error(K, N, H, r)) ** N


class SDM:
    def __init__(self, N: int, H: int, r: int, g: torch.Generator):
        self.N, self.r = N, r
        self.addr_HN = signs(H, N, g)
        self.C_HN = torch.zeros(H, N)

    def active(self, a_BN: torch.Tensor) -> torch.Tensor:
        dist = (self.N - a_BN @ self.addr_HN.T) / 2          # Hamming distances [B, H]
        return (dist <= self.r).float()

    def write(self, a_BN: torch.Tensor, x_BN: torch.Tensor) -> None:
        self.C_HN += self.active(a_BN).T @ x_BN

    def read_sum(self, a_BN: torch.Tensor) -> torch.Tensor:
        return self.active(a_BN) @ self.C_HN


def exact_fraction(K: int, N: int, H: int, r: int, seeds: int, probes: int = 128) -> tuple[float, float]:
    """Fraction of probed stored words read back exactly, and the mean fraction of right bits."""
    ex = bits = 0.0
    for s in range(seeds):
        g = gen(9000 + 31 * s + K)
        mem = SDM(N, H, r, g)
        X = signs(K, N, g)
        mem.write(X, X)
        P = X[:probes]
        out = torch.sign(mem.read_sum(P))
        ex += float((out == P).all(-1).float().mean())
        bits += float((out == P).float().mean())
    return ex / seeds, bits / seeds


def exp_sdm(quick: bool) -> Result:
    N, H, seeds = (256, 1000, 2) if quick else (1000, 4000, 2)
    r = radius_for(N, H)
    p = activation_prob(N, r)
    res = Result()
    pts: list = []
    K = bisect_mean(lambda K: 1 - exact_fraction(K, N, H, r, seeds)[0], int(0.01 * H), int(0.2 * H), target=0.5,
                    rel_tol=0.02, points=pts)
    th = bisect_mean(lambda K: 1 - theory_exact_fraction(K, N, H, r), 2, H, target=0.5, rel_tol=1e-4)
    res.rows.append(row("9 sparse distributed memory", N, f"half the words read back exactly, K/H (H = {H:,}, r = {r})",
                        th / H, 0.05, K / H,
                        f"one read at the word's own address, activation p = {p:.4f} (H p^2 = {H * p * p:.2f}); "
                        "the essay's figure is the top of Kanerva's 1-5 % guide"))
    loads = [0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.08, 0.12]
    meas = [exact_fraction(max(2, int(f * H)), N, H, r, 1) for f in loads]
    res.curves.append(Curve(f"9 SDM recall, N={N}, H={H:,}", "stored words / locations", "fraction")
                      .measured("words exact", loads, [m[0] for m in meas])
                      .measured("bits right", loads, [m[1] for m in meas])
                      .theory("words exact theory", loads, [theory_exact_fraction(int(f * H), N, H, r) for f in loads])
                      .theory("bits right theory", loads, [1 - theory_bit_error(int(f * H), N, H, r) for f in loads]))
    # attention approximation
    dists = list(range(0, 2 * r - N // 2, max(1, (2 * r - N // 2) // 12)))
    ths = [overlap_prob(N, r, t) for t in dists]
    keep = [i for i, v in enumerate(ths) if v > 1e-3 * ths[0]]
    x = torch.tensor([1 - 2 * dists[i] / N for i in keep], dtype=torch.float64)
    beta_th = float(torch.linalg.lstsq(torch.stack([x, torch.ones_like(x)], 1),
                                       torch.tensor([math.log(ths[i]) for i in keep], dtype=torch.float64)[:, None]
                                       ).solution[0, 0])
    g = gen(9500)
    mem = SDM(N, H, r, g)
    q = signs(64, N, g)
    meas_counts = []
    for i in keep:
        w = q.clone()
        for b in range(len(q)):
            w[b, torch.randperm(N, generator=g)[: dists[i]]] *= -1
        meas_counts.append(float((mem.active(q) * mem.active(w)).sum(-1).mean()) / H)
    ok = [j for j, c in enumerate(meas_counts) if c > 0]
    xm = x[ok]
    beta_m = float(torch.linalg.lstsq(torch.stack([xm, torch.ones_like(xm)], 1),
                                      torch.tensor([math.log(meas_counts[j]) for j in ok], dtype=torch.float64)[:, None]
                                      ).solution[0, 0])
    # compare reads: SDM sum against attention over the stored words with the fitted beta
    K = max(2, int(0.02 * H))
    X = signs(K, N, g)
    mem2 = SDM(N, H, r, g)
    mem2.write(X, X)
    Q = X[:32].clone()
    for b in range(len(Q)):
        Q[b, torch.randperm(N, generator=g)[: N // 20]] *= -1          # 5 % noisy cues
    sdm_read = mem2.read_sum(Q)
    att_read = torch.softmax(beta_m * (Q @ X.T) / N, -1) @ X
    cos = float(torch.nn.functional.cosine_similarity(sdm_read, att_read, dim=-1).mean())
    res.rows.append(row("9 SDM read as attention", N, "beta of exp(beta cos) fitted to shared locations", beta_th,
                        None, beta_m, f"Bricken and Pehlevan; cosine between the SDM read and softmax attention "
                                      f"with the fitted beta on 5 %-noisy cues: {cos:.3f}"))
    res.curves.append(Curve("9 SDM shared locations vs cosine", "cos(q, w)", "shared fraction of locations", logy=True)
                      .measured("simulated", x[ok].tolist(), [meas_counts[j] for j in ok])
                      .theory("exact count", x.tolist(), [ths[i] for i in keep]))
    return res
