"""The ops' one input check: every tensor argument a floating-point ``torch.Tensor``.

An integer tensor would otherwise run through integer arithmetic and come back as integers, and a
NumPy array fails deep inside torch; ``float_tensors`` names the op and the argument instead.
"""

from __future__ import annotations

import torch


def float_tensors(op: str, **tensors) -> None:
    """Raise a ValueError naming ``op`` and the argument unless each given tensor (None skipped) is a
    floating-point torch.Tensor."""
    for name, t in tensors.items():
        if t is None:
            continue
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{op}: {name}: must be a torch.Tensor, got {type(t).__name__} "
                             "(torch.as_tensor(x, dtype=torch.float32) converts an array)")
        if not t.is_floating_point():
            raise ValueError(f"{op}: {name}: must be a floating-point tensor, got {t.dtype} (.float() converts it)")
