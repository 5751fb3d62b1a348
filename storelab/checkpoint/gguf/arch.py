"""What a GGUF architecture declares: ``Arch`` (metadata -> transformers config, tensor-name rules),
``Rule`` (one transformers tensor from GGUF tensors), ``Meta`` (typed metadata getters whose errors
name the file and key), and the transforms llama.cpp's converter applies, undone.

Every rule names the GGUF tensors by gguf-py's own constants (``gguf.constants.TENSOR_NAMES`` of a
``MODEL_TENSOR``, through ``g(...)``), so a name fact comes from llama.cpp, not from a string
typed here; ``tests/test_gguf.py`` holds every declared name to ``MODEL_TENSORS[arch]`` and every
transformers name to the candidates ``gguf.TensorNameMap`` maps onto it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from gguf.constants import MODEL_TENSOR, TENSOR_NAMES
from torch import Tensor

from storelab.checkpoint.shards import CheckpointError

__all__ = ["Arch", "Rule", "Meta", "g", "rule", "unpermute", "minus_one", "common_config", "rope_scaling",
           "LAYER"]

LAYER = "model.layers.{bid}"
_MISSING = object()


def g(kind: MODEL_TENSOR, suffix: str = ".weight") -> str:
    """The GGUF name template of a tensor kind (``blk.{bid}.attn_q.weight``), from gguf-py's TENSOR_NAMES."""
    return TENSOR_NAMES[kind] + suffix


@dataclass(frozen=True)
class Rule:
    """One transformers tensor: ``hf`` made from the GGUF tensors ``gguf`` (templates with ``{bid}`` for
    per-layer ones), by ``fn(*pieces)`` (None: the single piece as it is). A rule none of whose pieces
    the file holds is skipped (an optional bias, a tied head); a rule with some of them is an error
    naming the missing one. Several rules may give one ``hf`` name: the first complete one wins
    (llama.cpp's fused ``ffn_gate_up_exps`` before the separate gate and up)."""

    hf: str
    gguf: tuple[str, ...]
    fn: Callable[..., Tensor] | None = None
    what: str = ""

    def make(self, *pieces: Tensor) -> Tensor:
        return pieces[0] if self.fn is None else self.fn(*pieces)


def rule(hf: str, *gguf: str, fn: Callable[..., Tensor] | None = None, what: str = "") -> Rule:
    return Rule(hf, tuple(gguf), fn, what)


@dataclass(frozen=True)
class Arch:
    """A GGUF architecture storelab reads.

    * ``arch``: ``general.architecture`` (gguf-py ``MODEL_ARCH_NAMES``), e.g. ``"qwen3moe"``;
    * ``model_type``: the transformers ``model_type`` its config becomes (a family in
      ``storelab/checkpoint/families`` must read it);
    * ``config(meta) -> dict``: the transformers config.json fields from the metadata (without
      ``model_type``, added by the reader);
    * ``rules(hf) -> list[Rule]``: the transformers tensors, given that config;
    * ``ignored``: GGUF tensor names (regular expressions) read by nothing on purpose; any other tensor
      no rule uses is an error naming it;
    * ``config_tensors``: small tensors whose *values* ``config`` reads (``Meta.values``), the one exception to
      a header-only config: llama's ``rope_freqs.weight``, Llama 3's RoPE scaling as per-frequency factors.
      They are read by nothing else (no rule names them).
    """

    arch: str
    model_type: str
    config: Callable[["Meta"], dict]
    rules: Callable[[dict], list[Rule]]
    ignored: tuple[str, ...] = ()
    config_tensors: tuple[str, ...] = ()
    doc: str = field(default="", compare=False)


# the most a config-time tensor read (``Meta.values``) may read, as stored: a few hundred bytes in practice
SMALL_TENSOR_BYTES = 64 * 1024


class Meta:
    """Typed access to a GGUF's metadata; ``key`` without a dot is ``{general.architecture}.key``.

    Made from a ``Header`` (``Meta.of``), it can also read the values of the small tensors its architecture
    declares in ``Arch.config_tensors`` (``values``; ``readable`` is set by ``registry.config_from``), and
    counts the bytes that reads (``bytes_read``)."""

    def __init__(self, meta: dict, path: Path, shapes: dict[str, tuple[int, ...]], header=None):
        self.d, self.path, self.shapes = meta, Path(path), shapes
        self.arch = meta.get("general.architecture")
        self.header = header
        self.readable: tuple[str, ...] = ()
        self.bytes_read = 0

    @classmethod
    def of(cls, h) -> "Meta":
        return cls(h.meta, h.path, {n: t.shape for n, t in h.tensors.items()}, header=h)

    def values(self, name: str) -> Tensor:
        """The fp32 values of the small tensor ``name`` (one of ``readable``, at most ``SMALL_TENSOR_BYTES`` as
        stored), read now: a config made from it is no longer header-only, so only declared names are read."""
        from storelab.checkpoint.gguf.dequant import read_tensor

        if name not in self.readable or self.header is None:
            raise ValueError(f"{name!r}: not a config tensor of general.architecture {self.arch!r} "
                             f"(Arch.config_tensors: {self.readable})")
        t = self.header.tensors.get(name)
        if t is None:
            raise CheckpointError(f"{self.path}: tensor {name!r} missing (general.architecture {self.arch!r})")
        if t.nbytes > SMALL_TENSOR_BYTES:
            raise CheckpointError(f"{self.path}: tensor {name!r}: {t.nbytes} bytes, more than the "
                                  f"{SMALL_TENSOR_BYTES} a config-time read takes (damaged header?)")
        self.bytes_read += t.nbytes
        return read_tensor(self.header.folder, t)

    def full(self, key: str) -> str:
        return key if key.startswith(("general.", "tokenizer.", "split.")) else f"{self.arch}.{key}"

    def has(self, key: str) -> bool:
        return self.full(key) in self.d

    def raw(self, key: str, default=_MISSING):
        k = self.full(key)
        if k not in self.d:
            if default is _MISSING:
                raise CheckpointError(f"{self.path}: metadata key {k!r} missing (general.architecture {self.arch!r})")
            return default
        return self.d[k]

    def _err(self, key: str, want: str, v) -> CheckpointError:
        return CheckpointError(f"{self.path}: metadata {self.full(key)!r}: must be {want}, got {v!r}")

    def int(self, key: str, default=_MISSING, *, minimum: int = 0) -> int:
        v = self.raw(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise self._err(key, f"an integer >= {minimum}", v)
        return v

    def float(self, key: str, default=_MISSING) -> float:
        v = self.raw(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise self._err(key, "a number", v)
        return float(v)

    def str(self, key: str, default=_MISSING) -> str:
        v = self.raw(key, default)
        if not isinstance(v, str):
            raise self._err(key, "a string", v)
        return v

    def ints(self, key: str, n: int) -> list[int]:
        """A per-layer integer: a list of n, or one integer for every layer."""
        v = self.raw(key)
        vals = v if isinstance(v, list) else [v] * n
        if len(vals) != n or any(isinstance(x, bool) or not isinstance(x, int) or x < 0 for x in vals):
            raise self._err(key, f"an integer or a list of {n} integers (one per layer)", v)
        return vals

    def tensor_shape(self, name: str) -> tuple[int, ...]:
        if name not in self.shapes:
            raise CheckpointError(f"{self.path}: tensor {name!r} missing (general.architecture {self.arch!r})")
        return self.shapes[name]


def rope_scaling(m: Meta) -> dict | None:
    """``rope.scaling.type`` (+ ``factor``, ``original_context_length``) as transformers' ``rope_scaling``;
    None for none. llama.cpp names the types none / linear / yarn / longrope (gguf-py RopeScalingType)."""
    kind = m.str("rope.scaling.type", "none")
    if kind == "none":
        return None
    out = {"rope_type": kind, "factor": m.float("rope.scaling.factor")}
    if m.has("rope.scaling.original_context_length"):
        out["original_max_position_embeddings"] = m.int("rope.scaling.original_context_length", minimum=1)
    return out


def common_config(m: Meta) -> dict:
    """The fields llama.cpp's ``TextModel.set_gguf_parameters`` writes for every decoder, as transformers names
    them: widths, depth, heads, head size (``attention.key_length``, else width / heads), eps, rope, context;
    the vocabulary from ``token_embd``'s rows (``vocab_size`` is not always written); tied when the file
    has no ``output.weight`` (llama.cpp reuses ``token_embd`` then)."""
    D = m.int("embedding_length", minimum=1)
    n = m.int("block_count", minimum=1)
    H = m.int("attention.head_count", minimum=1)
    # one count, or one per layer (0 on layers without attention: LFM2, the hybrids); the largest is the heads'
    kv = m.ints("attention.head_count_kv", n) if m.has("attention.head_count_kv") else [H]
    if max(kv) < 1:
        raise m._err("attention.head_count_kv", "at least 1 on some layer", m.raw("attention.head_count_kv"))
    hf = {"hidden_size": D, "num_hidden_layers": n, "num_attention_heads": H, "num_key_value_heads": max(kv),
          "head_dim": m.int("attention.key_length", D // H, minimum=1),
          "rms_norm_eps": m.float("attention.layer_norm_rms_epsilon", 1e-6),
          "rope_theta": m.float("rope.freq_base", 10000.0),
          "max_position_embeddings": m.int("context_length", 0),
          "vocab_size": m.tensor_shape("token_embd.weight")[0],
          "tie_word_embeddings": "output.weight" not in m.shapes}
    if m.has("feed_forward_length"):
        hf["intermediate_size"] = m.int("feed_forward_length", minimum=1)
    if (scaling := rope_scaling(m)) is not None:
        hf["rope_scaling"] = scaling
    return hf


def unpermute(n_head: int) -> Callable[[Tensor], Tensor]:
    """Undo ``LlamaModel.permute`` of llama.cpp's converter (convert_hf_to_gguf.py / conversion/llama.py),
    which reorders each head's rows from transformers' half-split RoPE pairs to GGML's interleaved
    ones: ``w.reshape(n_head, 2, d/2, ...).swapaxes(1, 2)``; its inverse reshapes to
    ``(n_head, d/2, 2, ...)`` and swaps back (transformers' ``LlamaTensorProcessor._reverse_permute_weights``).
    ``n_head`` is the query heads for q, the key-value heads for k; biases are permuted alike."""

    def fn(w: Tensor) -> Tensor:
        rows = w.shape[0]
        return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)

    return fn


def minus_one(w: Tensor) -> Tensor:
    """Gemma's RMSNorm weights: llama.cpp stores 1 + w (``norm_shift``), transformers keeps w."""
    return w - 1.0


def cat_rows(*ws: Tensor) -> Tensor:
    """Experts' gate and up ``[E, I, D]`` each -> transformers' ``gate_up_proj`` ``[E, 2I, D]`` (gate first)."""
    return torch.cat(ws, dim=1)
