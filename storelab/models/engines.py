"""What an inference engine allocates for a model's state, beside the ideal.

The accounting (``storelab.models.accounting``) counts what a store needs to keep: a window layer its
last W entries, a full cache one entry per token. An engine allocates by its own conventions, and a
user sizing a machine wants those bytes. ``state_bytes(cfg, seen, engine=...)`` gives them per store
kind, asking each store config only for what it declares (its ``footprint`` and
``cache_entry_bytes``), never its kind's name.

Engines and their rules:

* ``ideal``: each store's ``footprint`` (what the next token needs; storelab's own caches hold exactly
  this, ``tests/test_state_protocol.py``).
* ``transformers`` (5.23, ``DynamicCache`` after one prefill call of ``seen`` tokens; rules read from
  ``transformers/cache_utils.py`` and measured on every family's tiny model in
  ``tests/test_families.py``): a cache that grows with the context holds one entry per token, as the
  ideal; a window layer (``DynamicSlidingWindowLayer``) returns a view of its last W - 1 entries, but
  the view keeps the storage of the whole prefill's keys and values alive until the next call, so it
  holds ``seen`` entries, plus the 8 bytes of its int64 ``_sliding_window_tensor``. (After a decoding
  step it holds W entries' storage; the rule here is the one after a prefill.) A short convolution
  (``LinearAttentionLayer.conv_states``) keeps the kernel's whole window, W inputs (zeros before the
  first), where the next token needs W - 1: one input more than the ideal (``conv_input_bytes``).

llama.cpp and vLLM keep their own rules (cells padded to a multiple, pages of 16 tokens, hybrid
pools); they are not written here yet, and asking for them is an error that says so.
"""

from __future__ import annotations

from storelab.models.config import ModelConfig

__all__ = ["ENGINES", "state_bytes", "store_state_bytes"]

ENGINES = ("ideal", "transformers")
FAR = 1 << 20  # past any window
SLIDING_TENSOR_BYTES = 8  # transformers' DynamicSlidingWindowLayer._sliding_window_tensor (int64 scalar)


def store_state_bytes(st, seen: int, *, engine: str, dtype: str) -> int:
    """Bytes one store's state occupies in ``engine`` after a prefill of ``seen`` tokens."""
    if engine not in ENGINES:
        raise ValueError(f"engine: unknown {engine!r} (known: {', '.join(ENGINES)}; llama.cpp and vllm: not yet)")
    fp = st.footprint(seen, dtype=dtype)
    if engine == "ideal":
        return fp.state_bytes
    entry = st.cache_entry_bytes(dtype)
    # a window: its entries stop growing with the context
    bounded = entry > 0 and st.footprint(FAR, dtype=dtype).kept == st.footprint(2 * FAR, dtype=dtype).kept
    if bounded:
        return int(seen * entry) + SLIDING_TENSOR_BYTES
    conv = st.conv_input_bytes(dtype) if seen else 0  # the conv state's W-th input
    return fp.state_bytes + int(conv)


def state_bytes(cfg: ModelConfig, seen: int, *, engine: str = "ideal", dtype: str = "fp32") -> dict[str, int]:
    """Bytes per store kind after a prefill of ``seen`` tokens in ``engine`` (a shared cache once, at its owner)."""
    out: dict[str, int] = {}
    for i, lay in enumerate(cfg.layers):
        for slot, st in lay.stores().items():
            if slot == "token" and not cfg.owns_cache(i):
                continue
            b = store_state_bytes(st, seen, engine=engine, dtype=st.cache_format or dtype)
            if b or slot == "token":
                out[st.KIND] = out.get(st.KIND, 0) + b
    return out
