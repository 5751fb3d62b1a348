"""State tracking (parity) and selective copying.

Parity (running XOR; the simplest problem outside diagonal recurrences, Merrill, Petty
and Sabharwal, arXiv 2404.08819; Grazzi et al., arXiv 2411.12537, show that a delta-rule
layer tracks it once its write step may exceed 1, so that ``I - beta k k^T`` has a
negative eigenvalue). Tokens 0 and 1 are the bits; the target at each position is the
parity of the bits so far. Training lengths are drawn from ``len_min .. len_max``;
``eval_len`` is longer (a length-generalisation test). Worked example::

    inputs   1 0 1 1 0 1
    targets  1 1 0 1 1 0

Selective copying (Gu and Dao, Mamba, arXiv 2312.00752): ``n_data`` data tokens are
scattered among ``seq_len`` blanks; after a separator the model writes them back in
order. Token 0 is the blank, 1 the separator, data tokens are 2 .. vocab_size - 1.
Worked example (seq_len 6, 2 data tokens)::

    inputs   0 5 0 0 3 0 SEP 5
    targets  . . . . . .  5  3

Only the copied positions are scored: the separator predicts the first data token,
each copied token the next.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from storelab.tasks.base import IGNORE, Batch, Task, generator, register_task


@register_task("parity")
@dataclass(kw_only=True)
class Parity(Task):
    HAS_TEST_SPLIT = True
    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {"full": {}, "small": {}, "tiny": {"len_max": 16, "eval_len": 32}}

    len_min: int = 8
    len_max: int = 32
    eval_len: int = 64
    vocab_size: int = 2

    def __post_init__(self):
        self.check(1 <= self.len_min <= self.len_max, "len_min", f"need 1 <= len_min <= len_max, got "
                   f"{self.len_min}, {self.len_max}")
        self.check(self.eval_len >= 1, "eval_len", f"must be >= 1, got {self.eval_len}")
        self.check(self.vocab_size == 2, "vocab_size", f"parity has two tokens, got {self.vocab_size}")

    def sample(self, n: int, seed: int, *, length: int | None = None) -> Batch:
        """n bit strings; lengths uniform in len_min..len_max (or all ``length``), right-padded."""
        g = generator(seed)
        bits = torch.randint(2, (n, length or self.len_max), generator=g)
        targets = bits.cumsum(1) % 2
        if length is None:
            lens = torch.randint(self.len_min, self.len_max + 1, (n,), generator=g)
            targets = torch.where(torch.arange(self.len_max)[None] < lens[:, None], targets, IGNORE)
        return Batch(bits, targets)

    def sample_eval(self, n: int, seed: int) -> Batch:
        return self.sample(n, seed, length=self.eval_len)

    def sample_test(self, n: int, seed: int) -> Batch:
        """The length-generalisation split: every string ``eval_len`` bits long."""
        return self.sample_eval(n, seed)

    def chance(self) -> float:
        return 0.5


@register_task("selective_copy")
@dataclass(kw_only=True)
class SelectiveCopy(Task):
    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {"full": {"seq_len": 4096, "n_data": 16},
                                                    "small": {}, "tiny": {"seq_len": 16, "n_data": 4, "vocab_size": 8}}

    seq_len: int = 64
    n_data: int = 8
    vocab_size: int = 16

    def __post_init__(self):
        self.check(self.vocab_size >= 3, "vocab_size", f"must be >= 3, got {self.vocab_size}")
        self.check(1 <= self.n_data <= self.seq_len, "n_data", f"must be in [1, seq_len], got {self.n_data}")

    def sample(self, n: int, seed: int) -> Batch:
        g = generator(seed)
        L, m = self.seq_len, self.n_data
        data = torch.randint(2, self.vocab_size, (n, m), generator=g)
        inputs = torch.zeros(n, L + 1 + m - 1, dtype=torch.long)
        targets = torch.full_like(inputs, IGNORE)
        for i in range(n):
            pos = torch.randperm(L, generator=g)[:m].sort().values
            inputs[i, pos] = data[i]
        inputs[:, L] = 1
        inputs[:, L + 1:] = data[:, :-1]
        targets[:, L:] = data
        return Batch(inputs, targets)

    def chance(self) -> float:
        return 1.0 / (self.vocab_size - 2)
