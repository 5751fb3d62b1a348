"""Which model a training run builds: a zoo model (tiny), a model file, or a small built-in stack.

``resolve_model(name, vocab_size, **options) -> ModelConfig``:

* ``tiny-<zoo name>`` (``tiny-kimi-k3``) or ``<zoo name>.tiny``: the zoo's tiny version;
  ``<zoo name>``: the full-scale file (far too large for a CPU, but allowed);
* a path ending in ``.toml`` or ``.json``: a model file;
* a built-in stack, ``d_model`` / ``n_layers`` / ``n_heads`` / ``head_dim`` / ``d_ff`` /
  ``window`` / ``beta_max`` / ``depth`` / ``mode`` (the recurrent stores' evaluation form) set
  by ``options`` (``mode="auto"``: the chunked form, which trains as it is: a chunk call whose inputs
  need gradients runs the differentiable chunked form, see ``storelab.ops.delta``):
  ``attention``, ``window``, ``deltanet``, ``gated_deltanet``, ``kda`` (every layer that store) and
  ``hybrid`` (three KDA layers to one attention layer, Kimi's 3:1), ``hybrid-gdn`` (the
  same with Gated DeltaNet, Qwen's 3:1), or ``pattern:<letters>`` with one letter per
  layer: A attention, W window, D deltanet, G gated_deltanet, K kda, M mla.

The task sets the vocabulary: ``vocab_size`` replaces the file's (every store inherits it).
Built-in stacks use a SwiGLU feed-forward layer and the plain residual (``depth="mhc"`` for
four mHC streams, arXiv 2512.24880).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from storelab.models.config import ModelConfig, read_file
from storelab.stores import REGISTRY

LETTERS = {"A": "attention", "W": "window", "D": "deltanet", "G": "gated_deltanet", "K": "kda", "M": "mla"}
BUILTIN = {"attention": "A", "window": "W", "deltanet": "D", "gated_deltanet": "G", "kda": "K", "hybrid": "KKKA",
           "hybrid-gdn": "GGGA"}
DEFAULTS = dict(d_model=64, n_layers=4, n_heads=2, head_dim=32, d_ff=128, window=8, beta_max=1.0, depth="residual",
                mode="auto")


def store_dict(kind: str, o: dict[str, Any]) -> dict[str, Any]:
    """The store table of one built-in store kind, from the stack's options."""
    H, K = o["n_heads"], o["head_dim"]
    if kind == "attention":
        return {"kind": "attention", "n_heads": H, "head_dim": K}
    if kind == "window":
        return {"kind": "window", "n_heads": H, "head_dim": K, "window": o["window"]}
    if REGISTRY[kind].RECURRENT:
        mode = "chunk" if o["mode"] == "auto" else o["mode"]
        return {"kind": kind, "n_heads": H, "head_k_dim": K, "beta_max": o["beta_max"], "mode": mode}
    if kind == "mla":
        return {"kind": "mla", "n_heads": H, "kv_lora_rank": K, "qk_nope_head_dim": K // 2,
                "qk_rope_head_dim": K // 2, "v_head_dim": K}
    raise ValueError(f"model: no built-in store {kind!r}")


def stack_dict(pattern: str, vocab_size: int, **options: Any) -> dict[str, Any]:
    """A model file (as a dict) for a stack with one letter per layer (tiled to n_layers)."""
    bad = sorted(set(options) - set(DEFAULTS))
    if bad:
        raise ValueError(f"{bad[0]}: unknown model option (known: {', '.join(sorted(DEFAULTS))})")
    o = {**DEFAULTS, **options}
    if not pattern:
        raise ValueError("model: pattern: give at least one layer letter (pattern:KKKA; known: "
                         f"{', '.join(f'{k}={v}' for k, v in LETTERS.items())})")
    for ch in pattern:
        if ch not in LETTERS:
            raise ValueError(f"model: unknown layer letter {ch!r} in {pattern!r} (known: "
                             f"{', '.join(f'{k}={v}' for k, v in LETTERS.items())})")
    n = o["n_layers"] if ("n_layers" in options or len(pattern) == 1) else len(pattern)
    stores = {LETTERS[ch]: store_dict(LETTERS[ch], o) for ch in set(pattern)}
    stores["ffn"] = {"kind": "ffn", "d_ff": o["d_ff"]}
    stores["depth"] = {"kind": o["depth"]}
    return {"name": f"stack-{pattern}", "d_model": o["d_model"], "vocab_size": vocab_size, "n_layers": n,
            "stores": stores,
            "layers": [{"at": "all", "pattern": pattern, "token": {ch: LETTERS[ch] for ch in set(pattern)},
                        "channel": "ffn", "depth": "depth"}]}


def resolve_model(name: str, vocab_size: int, **options: Any) -> ModelConfig:
    """The ModelConfig a run trains (see the module docstring)."""
    if name in BUILTIN or name.startswith("pattern:"):
        pattern = BUILTIN.get(name) or name.split(":", 1)[1]
        return ModelConfig.from_dict(stack_dict(pattern, vocab_size, **options), source=f"model {name!r}")
    if options:
        raise ValueError(f"{sorted(options)[0]}: model options apply to built-in stacks only, not {name!r}")
    if name.endswith((".toml", ".json")):
        path = Path(name)
    else:
        from storelab.zoo import zoo_path

        zoo = name[len("tiny-"):] + ".tiny" if name.startswith("tiny-") else name
        try:
            path = zoo_path(zoo)
        except ValueError as e:
            raise ValueError(f"model: {e}; or a built-in stack ({', '.join(BUILTIN)}, pattern:KKKA) "
                             f"or a .toml/.json file") from None
    d = dict(read_file(path))
    d["vocab_size"] = vocab_size
    # stores that name the vocabulary themselves (hash-routed experts, Engram) follow the task's
    d["stores"] = {nm: ({**sd, "vocab_size": vocab_size} if "vocab_size" in sd else sd)
                   for nm, sd in d.get("stores", {}).items()}
    return ModelConfig.from_dict(d, source=str(path))
