"""``load(path)``: a checkpoint folder -> a storelab ``Model``.

1. ``config.json`` names the family (``model_type``); its common fields are held to their
   types first (``check_config``: sizes are integers, per-layer lists have one entry per
   layer), then the family (``families/_family.py``) translates the config into a
   ``ModelConfig`` and gives the name table (``storelab.checkpoint.table``) and the tensors it
   leaves out.
2. The model is built on the ``meta`` device (no memory, no random init).
3. Every entry of the table is checked against the shard headers before anything is read:
   each of our tensors has a source, each source exists, has a float dtype (an integer one
   for integer tables) and yields our shape; every checkpoint tensor is used or known to be
   ignorable (MTP layers, a vision tower). Any failure names the tensor and the file.
4. Unless ``device="meta"`` (accounting only: nothing is read), the model is materialised
   on ``device`` in ``dtype`` and filled shard by shard: a shard's tensors are read, turned
   into ours and copied, and let go before the next shard is opened (a tensor made of pieces
   from several shards waits for its last piece). FP8 block-quantized weights are
   dequantized on the way (``storelab.checkpoint.quantized``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from storelab.checkpoint.families import FAMILIES, family_for
from storelab.checkpoint.gguf import GGUFShards, is_gguf
from storelab.checkpoint.gguf.dequant import INTEGER as _GGUF_INTEGER
from storelab.checkpoint.quantized import QUANTIZED, SCALES, dequantize_table
from storelab.checkpoint.shards import FLOAT_DTYPES, INT_DTYPES, TORCH_DTYPES, CheckpointError, Shards, read_config
from storelab.checkpoint.table import Src, ours_to_load

__all__ = ["load", "plan", "Plan", "resolve_dtype", "own_weight_format"]

DTYPE_NAMES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
               "fp16": torch.float16, "float16": torch.float16, "fp64": torch.float64, "float64": torch.float64}


def resolve_dtype(dtype, hf: dict) -> torch.dtype:
    """``dtype`` if given (torch dtype or name), else the checkpoint's own (``dtype``/``torch_dtype``), else fp32."""
    if dtype is None:
        dtype = hf.get("dtype") or hf.get("torch_dtype") or (hf.get("text_config") or {}).get("dtype") or "float32"
    if isinstance(dtype, torch.dtype):
        return dtype
    if isinstance(dtype, str) and dtype in DTYPE_NAMES:
        return DTYPE_NAMES[dtype]
    raise CheckpointError(f"dtype: unknown dtype {dtype!r} (known: {', '.join(DTYPE_NAMES)})")


# config.json fields the families read, by the type they must have (null: absent)
POSITIVE_KEYS = ("hidden_size", "num_hidden_layers", "num_attention_heads", "vocab_size")
INT_KEYS = POSITIVE_KEYS + (
    "decoder_sparse_step", "dense_intermediate_size", "first_k_dense_replace", "hc_mult", "hc_sinkhorn_iters",
    "head_dim", "index_block_size", "index_head_dim", "index_local_blocks", "index_n_heads", "index_topk",
    "index_topk_blocks", "intermediate_size", "kv_lora_rank", "linear_conv_kernel_dim", "linear_key_head_dim",
    "linear_num_key_heads", "linear_num_value_heads", "linear_value_head_dim", "max_position_embeddings",
    "moe_intermediate_size", "n_group", "n_routed_experts", "n_shared_experts", "num_experts", "num_experts_per_tok",
    "num_key_value_heads", "num_local_experts", "o_groups", "o_lora_rank", "q_lora_rank", "qk_nope_head_dim",
    "qk_rope_head_dim", "shared_expert_intermediate_size", "shared_intermediate_size", "sliding_window",
    "topk_group", "v_head_dim")
FLOAT_KEYS = ("rms_norm_eps", "routed_scaling_factor", "swiglu_limit", "swiglu_alpha", "hc_eps",
              "attention_value_scale", "compress_rope_theta")
BOOL_KEYS = ("attention_bias", "mlp_bias", "norm_topk_prob", "tie_word_embeddings")
PER_LAYER_KEYS = ("layer_types", "mlp_layer_types", "indexer_types")
PER_LAYER_INT_KEYS = ("moe_intermediate_size", "num_experts")  # an integer, or a list of one per layer


def check_config(hf: dict, where: str = "config.json") -> None:
    """Hold the common fields of a config (and of its ``text_config``) to their types; a CheckpointError
    naming the file and the field otherwise."""
    import math

    parts = [(hf, "")] + ([(hf["text_config"], "text_config.")] if isinstance(hf.get("text_config"), dict) else [])
    for d, pre in parts:
        for k in INT_KEYS:
            v = d.get(k)
            if v is None:
                continue
            if k in PER_LAYER_INT_KEYS and isinstance(v, list):  # one per layer (Hunyuan's remote config)
                for j, x in enumerate(v):
                    if isinstance(x, bool) or not isinstance(x, int) or x < 0:
                        raise CheckpointError(f"{where}: {pre}{k}[{j}]: must be an integer >= 0, got {x!r}")
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < (1 if k in POSITIVE_KEYS else 0):
                want = "a positive integer" if k in POSITIVE_KEYS else "an integer >= 0"
                raise CheckpointError(f"{where}: {pre}{k}: must be {want}, got {v!r}")
        for k in FLOAT_KEYS:
            v = d.get(k)
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
                raise CheckpointError(f"{where}: {pre}{k}: must be a finite number, got {v!r}")
        for k in BOOL_KEYS:
            v = d.get(k)
            if v is not None and not isinstance(v, bool):
                raise CheckpointError(f"{where}: {pre}{k}: must be true or false, got {v!r}")
        n = d.get("num_hidden_layers")
        for k in PER_LAYER_KEYS:
            v = d.get(k)
            if v is None:
                continue
            if not isinstance(v, list):
                raise CheckpointError(f"{where}: {pre}{k}: must be a list with one entry per layer, got {v!r}")
            if n is not None and len(v) != n:
                raise CheckpointError(f"{where}: {pre}{k}: has {len(v)} entries, but {pre}num_hidden_layers is {n} "
                                      "(one entry per layer)")


@dataclass
class Plan:
    """What ``load`` settles before a weight is read: the model built on ``meta`` (in its target
    dtype), the name table (quantized pieces with their scales) checked against the shard headers,
    and the shards to read it from."""

    path: Path
    hf: dict
    family: object
    model: torch.nn.Module
    table: dict[str, Src]
    shards: Shards


def plan(path: str | Path, *, dtype=None, shards: type[Shards] = Shards) -> Plan:
    """Steps 1-3 of ``load``: the checked plan of a checkpoint folder; nothing but headers is read.
    ``shards``: the class that reads the folder (``storelab.checkpoint.reader.CountingShards`` counts it).
    A GGUF file (``storelab.checkpoint.gguf``) is read by ``GGUFShards``, which counts as ``CountingShards``
    does (``bytes_read``, ``header_bytes``, ``tensor(name)``) and reads each tensor with one seek and one
    read, so it serves either ``shards``."""
    from storelab.models.model import Model

    path = Path(path)
    gguf = is_gguf(path)
    if gguf:  # a GGUF file: its metadata as a config, its tensors under transformers' names
        found = GGUFShards(path)
        hf, cfg_file = found.hf, path
        fam = family_for(hf, path)
    else:
        hf, cfg_file = read_config(path), path / "config.json"
        if "train_config" in hf:  # the config.json beside a train run's checkpoint
            raise CheckpointError(f"{path}: a storelab train run folder, not a model folder (storelab export RUN OUT "
                                  "writes its model folder; storelab probe --checkpoint and "
                                  "storelab.train.loop.load_trained read run folders)")
        fam = family_for(hf, path)
    check_config(hf, str(cfg_file))
    if not gguf:
        found = shards(path)
    try:
        cfg = fam.to_config(hf)
    except CheckpointError:
        raise
    except ValueError as e:
        raise CheckpointError(f"{cfg_file}: {e}") from None
    except (TypeError, KeyError, IndexError, AttributeError) as e:  # a field of a shape the family did not expect
        raise CheckpointError(f"{cfg_file}: the {fam.name} family cannot read this config "
                              f"({type(e).__name__}: {e})") from None
    fam.runs(hf)
    target = resolve_dtype(dtype, hf)
    with torch.device("meta"):
        model = Model(cfg)
    ours = ours_to_load(model)
    tab = dequantize_table(fam.table(hf, cfg, set(found.names())), found, hf)
    check(tab, ours, found, fam.ignored(hf))
    model = model.to(target)  # still on meta: the weights are then allocated in the target dtype
    model.checkpoint = {"path": str(path), "family": fam.name, "model_type": hf.get("model_type")}
    if "gguf" in hf:
        model.checkpoint["gguf"] = hf["gguf"]
    return Plan(path=path, hf=hf, family=fam, model=model, table=tab, shards=found)


def load(path: str | Path, *, device: str | torch.device = "cpu", dtype=None):
    """Build the storelab model of a checkpoint folder; ``device="meta"`` reads no weights."""
    p = plan(path, dtype=dtype)
    model = p.model
    if torch.device(device).type != "meta":
        model = model.to_empty(device=device)
        if model.cfg.tie_embeddings:
            model.lm_head.weight = model.embed.weight
        fill(model, p.table, p.shards)
    return model.eval()


def _pieces_meta(src: Src, shards: Shards) -> list[Tensor]:
    return [torch.empty(shards.info[n][0], dtype=TORCH_DTYPES.get(shards.info[n][1], torch.float32), device="meta")
            for n in src.names]


def check(tab: dict[str, Src], ours: dict[str, Tensor], shards: Shards, ignored: tuple[str, ...]) -> None:
    """Raise a CheckpointError naming the tensor and the file for the first problem found."""
    folder = shards.folder
    unmapped = [k for k in ours if k not in tab]
    if unmapped:
        raise CheckpointError(f"{folder}: no table entry for our tensor {unmapped[0]!r} "
                              f"({len(unmapped)} unmapped; a gap in the family's name table)")
    extra = [k for k in tab if k not in ours]
    if extra:
        raise CheckpointError(f"{folder}: the table names {extra[0]!r}, which our model does not have")
    used: set[str] = set()
    for mine, src in tab.items():
        for n in src.names:
            if n not in shards.info:
                raise CheckpointError(f"missing tensor {n!r} (needed for our {mine!r}): no shard of {folder} "
                                      f"holds it (files: {', '.join(shards.files)})")
            shape, dt = shards.info[n]
            ok = INT_DTYPES if src.integer else FLOAT_DTYPES + (QUANTIZED + SCALES if src.quantized else ())
            if dt not in ok:
                raise CheckpointError(f"tensor {n!r} in {shards.where[n]}: dtype {dt}, expected "
                                      f"{'an integer' if src.integer else 'a floating-point'} dtype ({', '.join(ok)})")
            used.add(n)
        try:
            out = src.make(*_pieces_meta(src, shards))
            got = tuple(out.shape)
        except (RuntimeError, ValueError, IndexError) as e:
            got = f"an error ({e})"
        want = tuple(ours[mine].shape)
        if got != want:
            where = ", ".join(f"{n!r} in {shards.where[n]} shape {list(shards.info[n][0])}" for n in src.names)
            made = list(got) if isinstance(got, tuple) else got
            how = f" (gives {made} after {src.what})" if src.what else ""
            raise CheckpointError(f"mis-shaped tensor {where}{how}: our {mine!r} needs {list(want)}")
    pats = [re.compile(p) for p in ignored]
    unexpected = [n for n in shards.names() if n not in used and not any(p.search(n) for p in pats)]
    if unexpected:
        n = unexpected[0]
        raise CheckpointError(f"unexpected tensor {n!r} in {shards.where[n]}: no table entry uses it "
                              f"({len(unexpected)} unexpected)")


@torch.no_grad()
def fill(model: torch.nn.Module, tab: dict[str, Src], shards: Shards) -> None:
    """Read the shards one at a time and copy each finished tensor into the model."""
    ours = ours_to_load(model)
    users: dict[str, list[str]] = {}
    for mine, src in tab.items():
        for n in src.names:
            users.setdefault(n, []).append(mine)
    pending: dict[str, dict[str, Tensor]] = {}
    for fname in shards.files:
        names = [n for n in users if shards.where[n] == fname]
        for n, t in shards.read(fname, names):
            for mine in users[n]:
                src = tab[mine]
                got = pending.setdefault(mine, {})
                got[n] = t
                if len(got) == len(src.names):
                    dst = ours[mine]
                    val = src.make(*[got[x] for x in src.names])
                    dst.copy_(val.to(dst.dtype) if dst.dtype.is_floating_point else val)
                    del pending[mine]
    if pending:  # cannot happen after check(); kept as a guard against a bad index
        mine = next(iter(pending))
        raise CheckpointError(f"{shards.folder}: our {mine!r} was not completed from the shards")


def supported() -> list[str]:
    return sorted(t for f in FAMILIES for t in f.model_types)


def own_weight_format(path: str | Path) -> tuple[str, str]:
    """The format (``storelab.models.quant``) a checkpoint's linear weights run in on the CPU by default
    (``generate --weights auto``), and why, from the stored types of its matrices (headers only, no weight read):

    * ``bf16`` where they are stored in bf16: the packed weights are exactly the checkpoint's numbers;
    * ``int8`` where a GGUF file holds them quantized (Q8_0, Q4_K, ...): the narrowest format the decode step runs,
      as llama.cpp runs its quantized files (a weight of 4 or 6 bits re-rounded to 8, per row);
    * ``fp32`` otherwise: fp32, and fp16 (whose 10 bits of mantissa bf16 cannot hold; fp32 holds them exactly).
    """
    from math import prod

    from gguf import GGMLQuantizationType as Q

    shards = plan(path).shards
    counts: dict[str, int] = {}   # stored type -> elements of the matrices stored so
    if isinstance(shards, GGUFShards):
        for t in shards.header.tensors.values():
            if len(t.shape) >= 2:
                kind = t.qtype.name if t.qtype in (Q.F32, Q.F16, Q.BF16) or t.qtype in _GGUF_INTEGER else \
                    f"quantized {t.qtype.name}"
                counts[kind] = counts.get(kind, 0) + prod(t.shape)
        quantized = sorted(k.split()[1] for k in counts if k.startswith("quantized "))
        if quantized:
            return "int8", f"its matrices are stored quantized ({', '.join(quantized)})"
    else:
        for shape, dt in shards.info.values():
            if len(shape) >= 2:
                counts[dt] = counts.get(dt, 0) + prod(shape)
    if counts.get("BF16", 0) * 2 > sum(counts.values()):
        return "bf16", "its matrices are stored in bf16"
    main = max(counts, key=counts.get) if counts else "F32"
    return "fp32", f"its matrices are stored in {main}"
