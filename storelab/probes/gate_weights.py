"""The forgetting probe's weights-only part, read from a checkpoint without building the model.

    gate_spectra(folder) -> dict     # storelab probe forgetting --checkpoint DIR --weights-only

For every recurrent layer whose rule has a decay, its gate at x = 0 (the input-dependent part
dropped, the bias term alone): per head for a decay per head (Gated DeltaNet, g_h = -exp(A_log_h)
softplus(dt_bias_h)), per key channel for a decay per channel (KDA, g_hk = -exp(A_log_h)
softplus(dt_bias_hk), or Kimi K3's bounded lb sigmoid(exp(A_log_h) dt_bias_hk)); each value's
half-life ln 2 / -g tokens; for the per-channel layers, the forgetting probe's channel-fade
estimate (``forgetting.channel_mixing``: a head mixes when one channel fades to a thousandth
within 64 tokens and another lasts longer) and the fraction of heads that mix.

How, and why it reads megabytes of a 100-GB checkpoint:

1. The model config comes from config.json alone (``read_model_config``); the family's name
   table (``families/<family>.py``) says which checkpoint tensors make each of our parameters and
   how (Kimi's A_log [1, 1, H, 1] -> [H]; FP8 pieces with their scales); the headers say where
   they lie (``CountingShards``: 8 bytes + the JSON header per file, counted).
2. Each recurrent layer's store is built on ``meta`` (no memory). The store declares what its gate
   reads at x = 0 (``gate_params()``, parameter -> "zero" | "read"; the pipeline's stores from their
   rule's ``Rule.params``, Mamba, Mamba-2, RG-LRU and lightning attention by their own): the weights
   that meet x give 0 there and are zeros, never read (a projection's bias is read); its own tensors
   (A_log, dt_bias), which are read, exactly those bytes, and cast to the dtype ``load`` gives
   them. A fixed decay comes from the config.
3. The store's own gate (``_log_decay``) is called on x = 0, the call the in-memory probe makes
   (``forgetting.rest_log_decay``), so the two agree bit for bit; nothing names a store kind.

A layer without a decay (DeltaNet, plain linear attention) is listed as such; a model with no
recurrent decay at all (pure attention) is a ``CheckpointError`` naming the folder; a missing gate
tensor one naming the tensor and the folder's files.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from storelab.checkpoint import CheckpointError, read_model_config
from storelab.checkpoint.config_only import read_hf_config
from storelab.checkpoint.families import family_for
from storelab.checkpoint.loader import resolve_dtype
from storelab.checkpoint.quantized import dequantize_table
from storelab.checkpoint.reader import CountingShards
from storelab.probes.forgetting import ESSAY_FORGET, channel_mixing

__all__ = ["gate_spectra", "gate_tensors"]

LN2 = math.log(2.0)


def _half_life(g: torch.Tensor) -> list[float]:
    """ln 2 / -g tokens per value (inf for a gate that keeps everything)."""
    return [LN2 / -x if x < 0 else math.inf for x in g.double().flatten().tolist()]


def _gate_store(lay, i: int, tab: dict, reader: CountingShards, dtype: torch.dtype):
    """Layer i's store on meta, with the parameters its gate reads at x = 0 (``gate_params``) on the CPU:
    the weights that meet x as zeros (a stride-0 view, no memory), the rest read from the checkpoint."""
    with torch.device("meta"):
        store = lay.token.build()
    roles = store.gate_params()             # parameter name -> "zero" | "read", declared by the store
    names: list[str] = []
    for pn, p in list(store.named_parameters()):
        role = roles.get(pn)
        if role is None:                    # not read by the gate: stays on meta
            continue
        if role == "zero":
            value = torch.zeros((), dtype=dtype).expand(p.shape)
        else:
            value = torch.empty(p.shape, dtype=dtype)
            names += _read_into(value, f"blocks.{i}.token.{pn}", tab, reader)
        owner, _, leaf = pn.rpartition(".")
        setattr(store.get_submodule(owner), leaf, nn.Parameter(value, requires_grad=False))
    return store, names


@torch.no_grad()
def _read_into(dst: torch.Tensor, ours: str, tab: dict, reader: CountingShards) -> list[str]:
    """Fill ``dst`` (our tensor ``ours``) from its checkpoint pieces; the pieces' names."""
    if ours not in tab:
        raise CheckpointError(f"{reader.folder}: no table entry for our tensor {ours!r} (a gap in the family's "
                              "name table)")
    src = tab[ours]
    for n in src.names:
        if n not in reader.info:
            raise CheckpointError(f"missing tensor {n!r} (needed for our {ours!r}): no shard of {reader.folder} "
                                  f"holds it (files: {', '.join(reader.files)})")
    val = src.make(*[reader.tensor(n) for n in src.names])
    if tuple(val.shape) != tuple(dst.shape):
        raise CheckpointError(f"mis-shaped tensor {', '.join(map(repr, src.names))} in {reader.folder}: our "
                              f"{ours!r} needs {list(dst.shape)}, gets {list(val.shape)}")
    dst.copy_(val.to(dst.dtype))
    return list(src.names)


def gate_tensors(folder: str | Path, *, dtype=None) -> tuple[dict[int, torch.Tensor], dict]:
    """Per recurrent layer with a decay, its gate at x = 0 ([H] or [H, K], fp32), and what was read:
    ``{"bytes_read", "header_bytes", "gate_bytes", "tensors", "dtype", "no_decay": [layers]}``."""
    folder = Path(folder)
    hf, _ = read_hf_config(folder)
    if not folder.is_dir():
        raise CheckpointError(f"{folder}: the weights-only estimate reads a checkpoint folder (config.json and "
                              "safetensors), not a file")
    fam = family_for(hf, folder)
    cfg = read_model_config(folder)
    target = resolve_dtype(dtype, hf)
    recurrent = [i for i, lay in enumerate(cfg.layers) if lay.token.RECURRENT]
    if not recurrent:
        raise CheckpointError(f"{folder}: no recurrent layer ({cfg.n_layers} layers, none with a fixed-size "
                              "state): the weights-only estimate reads the decay gates of recurrent layers")
    reader = CountingShards(folder)
    tab = dequantize_table(fam.table(hf, cfg, set(reader.names())), reader, hf)
    gates, read, no_decay = {}, [], []
    for i in recurrent:
        store, names = _gate_store(cfg.layers[i], i, tab, reader, target)
        zero_11D = torch.zeros(1, 1, cfg.d_model, dtype=target)
        with torch.no_grad():
            g = store._log_decay(zero_11D)
        if g is None:
            no_decay.append(i)
            continue
        gates[i] = g[0, 0].float()
        read += names
    if not gates:
        raise CheckpointError(f"{folder}: its recurrent layers ({', '.join(map(str, recurrent))}) have no decay "
                              "gate: nothing for the weights-only estimate to read")
    return gates, {"bytes_read": reader.bytes_read, "header_bytes": reader.header_bytes,
                   "gate_bytes": reader.tensor_bytes(read), "tensors": sorted(set(read)),
                   "dtype": str(target).replace("torch.", ""), "no_decay": no_decay,
                   "checkpoint_bytes": sum((folder / f).stat().st_size for f in reader.files),
                   "kinds": {i: cfg.layers[i].token.KIND for i in gates}, "name": cfg.name}


def gate_spectra(folder: str | Path, *, dtype=None) -> dict:
    """The weights-only forgetting figures of a checkpoint, per layer and head (see the module docstring)."""
    gates, io = gate_tensors(folder, dtype=dtype)
    layers, head_lives, mixes = [], [], []
    for i, g in sorted(gates.items()):
        per_channel = g.dim() == 2
        heads = []
        if per_channel:
            mx = channel_mixing(g)
            mixes.append(mx["mixes"])
            for h in range(g.shape[0]):
                life = _half_life(g[h].mean())[0]       # the geometric mean of what the channels keep
                heads.append({"head": h, "half_life": life, "log_retention": g[h].tolist(),
                              "channel_half_lives": _half_life(g[h]), "fading_channels": int(mx["fades"][h].sum()),
                              "mixes": bool(mx["mixes"][h])})
                head_lives.append(life)
        else:
            for h, (x, life) in enumerate(zip(g.tolist(), _half_life(g))):
                heads.append({"head": h, "half_life": life, "log_retention": x})
                head_lives.append(life)
        layers.append({"layer": i, "store": io["kinds"][i], "decay": "per channel" if per_channel else "per head",
                       "heads": heads})
    m = torch.cat(mixes) if mixes else None
    return {"probe": "forgetting", "weights_only": True, "checkpoint": str(folder), "model": io["name"],
            "layers": layers, "no_decay_layers": io["no_decay"],
            "median_half_life": float(torch.tensor(head_lives, dtype=torch.float64).median()),
            "kda_heads": 0 if m is None else int(m.numel()),
            "kda_mixing_fraction": None if m is None else float(m.float().mean()),
            "read": {k: io[k] for k in ("bytes_read", "header_bytes", "gate_bytes", "checkpoint_bytes", "dtype",
                                        "tensors")},
            "essay": ESSAY_FORGET}
