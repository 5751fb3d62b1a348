"""Dictionary and language: a task that separates content from settings.

After Afendulev et al. (arXiv 2609.04434): a prompt opens with an instruction that
selects one of ``n_languages`` output "languages", then holds a dictionary of
15 to 30 key-value pairs, then asks for the value of one key. The answer is that
value written in the requested language: each language is a fixed token mapping
(a permutation of the values onto its own block of the vocabulary, drawn once from
``mapping_seed``), so an answer token says both *what* was retrieved (content, held in
the dictionary) and *how* it was written (the setting, given once, early).

Vocabulary: 0 pad, 1 BOS, 2 QUERY, 3 ANSWER, then ``n_languages`` instruction tokens,
``n_keys`` key tokens, ``n_values`` dictionary value tokens, and one block of
``n_values`` output tokens per language.

Worked example (2 languages, 4 keys, 4 values; ids: LANG0 4, LANG1 5, keys 6..9,
values 10..13, language 0 writes value j as 14 + perm0[j], language 1 as 18 + perm1[j];
say perm1 = (2, 0, 3, 1))::

    inputs   BOS LANG1  k7 v12  k6 v10  k9 v11  QUERY k6 ANSWER
    ids        1   5     7  12   6  10   9  11    2    6   3
    targets    .   .     .   .   .   .   .   .    .    .  20

The query asks for key 6, whose value is 10 (value index 0); language 1 writes index 0
as 18 + perm1[0] = 20, the target at the ANSWER position. With ``n_queries > 1`` more
``QUERY k ANSWER a`` blocks follow (``a`` the previous answer, teacher-forced).

``meta``: ``language`` [N], ``value`` [N, Q] (value index of each queried key),
``answer_pos`` [N, Q] (positions whose targets are the answers). ``decode(token)``
turns an answer token back into (language, value index), -1 where it is neither, which
is how the probes score retrieval and compliance separately.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor

from storelab.tasks.base import IGNORE, Batch, Task, generator, register_task

PAD, BOS, QUERY, ANSWER = 0, 1, 2, 3
N_SPECIAL = 4


@register_task("dictionary")
@dataclass(kw_only=True)
class DictionaryLanguage(Task):
    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        "full": {},
        "small": {"n_languages": 4, "n_keys": 32, "n_values": 32, "pairs_min": 6, "pairs_max": 12, "n_queries": 4},
        "tiny": {"n_languages": 2, "n_keys": 16, "n_values": 16, "pairs_min": 4, "pairs_max": 8, "n_queries": 4},
    }

    n_languages: int = 4
    n_keys: int = 64
    n_values: int = 64
    pairs_min: int = 15
    pairs_max: int = 30
    n_queries: int = 1
    pairs_dist: str = "uniform"  # how a prompt's number of entries is drawn: "uniform" or "log" (log-uniform)
    pairs_mix: tuple = ()        # or a mixture: ((share, fewest, most), ...), each part uniform, shares summing to 1
    queries_repeat: bool = False  # a prompt with fewer entries than n_queries asks some keys again
    mapping_seed: int = 0
    vocab_size: int = 0  # derived; 0 = compute (a value given must match)

    def __post_init__(self):
        for n in ("n_languages", "n_keys", "n_values", "n_queries"):
            self.check(getattr(self, n) >= 1, n, f"must be >= 1, got {getattr(self, n)}")
        self.check(1 <= self.pairs_min <= self.pairs_max, "pairs_min",
                   f"need 1 <= pairs_min <= pairs_max, got {self.pairs_min}, {self.pairs_max}")
        self.check(self.pairs_max <= min(self.n_keys, self.n_values), "pairs_max",
                   f"{self.pairs_max} pairs need as many distinct keys and values (have {self.n_keys}, {self.n_values})")
        self.check(self.queries_repeat or self.n_queries <= self.pairs_min, "n_queries",
                   f"must be <= pairs_min ({self.pairs_min}) unless queries_repeat, got {self.n_queries}")
        self.check(self.pairs_dist in ("uniform", "log"), "pairs_dist",
                   f"one of uniform, log; got {self.pairs_dist!r}")
        self.pairs_mix = tuple(tuple(p) for p in self.pairs_mix)
        for p in self.pairs_mix:
            self.check(len(p) == 3 and 0 < p[0] <= 1 and self.pairs_min <= p[1] <= p[2] <= self.pairs_max,
                       "pairs_mix", f"each part is (share in (0, 1], fewest, most) within [pairs_min, pairs_max] "
                       f"= [{self.pairs_min}, {self.pairs_max}]; got {p}")
        self.check(not self.pairs_mix or abs(sum(p[0] for p in self.pairs_mix) - 1) < 1e-6, "pairs_mix",
                   f"the shares must sum to 1, got {sum(p[0] for p in self.pairs_mix) if self.pairs_mix else 0}")
        need = self.out_start + self.n_languages * self.n_values
        self.check(self.vocab_size in (0, need), "vocab_size", f"is derived ({need}), got {self.vocab_size}")
        self.vocab_size = need
        g = generator(self.mapping_seed)
        self._perm = torch.stack([torch.randperm(self.n_values, generator=g) for _ in range(self.n_languages)])

    # -- the vocabulary ----------------------------------------------------------------
    @property
    def lang_start(self) -> int:
        return N_SPECIAL

    @property
    def key_start(self) -> int:
        return self.lang_start + self.n_languages

    @property
    def value_start(self) -> int:
        return self.key_start + self.n_keys

    @property
    def out_start(self) -> int:
        return self.value_start + self.n_values

    def write(self, language: Tensor, value: Tensor) -> Tensor:
        """The token that writes value index ``value`` in ``language`` (broadcasting)."""
        return self.out_start + language * self.n_values + self._perm[language, value]

    def decode(self, token: Tensor) -> tuple[Tensor, Tensor]:
        """(language, value index) of output tokens; (-1, -1) for any other token."""
        rel = token - self.out_start
        ok = (rel >= 0) & (rel < self.n_languages * self.n_values)
        lang = torch.where(ok, rel // self.n_values, -1)
        slot = torch.where(ok, rel % self.n_values, 0)
        inv = torch.argsort(self._perm, dim=1)  # inv[l, perm[l, j]] = j
        val = torch.where(ok, inv[lang.clamp_min(0), slot], -1)
        return lang, val

    # -- sampling -------------------------------------------------------------------------
    def sample(self, n: int, seed: int, *, language: Tensor | None = None) -> Batch:
        """n prompts; ``language`` [n] fixes each prompt's requested language."""
        g = generator(seed)
        P, Q = self.pairs_max, self.n_queries
        T = 2 + 2 * P + 4 * Q - 1  # BOS LANG, pairs, Q blocks of (QUERY k ANSWER a) minus the last a
        inputs = torch.zeros(n, T, dtype=torch.long)
        targets = torch.full((n, T), IGNORE, dtype=torch.long)
        langs = torch.randint(self.n_languages, (n,), generator=g) if language is None else language.long()
        values = torch.zeros(n, Q, dtype=torch.long)
        answer_pos = torch.zeros(n, Q, dtype=torch.long)
        pairs = self.draw_pairs(n, g)
        for i in range(n):
            m = int(pairs[i])
            keys = torch.randperm(self.n_keys, generator=g)[:m]
            vals = torch.randperm(self.n_values, generator=g)[:m]
            asked = torch.randperm(m, generator=g)[:Q]
            if m < Q:  # queries_repeat: the rest asked again, at random
                asked = torch.cat([asked, torch.randint(m, (Q - m,), generator=g)])
            seq = [BOS, self.lang_start + int(langs[i])]
            for k, v in zip(keys.tolist(), vals.tolist()):
                seq += [self.key_start + k, self.value_start + v]
            for q, j in enumerate(asked.tolist()):
                ans = int(self.write(langs[i], vals[j]))
                seq += [QUERY, self.key_start + int(keys[j]), ANSWER]
                answer_pos[i, q] = len(seq) - 1
                targets[i, len(seq) - 1] = ans
                values[i, q] = vals[j]
                if q < Q - 1:
                    seq.append(ans)
            L = len(seq)
            inputs[i, T - L:] = torch.tensor(seq)  # left-pad so every answer sits at the same column
            targets[i] = torch.roll(targets[i], T - L)
            answer_pos[i] += T - L
        return Batch(inputs, targets, {"language": langs, "value": values, "answer_pos": answer_pos})

    def draw_pairs(self, n: int, g: torch.Generator) -> Tensor:
        """Entries of n prompts: uniform in [pairs_min, pairs_max], or log-uniform (``pairs_dist="log"``:
        as many prompts between 4 and 8 entries as between 32 and 64, so a mixture of sizes that reaches far
        above a state's capacity still holds enough small dictionaries to learn the lookup from)."""
        if self.pairs_mix:
            shares = torch.tensor([p[0] for p in self.pairs_mix], dtype=torch.float64)
            part = torch.multinomial(shares, n, replacement=True, generator=g)
            lo = torch.tensor([p[1] for p in self.pairs_mix])[part]
            hi = torch.tensor([p[2] for p in self.pairs_mix])[part]
            u = torch.rand(n, generator=g, dtype=torch.float64)
            return (lo + (u * (hi - lo + 1)).floor().long()).clamp(max=hi)
        if self.pairs_dist == "uniform":
            return torch.randint(self.pairs_min, self.pairs_max + 1, (n,), generator=g)
        lo, hi = math.log(self.pairs_min), math.log(self.pairs_max + 1)
        u = torch.rand(n, generator=g, dtype=torch.float64)
        return torch.exp(lo + u * (hi - lo)).floor().long().clamp(self.pairs_min, self.pairs_max)

    def answers(self, logits_BTV: Tensor, batch: Batch) -> tuple[Tensor, Tensor]:
        """(language, value index) of the argmax answer at every query, each [N, Q]."""
        pos = batch.meta["answer_pos"]
        pred = logits_BTV.argmax(-1).gather(1, pos)
        return self.decode(pred)

    def score(self, logits_BTV: Tensor, batch: Batch) -> dict[str, float]:
        """Retrieval (right value, any language) and compliance (requested language, any value)."""
        lang, val = self.answers(logits_BTV, batch)
        return {"retrieval": (val == batch.meta["value"]).float().mean().item(),
                "compliance": (lang == batch.meta["language"][:, None]).float().mean().item()}

    def chance(self) -> float:
        return 1.0 / (self.n_languages * self.n_values)


def tiny_dictionary(**kw) -> DictionaryLanguage:
    """A CPU-sized version: 2 languages, 16 keys and values, 4 to 8 pairs, 4 questions."""
    return DictionaryLanguage(**{**DictionaryLanguage.PRESETS["tiny"], **kw})
