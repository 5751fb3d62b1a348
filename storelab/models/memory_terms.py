"""What a model's context memory costs, in two terms, and what fits beside the weights.

Every store config says its two terms (``StoreConfig.memory_terms``): bytes per token of
context (caches, index keys, compressed entries at their ratio) and bytes per sequence that
do not grow (recurrent states, convolution tails, window rings, compressors' open pools).
Here they are added up per layer and per model; at context L a batch of B sequences holds

    B * (bytes_per_token * L + bytes_per_sequence)

Formats, as engines keep them: the cache format (``CACHE_DTYPES``: f32, f16, bf16, fp8, fp4,
and llama.cpp's q8_0 / q4_0 blocks of 32 codes with an fp16 scale, 34 and 18 bytes) is
separate from the state format (``STATE_DTYPES``: recurrent states and open pools, f32 or
bf16). fp8/fp4 on DeepSeek's stores are their mixed entries (no-rope codes, a scale byte
per block, bf16 rope channels); on plain attention rows fp8 is one byte per number with
per-tensor scales, as vLLM keeps it. With no cache format given, each store is accounted in
its publisher's format (``published_cache_format()``: V4-Pro fp8, V4.1-Flash fp4), else bf16.

A checkpoint folder may state its cache format (``folder_cache_format``): compressed-tensors'
``quantization_config.kv_cache_scheme`` (``num_bits`` 8 / 4 of ``type`` "float": fp8 / fp4), ModelOpt's
``quantization_config.kv_cache_quant_algo`` ("FP8", "NVFP4"), or a ``kv_cache_dtype`` string ("fp8_e4m3");
``storelab memory --checkpoint`` takes it when no ``--cache-dtype`` is given, and says which field it
came from. A scheme storelab has no format for (int8 caches) is refused naming the field. Two more hints
an engine reads (``folder_dtypes``): the model's dtype (``dtype``, older ``torch_dtype``: vLLM's "auto"
formats) and ``mamba_ssm_dtype`` (Qwen3.5's "float32": the recurrent states' format in vLLM).

A layer that reads another layer's cache (``cache_owner``) holds none of its own: the shared
cache is counted once, at its owner.

Before a run allocates, ``check_run_fits`` holds the sizes a user gave (a context, a batch, a chunk)
against half this machine's memory, as ``check_fits`` holds a model's weights: ``run_bytes`` is the
weights (fp32), the cache at the context (fp32), the token ids, and the activations of one call on a
chunk, ``ACTIVATION_WIDTHS`` vectors of ``d_model`` plus the logits per token (in training: every
layer's, and AdamW's moments and the gradients): a floor, not a peak.
"""

from __future__ import annotations

import math
import re
from typing import Any

from storelab.models.config import ModelConfig
from storelab.stores.base import DTYPE_BYTES, STATE_DTYPES

__all__ = ["CACHE_DTYPES", "STATE_DTYPES", "WEIGHT_DTYPES", "cache_dtype", "state_dtype", "model_dtype",
           "weights_dtype", "parse_size", "folder_cache_format", "folder_dtypes", "layer_terms", "model_terms", "longest_contexts",
           "run_bytes", "check_run_fits", "GIB", "MIB"]

GIB, MIB, KIB = 1 << 30, 1 << 20, 1 << 10
CACHE_DTYPES = tuple(DTYPE_BYTES)   # fp32, bf16, fp16, fp8, fp4, q8_0, q4_0
WEIGHT_DTYPES = CACHE_DTYPES        # bytes per weight (block scales of fp8 weights are not counted)
_ALIASES = {"f32": "fp32", "float32": "fp32", "f16": "fp16", "float16": "fp16", "half": "fp16",
            "bfloat16": "bf16", "float8": "fp8", "f8": "fp8", "q8": "q8_0", "q4": "q4_0"}
_SHOWN = "f32, f16, bf16, fp8, fp4, q8_0, q4_0"
ACTIVATION_WIDTHS = 8  # d_model-wide fp32 vectors one layer's call holds per token (input, norms, q/k/v, out, ffn)


def _dtype(what: str, value: str, accepted: tuple[str, ...], shown: str) -> str:
    name = _ALIASES.get(str(value).strip().lower(), str(value).strip().lower())
    if name not in accepted:
        raise ValueError(f"{what}: unknown {value!r} (accepted: {shown})")
    return name


def cache_dtype(value: str | None) -> str | None:
    """The canonical cache format of a user's string (None: each store's published format)."""
    return None if value is None else _dtype("cache dtype", value, CACHE_DTYPES, _SHOWN)


def state_dtype(value: str) -> str:
    return _dtype("state dtype", value, STATE_DTYPES, "f32, bf16, f16")


def model_dtype(value: str, what: str = "model dtype") -> str:
    """A model's dtype (an engine's ``model_dtype``): fp32, bf16 or fp16."""
    return _dtype(what, value, ("fp32", "bf16", "fp16"), "f32, bf16, f16")


def weights_dtype(value: str) -> str:
    return _dtype("weights dtype", value, WEIGHT_DTYPES, _SHOWN)


def folder_cache_format(hf: dict) -> tuple[str, str] | None:
    """(cache format, the config field it came from) a checkpoint's config.json states, or None; the
    fields are read at the top and under ``text_config`` (multimodal wrappers)."""
    for where, d in (("", hf), ("text_config.", hf.get("text_config"))):
        q = d.get("quantization_config") if isinstance(d, dict) else None
        if not isinstance(q, dict):
            continue
        field = f"{where}quantization_config"
        scheme = q.get("kv_cache_scheme")
        if isinstance(scheme, dict):
            bits, kind = scheme.get("num_bits"), str(scheme.get("type", "float")).lower()
            fmt = {(8, "float"): "fp8", (4, "float"): "fp4"}.get((bits, kind))
            if fmt is None:
                raise ValueError(f"{field}.kv_cache_scheme: {bits}-bit {kind} caches have no format in storelab "
                                 f"(known: 8-bit and 4-bit float); give --cache-dtype")
            return fmt, f"{field}.kv_cache_scheme"
        algo = q.get("kv_cache_quant_algo")
        if algo:
            fmt = {"FP8": "fp8", "NVFP4": "fp4"}.get(str(algo).upper())
            if fmt is None:
                raise ValueError(f"{field}.kv_cache_quant_algo: {algo!r} has no format in storelab "
                                 f"(known: FP8, NVFP4); give --cache-dtype")
            return fmt, f"{field}.kv_cache_quant_algo"
        name = q.get("kv_cache_dtype")
        if isinstance(name, str) and name.lower() not in ("auto", ""):
            fmt = "fp8" if name.lower().startswith("fp8") else _ALIASES.get(name.lower(), name.lower())
            if fmt not in CACHE_DTYPES:
                raise ValueError(f"{field}.kv_cache_dtype: {name!r} has no format in storelab (accepted: {_SHOWN})")
            return fmt, f"{field}.kv_cache_dtype"
    return None


def folder_dtypes(hf: dict) -> dict[str, str]:
    """The formats a checkpoint's config.json names, canonical: ``model`` (``dtype`` or ``torch_dtype``) and
    ``ssm`` (``mamba_ssm_dtype``), each read at the top and under ``text_config``; absent when not named."""
    out: dict[str, str] = {}
    for d in (hf.get("text_config"), hf):
        if not isinstance(d, dict):
            continue
        for key, fields in (("model", ("dtype", "torch_dtype")), ("ssm", ("mamba_ssm_dtype",))):
            for f in fields:
                if isinstance(d.get(f), str) and key not in out:
                    out[key] = _dtype(f, d[f], STATE_DTYPES, "float32, bfloat16, float16")
    return out


_UNITS = {"": 1, "b": 1, "k": KIB, "kb": 10**3, "kib": KIB, "m": MIB, "mb": 10**6, "mib": MIB,
          "g": GIB, "gb": 10**9, "gib": GIB, "t": 1 << 40, "tb": 10**12, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes of a size such as "24GiB", "24 GB" (10^9), "1.5T" (a bare letter is binary), "4096"."""
    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise ValueError(f"budget: cannot read {text!r} as a size (examples: 24GiB, 80GB, 512MiB, 1.5T)")
    n = float(m.group(1)) * _UNITS[unit]
    if n <= 0:
        raise ValueError(f"budget: must be > 0, got {text!r}")
    return int(n)


def _format_of(st, cache: str | None) -> str:
    return cache or st.published_cache_format() or "bf16"


def filled(st, context: int) -> float:
    """The share of a store's fixed part held at ``context`` tokens (window rings and open pools fill
    with the first tokens; a recurrent state is whole from the first): its footprint at ``context`` less
    the per-token term, over the per-sequence term, in fp32 (the share does not depend on the format).
    Exact once ``context`` is past the windows and a multiple of the pooling strides."""
    ref = st.memory_terms(cache="fp32", state="fp32")
    if not ref.per_sequence:
        return 1.0
    fixed = st.footprint(context, dtype="fp32").state_bytes - ref.per_token * context
    return min(max(fixed / ref.per_sequence, 0.0), 1.0)


def layer_terms(cfg: ModelConfig, *, cache: str | None = None, state: str = "fp32",
                context: int | None = None) -> list[dict[str, Any]]:
    """One row per layer: bytes per token and per sequence of every store it holds, and the cache
    format each was taken in. ``bytes_per_sequence_full`` is the fixed part at its fullest;
    ``bytes_per_sequence`` is the same, or (given a ``context``) what of it is held at that context."""
    rows = []
    for i, lay in enumerate(cfg.layers):
        tok = per_seq = full = glob = 0.0
        fmts, token_fmt = [], ""
        for slot, st in lay.stores().items():
            if slot == "token" and not cfg.owns_cache(i):
                continue
            fmt = _format_of(st, cache)
            t = st.memory_terms(cache=fmt, state=state)
            share = filled(st, context) if context is not None and t.per_sequence else 1.0
            tok, glob = tok + t.per_token, glob + t.cache_per_token
            per_seq, full = per_seq + t.per_sequence * share, full + t.per_sequence
            if t.per_token or t.per_sequence:
                fmts.append(state if st.RECURRENT else fmt)
                token_fmt = fmts[-1] if slot == "token" else token_fmt
        rows.append({"layer": i, "kind": lay.token.KIND, "bytes_per_token": tok, "bytes_per_sequence": per_seq,
                     "bytes_per_sequence_full": full, "cache_bytes_per_token": glob, "formats": sorted(set(fmts)),
                     "token_format": token_fmt})
    return rows


def model_terms(cfg: ModelConfig, rows: list[dict[str, Any]], context: int, *, batch: int = 1) -> dict[str, Any]:
    """The model's two terms, and the bytes of ``batch`` sequences at ``context`` tokens."""
    if batch <= 0:
        raise ValueError(f"batch: must be > 0, got {batch}")
    tok = sum(r["bytes_per_token"] for r in rows)
    seq = sum(r["bytes_per_sequence"] for r in rows)
    return {"bytes_per_token": tok, "bytes_per_sequence": seq,
            "cache_bytes_per_token": sum(r["cache_bytes_per_token"] for r in rows),
            "batch": batch, "total_bytes": batch * (tok * context + seq)}


def weight_bytes(stored_params: int, dtype: str) -> int:
    return math.ceil(stored_params * DTYPE_BYTES[dtype])


def longest_contexts(per_token: float, per_sequence: float, *, budget: int, weights: int,
                     batches: list[int]) -> list[dict[str, Any]]:
    """Per batch size, the longest context whose memory fits in ``budget`` beside ``weights`` bytes:
    ``floor((budget - weights - B * per_sequence) / (B * per_token))``; None where any length fits
    (nothing grows), 0 where not even the fixed part fits."""
    out = []
    for b in batches:
        room = budget - weights - b * per_sequence
        if room < 0:
            L: int | None = 0
        elif per_token == 0:
            L = None
        else:
            L = int(room // (b * per_token))
        out.append({"batch": b, "context": L, "fits": L is None or L > 0})
    return out


def run_bytes(cfg: ModelConfig, *, tokens: int, batch: int = 1, chunk: int | None = None,
              training: bool = False) -> int:
    """What running ``cfg`` on ``batch`` sequences of ``tokens`` tokens holds at least, in bytes: fp32
    weights, the fp32 cache at ``tokens``, int64 ids, and one call's activations on ``chunk`` tokens
    (all of them when None); ``training``: every layer's activations (kept for the backward pass),
    and AdamW's two moments and the gradients beside the weights."""
    from storelab.models.accounting import count_params

    step = min(tokens, chunk) if chunk else tokens
    cache = model_terms(cfg, layer_terms(cfg, cache="fp32", state="fp32"), tokens, batch=batch)["total_bytes"]
    layers = cfg.n_layers if training else 1
    acts = batch * step * (ACTIVATION_WIDTHS * cfg.d_model * layers + cfg.vocab_size) * 4
    return int(count_params(cfg).stored * 4 * (4 if training else 1) + cache + batch * tokens * 8 + acts)


def check_run_fits(cfg: ModelConfig, *, tokens: int, option: str, instead: str, batch: int = 1,
                   chunk: int | None = None, training: bool = False) -> None:
    """Refuse, before anything is allocated, a run whose ``run_bytes`` exceed half this machine's memory;
    the message names ``option`` (the size the user gave) and says what to run ``instead``."""
    from storelab.models.config import machine_bytes

    need, have = run_bytes(cfg, tokens=tokens, batch=batch, chunk=chunk, training=training), machine_bytes()
    if have and need > have / 2:
        held = f"{batch:,} x {tokens:,} tokens" if batch > 1 else f"{tokens:,} tokens"
        raise ValueError(f"{option}: {held} of {cfg.name} hold at least {human_bytes(need, unit='GiB')} (weights, "
                         f"cache and activations), more than half of this machine's "
                         f"{human_bytes(have, unit='GiB')}; {instead}")


def human_bytes(n: float, *, unit: str | None = None) -> str:
    """"890 B", "64 KiB", "149.625 MiB", "16 GiB": at most three decimals, never split; ``unit`` forces one."""
    sizes = (("TiB", 1 << 40), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB), ("B", 1))
    for name, size in sizes:
        if name == unit or (unit is None and (abs(n) >= size or size == 1)):
            return f"{n / size:,.3f}".rstrip("0").rstrip(".") + f" {name}"
    raise ValueError(f"unit: must be one of {', '.join(u for u, _ in sizes)}, got {unit!r}")
