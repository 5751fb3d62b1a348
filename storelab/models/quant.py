"""Weight-only bf16 and int8 linear layers for CPU inference: ``quantize_weights(model, "int8")``.

``QuantLinear`` holds a ``PackedWeight`` (``storelab.ops.matvec``: bf16, or int8 with one scale per output
channel) in place of an ``nn.Linear``'s fp32 weight; activations stay fp32. One row (a decode step, and
``Decoder`` calls the kernel directly) is multiplied by the C kernel of its format, reading the narrow
weight; more rows (a prefill chunk) by torch's matmul in bf16, as llama.cpp multiplies its bf16 files: the rows
rounded to bf16, the products summed in fp32 by oneDNN's bf16 kernels (AVX-512 BF16 / AMX where the CPU has them)
and the outputs rounded to bf16, then widened (relative error <= 2^-9 each). Measured (Gemma 3 270M, 1,024 tokens
in chunks of 512, one thread, 2026-12-06): 668 tokens/s against 363 for the fp32 prefill and 414 for transformers'
fp32, the same greedy tokens after it (docs/bench.md). An int8 weight enters that product as bf16 (exactly: its
integers up to 127 fit bf16's 8 bits), its row scales applied to the output: a product of [512, 576] by [1536, 576]
took 3.7 against 8.8 ms on one thread (2.2 against 5.1 on two) when the weight was widened to fp32 for each call,
its error 3e-3 of the output's largest magnitude (the activations' rounding), the size of int8's own.

``quantize_weights(model, fmt)`` replaces, in place, the ``nn.Linear``s of the attention, window and FFN
stores and the LM head (the LM head of tied embeddings gets its own packed copy; the embedding table stays
as it is, a lookup reads one row of it); other stores, some of which read their projections' weights
directly, keep fp32. Inference only: a ``QuantLinear`` has no trainable weight.

What it costs in accuracy (tests/test_decode_fast.py, stated there as the tolerances): bf16 keeps 8 bits
of mantissa (relative error per weight <= 2^-9), int8 about 7 bits of each row's largest magnitude.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from storelab.ops.matvec import FORMATS, PackedWeight, bind, pack
from storelab.stores.attention import Attention, WindowAttention
from storelab.stores.ffn import FFN

__all__ = ["QuantLinear", "quantize_weights", "packed", "WEIGHT_FORMATS"]

WEIGHT_FORMATS = FORMATS  # "fp32" leaves the model as it is


class QuantLinear(nn.Module):
    """y = x W^T (+ b) with W held packed (bf16 or int8); x and y fp32."""

    def __init__(self, packed: PackedWeight):
        super().__init__()
        self.packed = packed
        self.in_features, self.out_features = packed.cols, packed.rows
        self._one = bind(packed)

    @classmethod
    def from_linear(cls, linear: nn.Linear, fmt: str) -> "QuantLinear":
        return cls(pack(linear.weight, fmt, linear.bias))

    def forward(self, x: Tensor) -> Tensor:
        if x.dtype != torch.float32:
            raise ValueError(f"x: a QuantLinear takes fp32 activations, got {x.dtype}")
        if x.numel() == self.in_features:  # one row: the kernel reads the narrow weight
            out = x.new_empty(self.out_features)
            return self._one(x.reshape(-1).contiguous(), out).view(*x.shape[:-1], self.out_features)
        b = self.packed.bias_N
        if self.packed.fmt == "bf16":   # many rows (a prefill): the product in bf16 (module docstring)
            y = F.linear(x.to(torch.bfloat16), self.packed.data_NK).float()
            return y if b is None else y.add_(b)
        # int8, many rows: q in bf16 (exact: |q| <= 127 fits its 8 bits), the product in bf16, the row scales after
        y = F.linear(x.to(torch.bfloat16), self.packed.data_NK.to(torch.bfloat16)).float().mul_(self.packed.scale_N)
        return y if b is None else y.add_(b)

    def nbytes(self) -> int:
        return self.packed.nbytes()

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, weights={self.packed.fmt}"


def packed(linear: nn.Module) -> PackedWeight:
    """The weight of an ``nn.Linear`` (fp32, not copied where contiguous) or of a ``QuantLinear`` (its own format)."""
    if isinstance(linear, QuantLinear):
        return linear.packed
    return pack(linear.weight, "fp32", linear.bias)


def quantize_weights(model: nn.Module, fmt: str) -> nn.Module:
    """Replace the linear layers of ``model.blocks`` and ``model.lm_head`` by ``QuantLinear``s of ``fmt``
    (module docstring); "fp32" changes nothing. Returns ``model``."""
    if fmt not in WEIGHT_FORMATS:
        raise ValueError(f"weights: must be one of {', '.join(WEIGHT_FORMATS)}, got {fmt!r}")
    if fmt == "fp32":
        return model
    if model.embed.weight.dtype != torch.float32:
        raise ValueError(f"weights: {fmt} weights take an fp32 model (activations fp32), got "
                         f"{model.embed.weight.dtype}; load it with dtype fp32")
    with torch.no_grad():
        stores = [m for b in model.blocks for m in (b.token, b.channel) if type(m) in _CALLS_ITS_LINEARS]
        for parent in [*stores, model]:
            for name, child in list(parent.named_children()):
                if type(child) is nn.Linear and (parent is not model or name == "lm_head"):
                    setattr(parent, name, QuantLinear.from_linear(child, fmt))
    return model


# the stores whose linear layers are only ever called (others read a projection's .weight, e.g. to stack q, k
# and v for one product, and keep fp32 weights); exact classes, as a subclass may read them otherwise
_CALLS_ITS_LINEARS = (Attention, WindowAttention, FFN)
