"""What an inference engine allocates for a model's state, beside the ideal.

The accounting (``storelab.models.accounting``) counts what a store needs to keep: a window layer its
last W entries, a full cache one entry per token. An engine allocates by its own conventions, and a
user sizing a machine wants those bytes. Every rule here asks each store config only for what it
declares (``memory_terms``, ``cache_entry_bytes``, ``cache_window``, ``cache_chunk``,
``conv_input_bytes``, ``conv_width``, ``RECURRENT``, ``footprint``), never its kind's name, so a new store
is ruled by what it says.

``engine_layers(cfg, L, batch=B, engine=...)`` gives, per layer, the bytes the engine holds for B
sequences of L tokens and the rule it applied; ``state_bytes(cfg, seen, engine="transformers")`` the
transformers cache per store kind, measured against transformers in ``tests/test_families.py`` and
``tests/test_engines.py``.

Engines and their rules (``L``: tokens per sequence, ``B``: sequences, ``pad(x, n)``: x rounded up to
a multiple of n, ``cdiv``: division rounded up):

* ``ideal``: each store's two terms, ``B (bytes_per_token L + bytes_per_sequence)``: what the next
  token needs (storelab's own caches hold exactly this, ``tests/test_state_protocol.py``).

* ``transformers`` (5.23, ``DynamicCache`` after one prefill call of ``seen`` tokens; rules read from
  ``transformers/cache_utils.py`` and measured on every family's tiny model): a cache that grows with
  the context holds one entry per token, as the ideal; a window or chunk layer
  (``DynamicSlidingWindowLayer``) returns a view of its last W - 1 entries, but the view keeps the
  storage of the whole prefill's keys and values alive until the next call, so it holds ``seen``
  entries, plus the 8 bytes of its int64 ``_sliding_window_tensor``. (After a decoding step it holds
  W entries' storage; the rule here is the one after a prefill.) A short convolution, LFM2's or the one
  in front of a Mamba, Gated DeltaNet or KDA store (``LinearAttentionLayer.conv_states``), keeps the
  kernel's whole window, W inputs (zeros before the first), where the next token needs W - 1: one input
  more than the ideal (``conv_input_bytes``). Keys, values and states are in the model's dtype
  (``model_dtype``: ``storelab memory`` reads it from the checkpoint's ``dtype`` / ``torch_dtype``; a folder
  saved in float32 keeps a float32 cache), unless ``--cache-dtype`` says; without one, each store's
  published format, else bf16.

* ``llama.cpp`` (ggml-org/llama.cpp; ``src/llama-context.cpp``, ``src/llama-kv-cache.cpp``,
  ``src/llama-kv-cache-iswa.cpp`` at 02c28f533ebba3e4ea944fc4a0719a012b3e7097,
  ``src/llama-memory-recurrent.cpp`` at 0054ee8ca80bb64d4a56eec854f2753cab5b51be and
  ``src/llama-model.cpp``'s ``create_memory``): B sequences of L tokens need ``-c B L -np B``; the
  context is padded, ``n_ctx = pad(B L, 256)``, and each sequence has a stream of its own of
  ``n_ctx_seq = pad(n_ctx / B, 256)`` cells (``kv_unified`` false: the library's default, and
  llama-server's with ``-np B``); with ``kv_unified`` (``-kvu``, llama-server's automatic slots) one
  stream of ``n_ctx`` cells that any sequence takes. K and V are kept in ``type_k`` / ``type_v``, f16
  unless ``--cache-dtype`` says (q8_0, q4_0: blocks of 32 codes with an f16 scale).

  - a full cache: ``n_ctx_seq`` cells per stream of the layer's entry (K and V, or MLA's latent row),
    the bytes per token x the cells; a store's fixed part (DeepSeek-V4's pools) beside it, per sequence;
  - a window or chunk layer (``llama_kv_cache_iswa``; llama.cpp keeps Llama 4's chunks as an SWA cache
    with ``n_swa`` = the chunk): per stream ``pad(min(n_ctx_seq, W + n_ubatch), 256)`` cells
    (``n_ubatch`` = 512), ``pad(min(n_ctx, W B + n_ubatch), 256)`` in a unified cache, or ``n_ctx_seq``
    with ``swa_full``;
  - a recurrent layer or a short convolution (``llama_memory_recurrent``, also the recurrent half of
    ``llama_memory_hybrid``): ``max(1, n_seq_max)`` = B rows of ``r`` (the convolution's last W - 1
    inputs) and ``s`` (the state), both created ``GGML_TYPE_F32`` whatever the KV type: the store's
    fixed part in f32 per sequence.

  Checked against published logs (``tests/test_engines.py``): Qwen3.5/3.6-27B, 16,384 MiB of f16 KV at
  262,144 cells and 149.625 MiB of f32 R + S per sequence; Kimi-K2 (MLA: the latent and rotary key per
  cell, no V), 4,392 MiB of f16 at 65,536 cells; Gemma-4-12B with ``-c 8192 -np 2``, 4,096 full cells and
  1,536 SWA cells (1,024 + 512) per sequence, 128 + 960 MiB.

* ``vllm`` (``kv_cache_dtype`` "auto": each store's published format, else ``model_dtype``; vllm-project/vllm; ``vllm/v1/kv_cache_interface.py`` at
  001cabc1be16a59a70d720ed61a13b678c060a18: ``FullAttentionSpec``, ``SlidingWindowSpec``,
  ``ChunkedLocalAttentionSpec``, ``MambaSpec``; ``vllm/platforms/interface.py``'s hybrid block size,
  ``HybridAttentionMambaModelConfig`` before it; ``vllm/v1/core/kv_cache_utils.py`` adds each layer's
  ``max_memory_usage_bytes`` for a request): pages of ``block_size`` = 16 tokens, per sequence

  - a full cache: ``cdiv(L, block) block`` tokens of the layer's bytes per token (its fixed part as is);
  - a window: ``(cdiv(min(W - 1 + M, L), block) + 1) block`` tokens, ``M`` = ``max_num_batched_tokens``
    (8,192: the API server's default on a large GPU; an argument here), the last page maybe partial;
  - a chunk: ``cdiv(min(C + M, L), block) block`` tokens;
  - a recurrent layer or a short convolution (``MambaSpec``, ``mamba_cache_mode`` "none"): one page of
    its state: the convolution's W - 1 inputs in the model's dtype (``mamba_cache_dtype`` "auto"; bf16)
    and the state in ``mamba_ssm_cache_dtype`` (the ``state`` argument: ``storelab memory`` takes the
    config's ``mamba_ssm_dtype``, float32 in Qwen3.5's, else the model's dtype, unless --state-dtype).
    In a hybrid model the attention page must hold a state page: the block grows to
    ``16 cdiv(state_page, 16 attn_bytes_per_token)``
    tokens (the first full-attention layer's bytes per token) and every state page is padded to that
    attention page (``mamba_page_size_padded``).

  Checked against vLLM's DeepSeek-V4-Pro figure (9.62 GiB of bf16 cache per sequence at 2^20 tokens:
  the compressed caches and index keys, whole pages at that length) with the window rings beside it, and
  its logs of the hybrid block: Qwen3.5-0.8B 544 tokens (state page padded by 2.64 %), Qwen3.5-27B 784,
  Qwen3-Next-80B 544 (padded by 1.49 %).

A store's other fixed part (Engram's last ids) is taken as the ideal's. MLA's latent row, DeepSeek's
compressed entries and index keys are each engine's per-token bytes as the store states them in the
chosen format; llama.cpp and vLLM keep V4's caches in pools of their own kind, whose fixed part (window
rings, open pools) is taken here as the store's.
"""

from __future__ import annotations

import math
from typing import Any

from storelab.models.config import ModelConfig

__all__ = ["ENGINES", "LlamaCpp", "VLLM", "engine_cache_format", "engine_layers", "engine_options",
           "engine_state_format", "state_bytes", "store_state_bytes"]

ENGINES = ("ideal", "transformers", "llama.cpp", "vllm")
SLIDING_TENSOR_BYTES = 8  # transformers' DynamicSlidingWindowLayer._sliding_window_tensor (int64 scalar)
# transformers' settings: the model's dtype, which its DynamicCache keeps keys and values in (a folder saved in
# float32 and loaded with its own dtype keeps a float32 cache); ``storelab memory`` takes it from config.json
INT_MAX = 2**31 - 1  # llama.cpp's command line reads its counts with std::stoi (an int)
MODEL_DTYPES = ("fp32", "bf16", "fp16")  # a model's dtype, as the engines load it (torch_dtype / --dtype)
TRANSFORMERS_OPTIONS = {"model_dtype": MODEL_DTYPES}
TRANSFORMERS_CACHES = MODEL_DTYPES  # DynamicCache keeps keys and values in the model's dtype


def _pad(x: int, n: int) -> int:
    return -(-x // n) * n


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_engine(engine: str) -> None:
    if engine not in ENGINES:
        raise ValueError(f"engine: unknown {engine!r} (known: {', '.join(ENGINES)})")


# ---------------------------------------------------------------------------- transformers
def store_state_bytes(st, seen: int, *, engine: str, dtype: str) -> int:
    """Bytes one store's state occupies in ``engine`` after a prefill of ``seen`` tokens, one sequence
    (``ideal`` or ``transformers``; llama.cpp and vLLM allocate per model: ``engine_layers``)."""
    _check_engine(engine)
    if engine not in ("ideal", "transformers"):
        raise ValueError(f"engine: {engine!r} allocates for the whole model and batch; use engine_layers")
    fp = st.footprint(seen, dtype=dtype)
    if engine == "ideal":
        return fp.state_bytes
    entry = st.cache_entry_bytes(dtype)
    if entry > 0 and (st.cache_window() or st.cache_chunk()):  # a window: the whole prefill's storage
        return int(seen * entry) + SLIDING_TENSOR_BYTES
    conv = st.conv_input_bytes(dtype) if seen else 0  # the conv state's W-th input
    return fp.state_bytes + int(conv)


def state_bytes(cfg: ModelConfig, seen: int, *, engine: str = "ideal", dtype: str = "fp32") -> dict[str, int]:
    """Bytes per store kind after a prefill of ``seen`` tokens in ``engine`` (a shared cache once, at its owner)."""
    out: dict[str, int] = {}
    for i, lay in enumerate(cfg.layers):
        for slot, st in _held(cfg, i):
            b = store_state_bytes(st, seen, engine=engine, dtype=st.cache_format or dtype)
            if b or slot == "token":
                out[st.KIND] = out.get(st.KIND, 0) + b
    return out


def _state_rows(st) -> bool:
    """Whether the store keeps what llama.cpp's recurrent memory and vLLM's ``MambaSpec`` hold: a recurrent
    state or a short convolution's inputs (LFM2's are a ``MambaSpec`` and an r row too), by its declarations."""
    return st.RECURRENT or st.conv_input_bytes("fp32") > 0


def _held(cfg: ModelConfig, i: int):
    """The (slot, store) pairs whose state layer ``i`` holds (a reader of another's cache: not its token store)."""
    return [(slot, st) for slot, st in cfg.layers[i].stores().items() if slot != "token" or cfg.owns_cache(i)]


# ---------------------------------------------------------------------------- llama.cpp and vLLM
class LlamaCpp:
    """llama.cpp's allocation for ``batch`` sequences of ``context`` tokens (module docstring)."""

    name = "llama.cpp"
    OPTIONS = {"n_ubatch": range(1, INT_MAX + 1), "swa_full": bool, "kv_unified": bool}  # -ub, -swa-full, -kvu
    CACHES = ("fp32", "fp16", "bf16", "q8_0", "q4_0")  # -ctk / -ctv: f32, f16, bf16, q8_0, q4_0 (and others)
    CTX_PAD = 256          # llama-context.cpp: cparams.n_ctx = GGML_PAD(cparams.n_ctx, 256)
    SWA_PAD = 256          # llama-kv-cache-iswa.cpp: the SWA cache is always padded to 256
    DEFAULT_CACHE = "fp16"  # llama_context_default_params: type_k = type_v = GGML_TYPE_F16
    STATE = "fp32"          # create_memory: llama_memory_recurrent(type_r = type_s = GGML_TYPE_F32)

    def __init__(self, context: int, batch: int, *, n_ubatch: int = 512, swa_full: bool = False,
                 kv_unified: bool = False):
        self.context, self.batch, self.n_ubatch, self.swa_full = context, batch, n_ubatch, swa_full
        self.kv_unified = kv_unified
        self.n_ctx = _pad(batch * context, self.CTX_PAD)
        # one stream of n_ctx cells, or one stream per sequence of n_ctx_seq cells (llama-context.cpp)
        self.streams = 1 if kv_unified else batch
        self.n_ctx_seq = self.n_ctx if kv_unified else _pad(self.n_ctx // batch, self.CTX_PAD)

    def settings(self) -> dict[str, Any]:
        return {"n_ctx": self.n_ctx, "n_seq_max": self.batch, "n_ubatch": self.n_ubatch, "swa_full": self.swa_full,
                "kv_unified": self.kv_unified}

    def cache_format(self, st, cache: str | None) -> str:
        return cache or self.DEFAULT_CACHE

    def store_bytes(self, st, *, cache: str, state: str) -> tuple[float, str]:
        B, W = self.batch, st.cache_window() or st.cache_chunk()
        entry = st.cache_entry_bytes(cache)
        t = st.memory_terms(cache=cache, state=self.STATE)
        S, size = self.streams, self.n_ctx_seq  # streams, and the cells of each
        if W and entry:
            seqs = B if self.kv_unified else 1  # the sequences one stream's window serves
            cells = size if self.swa_full else _pad(min(size, W * seqs + self.n_ubatch), self.SWA_PAD)
            how = ("n_ctx_seq (swa_full)" if self.swa_full
                   else f"pad(min({size:,}, {W} x {seqs} + {self.n_ubatch}), 256)")
            return S * cells * entry, f"SWA cache: {S} x {cells:,} cells = {how}"
        if t.per_token:
            rule = f"KV cache: {S} x {size:,} cells (n_ctx = pad({B} x {self.context:,}, 256))"
            if t.per_sequence:
                rule += "; fixed part per sequence"
            return S * size * t.per_token + B * t.per_sequence, rule
        if t.per_sequence and _state_rows(st):
            return B * t.per_sequence, f"recurrent r + s rows in f32, {B} (n_seq_max)"
        if t.per_sequence:
            fixed = st.memory_terms(cache=cache, state=state).per_sequence
            return B * fixed, "fixed part per sequence, as the ideal"
        return 0.0, ""


class VLLM:
    """vLLM's allocation for ``batch`` sequences of ``context`` tokens (module docstring)."""

    name = "vllm"
    OPTIONS = {"max_num_batched_tokens": range(1, INT_MAX + 1), "block_size": (1, 8, 16, 32, 64, 128, 256),
               "model_dtype": MODEL_DTYPES}  # CacheConfig's BlockSize values
    CACHES = ("fp32", "bf16", "fp16", "fp8")  # kv_cache_dtype: auto (the model's), bfloat16, fp8 (e4m3, e5m2)
    BLOCK = 16         # CacheConfig.block_size; the CUDA kernels' block alignment (16)

    def __init__(self, context: int, batch: int, *, max_num_batched_tokens: int = 8192, block_size: int = BLOCK,
                 model_dtype: str = "bf16"):
        self.context, self.batch, self.M, self.block = context, batch, max_num_batched_tokens, block_size
        self.model_dtype = model_dtype  # the convolution states' format (mamba_cache_dtype "auto")
        self.state_page = 0  # a hybrid model's padded state page (set by ``fit``)
        self.ssm = ""        # the states' format (mamba_ssm_cache_dtype; set by ``fit``)

    def settings(self) -> dict[str, Any]:
        return {"block_size": self.block, "max_num_batched_tokens": self.M, "state_page_bytes": self.state_page,
                "model_dtype": self.model_dtype, "ssm_dtype": self.ssm}

    def page(self, st, *, cache: str, state: str) -> float:
        """One ``MambaSpec`` page of a store: its convolution's W - 1 inputs in the model's dtype, the state
        (the rest of its fixed part) in ``state``."""
        tail = max(st.conv_width() - 1, 0)
        fixed = st.memory_terms(cache=cache, state=state).per_sequence
        return fixed - tail * st.conv_input_bytes(state) + tail * st.conv_input_bytes(self.model_dtype)

    def cache_format(self, st, cache: str | None) -> str:
        """``kv_cache_dtype`` "auto": the store's published format, else the model's dtype."""
        return cache or st.published_cache_format() or self.model_dtype

    def fit(self, stores: list, *, cache: str | None, state: str) -> None:
        """The hybrid rule: with both attention and recurrent layers, grow the block until one attention page
        holds the largest state page, and pad every state page to it."""
        self.ssm = state
        full = [s for s in stores if s.memory_terms(cache=self.cache_format(s, cache), state=state).per_token
                and not (s.cache_window() or s.cache_chunk())]
        pages = [self.page(s, cache=self.cache_format(s, cache), state=state) for s in stores
                 for t in [s.memory_terms(cache=self.cache_format(s, cache), state=state)]
                 if _state_rows(s) and not t.per_token and t.per_sequence]
        if not full or not pages:
            return
        per_token = full[0].cache_entry_bytes(self.cache_format(full[0], cache))
        need = self.BLOCK * _cdiv(math.ceil(max(pages)), self.BLOCK * math.ceil(per_token))
        self.block = max(self.block, need)
        self.state_page = self.block * per_token

    def store_bytes(self, st, *, cache: str, state: str) -> tuple[float, str]:
        B, L, bs = self.batch, self.context, self.block
        W, C = st.cache_window(), st.cache_chunk()
        entry = st.cache_entry_bytes(cache)
        t = st.memory_terms(cache=cache, state=state)
        if W and entry:
            tokens = (_cdiv(min(W - 1 + self.M, L), bs) + 1) * bs
            return B * tokens * entry, f"SlidingWindowSpec: {tokens:,} tokens in pages of {bs}"
        if C and entry:
            tokens = _cdiv(min(C + self.M, L), bs) * bs
            return B * tokens * entry, f"ChunkedLocalAttentionSpec: {tokens:,} tokens in pages of {bs}"
        if t.per_token:
            tokens = _cdiv(L, bs) * bs
            rule = f"FullAttentionSpec: {tokens:,} tokens in pages of {bs}"
            rule += "; fixed part as is" if t.per_sequence else ""
            return B * (tokens * t.per_token + t.per_sequence), rule
        if t.per_sequence and _state_rows(st):
            own = self.page(st, cache=cache, state=state)
            page = max(own, self.state_page)
            padded = f" (its {math.ceil(own):,} B padded to the attention page)" if page > own else ""
            return B * page, f"MambaSpec: one page of {math.ceil(page):,} B{padded}"
        if t.per_sequence:
            return B * t.per_sequence, "fixed part per sequence, as the ideal"
        return 0.0, ""


def engine_cache_format(engine: str, cache: str | None, model_dtype: str | None = None) -> str:
    """The cache format ``engine`` keeps when asked for ``cache`` ("published": each store's publisher's,
    else bf16; transformers with the model's dtype known: that dtype)."""
    _check_engine(engine)
    if engine == "transformers" and model_dtype:
        return cache or model_dtype
    return cache or (LlamaCpp.DEFAULT_CACHE if engine == "llama.cpp" else "published")


def engine_state_format(engine: str, state: str) -> str:
    """The format ``engine`` keeps recurrent states in when asked for ``state`` (llama.cpp: always f32)."""
    _check_engine(engine)
    return LlamaCpp.STATE if engine == "llama.cpp" else state


def check_engine_cache(engine: str, cache: str | None) -> None:
    """Refuse a cache format ``engine`` cannot keep (llama.cpp has no fp8 or fp4 cache, vLLM no q4_0,
    transformers' DynamicCache only the model's dtypes), naming the engine's formats."""
    _check_engine(engine)
    have = {"llama.cpp": LlamaCpp.CACHES, "vllm": VLLM.CACHES, "transformers": TRANSFORMERS_CACHES}.get(engine)
    if cache is not None and have is not None and cache not in have:
        raise ValueError(f"--cache-dtype {cache}: {engine} keeps no {cache} cache (it keeps "
                         f"{', '.join(have)}; --engine ideal for what the stores need in {cache})")


def engine_options(engine: str, pairs: list[str]) -> dict[str, Any]:
    """An engine's settings from ``KEY=VALUE`` strings (``storelab memory --engine-option``), each checked
    against what the engine accepts (``OPTIONS``): a boolean (true/false), a whole number in its range or
    among its values, or a model dtype."""
    _check_engine(engine)
    known = {"llama.cpp": LlamaCpp.OPTIONS, "vllm": VLLM.OPTIONS, "transformers": TRANSFORMERS_OPTIONS}.get(engine, {})
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or key not in known:
            raise ValueError(f"engine option: {pair!r} is not KEY=VALUE with a key of {engine} "
                             f"(known: {', '.join(known) or 'none'})")
        accepted = known[key]
        if accepted is bool:
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"engine option {key}: must be true or false, got {value!r}")
            out[key] = value.lower() in ("true", "1")
        elif accepted is MODEL_DTYPES:
            from storelab.models.memory_terms import model_dtype

            out[key] = model_dtype(value, f"engine option {key}")
        else:  # whole numbers: a range or the values the engine takes
            shown = (f"a whole number from {accepted.start:,} to {accepted.stop - 1:,}" if isinstance(accepted, range)
                     else f"one of {', '.join(map(str, accepted))}")
            if not value.isdigit() or int(value) not in accepted:
                raise ValueError(f"engine option {key}: must be {shown} ({engine} takes no other), got {value!r}")
            out[key] = int(value)
    return out


def engine_layers(cfg: ModelConfig, context: int, *, batch: int = 1, engine: str = "ideal",
                  cache: str | None = None, state: str = "fp32", **settings) -> dict[str, Any]:
    """Per layer, the bytes ``engine`` holds for ``batch`` sequences of ``context`` tokens and the rule it
    applied; ``settings`` are the engine's (llama.cpp: ``n_ubatch``, ``swa_full``, ``kv_unified``; vLLM:
    ``max_num_batched_tokens``, ``block_size``, ``model_dtype``). ``cache`` None: the engine's default
    format (llama.cpp f16; vLLM and the ideal each store's published format, else bf16); ``state``: the
    recurrent states' format (llama.cpp keeps f32 whatever it is; vLLM's ``mamba_ssm_cache_dtype``)."""
    from storelab.models.memory_terms import layer_terms

    _check_engine(engine)
    if context <= 0 or batch <= 0:
        raise ValueError(f"context, batch: must be > 0, got {context}, {batch}")
    rows = []
    if settings and engine == "ideal" or set(settings) - set(TRANSFORMERS_OPTIONS) and engine == "transformers":
        takes = ", ".join(TRANSFORMERS_OPTIONS) if engine == "transformers" else "none"
        raise ValueError(f"engine option: {engine} takes {takes}, got {', '.join(settings)}")
    if engine == "ideal":
        for t in layer_terms(cfg, cache=cache, state=state, context=context):
            held = batch * (t["bytes_per_token"] * context + t["bytes_per_sequence"])
            rows.append({"layer": t["layer"], "bytes": held, "rule": "ideal: the stores' two terms"})
        return {"engine": engine, "settings": {}, "layers": rows, "total_bytes": sum(r["bytes"] for r in rows)}
    if engine == "transformers":  # keys and values in the model's dtype when it is known, unless ``cache`` says
        model = settings.get("model_dtype")
        for i in range(cfg.n_layers):
            b = sum(store_state_bytes(st, context, engine="transformers",
                                      dtype=st.cache_format or cache or model or st.published_cache_format() or "bf16")
                    for _, st in _held(cfg, i))
            rows.append({"layer": i, "bytes": batch * b, "rule": "DynamicCache after a prefill of the context"})
        return {"engine": engine, "settings": dict(settings), "layers": rows,
                "total_bytes": sum(r["bytes"] for r in rows)}
    eng = (LlamaCpp if engine == "llama.cpp" else VLLM)(context, batch, **settings)
    if isinstance(eng, VLLM):
        eng.fit([st for i in range(cfg.n_layers) for _, st in _held(cfg, i)], cache=cache, state=state)
    for i in range(cfg.n_layers):
        b, rules = 0.0, []
        for _, st in _held(cfg, i):
            fmt = st.cache_format or eng.cache_format(st, cache)
            sb, rule = eng.store_bytes(st, cache=fmt, state=state)
            b += sb
            rules += [rule] if rule else []
        rows.append({"layer": i, "bytes": math.ceil(b), "rule": "; ".join(rules) or "nothing kept"})
    return {"engine": engine, "settings": eng.settings(), "layers": rows,
            "total_bytes": sum(r["bytes"] for r in rows)}
