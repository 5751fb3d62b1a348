"""Multi-query associative recall (MQAR; Arora et al., Zoology, arXiv 2312.04927).

A sequence first lists ``pairs`` key-value pairs, then asks for the keys again, in a
random order, scattered over the rest of the sequence; after each queried key the
model must produce its value. Keys come from the lower half of the vocabulary
(ids 1 .. V/2 - 1), values from the upper half (V/2 .. V - 1). The gap before each
query is drawn from a power law ``p(g) ~ g^(power_a - 1)`` over the free slots (power
0.01: most queries come early, a few late), and every other token is random noise.
``sample_test`` draws the length-generalisation split ``test_mix`` (by default each
training (seq_len, pairs) at twice the length).

Worked example (vocab 16, seq_len 12, 2 pairs; keys 1..7, values 8..15)::

    position  0  1  2  3 | 4  5  6  7  8  9 10 11
    inputs    3 12  5  9 | 6  2  5 13  3 10 11 14
    targets   .  .  .  . | .  .  .  9  . 12  .  .

Keys 3 -> 12 and 5 -> 9 are stored first. Slots 4..11 hold the queries (5 at 6, 3 at 8)
and noise; the target after key 5 at position 6 is its value 9 (scored at position 6:
the model predicts the next token), after key 3 at position 8 it is 12.

Zoology's defaults: vocab 8192, 4 to 64 pairs, sequences of 64 to 1024 tokens, power
0.01. ``MQAR_TRAIN_MIX`` and ``MQAR_TEST_MIX`` are their length-generalisation split:
train on sequences up to 256 tokens, test on up to 1024 and more pairs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from storelab.tasks.base import IGNORE, Batch, Task, generator, pad_cat, register_task

# (seq_len, pairs): Zoology's training mix, and the test mix that goes longer
MQAR_TRAIN_MIX = ((64, 4), (128, 8), (256, 16), (256, 32), (256, 64))
MQAR_TEST_MIX = ((64, 4), (64, 8), (64, 16), (128, 32), (256, 64), (512, 64), (1024, 64))


def mqar_batch(n: int, *, vocab_size: int, seq_len: int, pairs: int, power_a: float, random_noise: bool,
               g: torch.Generator) -> Batch:
    """n MQAR sequences of one (seq_len, pairs); meta: ``pairs`` per example."""
    half = vocab_size // 2
    ctx = 2 * pairs
    space = (seq_len - ctx) // 2  # query slots: a key at an even offset, its value after it
    p = power_a * torch.arange(1, space + 1, dtype=torch.float64) ** (power_a - 1)
    inputs = torch.zeros(n, seq_len + 1, dtype=torch.long)
    targets = torch.full((n, seq_len + 1), IGNORE, dtype=torch.long)
    for i in range(n):
        keys = torch.randperm(half - 1, generator=g)[:pairs] + 1
        vals = torch.randperm(vocab_size - half, generator=g)[:pairs] + half
        inputs[i, 0:ctx:2], inputs[i, 1:ctx:2] = keys, vals
        gaps = torch.multinomial(p, pairs, replacement=False, generator=g)
        qpos = ctx + 2 * gaps
        inputs[i, qpos] = keys
        targets[i, qpos + 1] = vals  # the value follows its queried key
    if random_noise:
        noise = torch.randint(vocab_size, (n, seq_len + 1), generator=g)
        inputs = torch.where(inputs == 0, noise, inputs)
    # next-token framing: position t predicts token t + 1
    return Batch(inputs[:, :-1].contiguous(), targets[:, 1:].contiguous(),
                 {"pairs": torch.full((n,), pairs, dtype=torch.long)})


@register_task("mqar")
@dataclass(kw_only=True)
class MQAR(Task):
    """MQAR over a mix of (seq_len, pairs); each batch draws its examples evenly from the mix."""

    HAS_TEST_SPLIT = True

    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        "full": {"test_mix": MQAR_TEST_MIX},                   # Zoology's defaults
        "small": {"vocab_size": 256, "mix": ((64, 4), (64, 8), (128, 16)),          # minutes on a CPU
                  "test_mix": ((128, 8), (256, 16), (256, 32))},
        "tiny": {"vocab_size": 64, "mix": ((32, 4),), "test_mix": ((64, 4), (64, 8))},  # seconds (tests)
    }

    vocab_size: int = 8192
    mix: tuple[tuple[int, int], ...] = MQAR_TRAIN_MIX
    test_mix: tuple[tuple[int, int], ...] = ()  # the length-generalisation split; () = each of mix at twice the length
    power_a: float = 0.01
    random_noise: bool = True

    def __post_init__(self):
        self.check(self.vocab_size >= 8, "vocab_size", f"must be >= 8, got {self.vocab_size}")
        self.check(len(self.mix) > 0, "mix", "needs at least one (seq_len, pairs)")
        self.check(0 < self.power_a <= 1, "power_a", f"must be in (0, 1], got {self.power_a}")
        if not self.test_mix:
            self.test_mix = tuple((2 * T, m) for T, m in self.mix)
        for name in ("mix", "test_mix"):
            for T, m in getattr(self, name):
                self.check(m >= 1 and 4 * m <= T, name, f"({T}, {m}): need 1 <= pairs and 4 * pairs <= seq_len")
                self.check(m < self.vocab_size // 2, name, f"({T}, {m}): more pairs than keys in vocab {self.vocab_size}")

    def sample(self, n: int, seed: int, *, mix: tuple[tuple[int, int], ...] | None = None) -> Batch:
        """n sequences spread evenly over the (seq_len, pairs) of ``mix`` (default: the training mix)."""
        g = generator(seed)
        mix = mix or self.mix
        k = len(mix)
        counts = [n // k + (1 if i < n % k else 0) for i in range(k)]
        parts = [mqar_batch(c, vocab_size=self.vocab_size, seq_len=T, pairs=m, power_a=self.power_a,
                            random_noise=self.random_noise, g=g) for (T, m), c in zip(mix, counts) if c]
        return pad_cat(parts)

    def sample_test(self, n: int, seed: int) -> Batch:
        """The length-generalisation split: sequences of ``test_mix``, longer than training's."""
        return self.sample(n, seed, mix=self.test_mix)

    def chance(self) -> float:
        return 1.0 / (self.vocab_size - self.vocab_size // 2)

    @property
    def max_len(self) -> int:
        return max(T for T, _ in self.mix)


def tiny_mqar(**kw) -> MQAR:
    """A CPU-sized MQAR (vocab 64, 32 tokens, 4 pairs) for tests and quick runs."""
    return MQAR(**{**MQAR.PRESETS["tiny"], **kw})
