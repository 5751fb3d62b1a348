"""Where a probe's model comes from: a model folder (config.json + safetensors), in memory or streamed.

    open_model(checkpoint, *, stream=False, device="cpu", dtype=None) -> Model
    on_device(model, device) -> model        # token ids in on the model's device, logits back on the CPU
    placement(model, device) -> {"device": ..., "dtype": ...}
    is_model_folder(path) -> bool

A model folder is a Hugging Face folder of a supported family or one ``storelab save`` wrote
(``storelab.outputs.folder_kind``: "hf" or "save"); a ``storelab train`` run folder is not one
(``storelab.train.loop.load_trained`` reads those). ``stream=False`` loads the weights
(``storelab.load``); ``stream=True`` builds the model on ``meta`` and reads each layer's weights
from the shards for the length of its call (``storelab.checkpoint.stream``): the same logits
and cache, for checkpoints larger than memory. Probes take either unchanged.

``device`` and ``dtype`` (``storelab probe --device --dtype``) place the weights (``load`` and
``stream`` take them). The probes build their token ids on the CPU and compare logits with CPU
targets; ``on_device`` puts two hooks on the model's own call, so the ids of every call go to the
model's device and the logits come back to the CPU, while the cache (the states a swap moves) stays
on the device. Only the logits cross, once per call.
"""

from __future__ import annotations

from pathlib import Path

from storelab.outputs import folder_kind

__all__ = ["open_model", "on_device", "placement", "is_model_folder", "checkpoint_kind"]


def is_model_folder(path: str | Path) -> bool:
    """A folder with a model's config.json (a supported family's, or ours), not a train run's."""
    return folder_kind(path) in ("hf", "save") and (Path(path) / "config.json").is_file()


def checkpoint_kind(path: str | Path) -> str | None:
    """``"gguf"`` for a GGUF file (its weights, tokenizer and chat template in one file), else the folder's
    kind (``storelab.outputs.folder_kind``: "hf", "save", "run", ...), None when nothing is there; any other
    file (a text file, a FIFO) is refused naming what it is."""
    from storelab.checkpoint.gguf import is_gguf
    from storelab.files import regular_file

    path = Path(path)
    if path.exists() and not path.is_dir() and not is_gguf(path):
        regular_file(path)  # a FIFO or a device: said so
        raise ValueError(f"checkpoint: {path} is a file, not a model folder or a GGUF file")
    return "gguf" if is_gguf(path) else folder_kind(path)


def open_model(checkpoint: str | Path, *, stream: bool = False, device: str = "cpu", dtype=None):
    """The model of a model folder, loaded or (``stream``) streamed layer by layer, on ``device`` in
    ``dtype`` (None: the checkpoint's own), fed through ``on_device``."""
    if stream:
        from storelab.checkpoint.stream import stream as open_streamed

        return on_device(open_streamed(checkpoint, dtype=dtype, device=device), device)
    from storelab.checkpoint import load

    return on_device(load(checkpoint, dtype=dtype, device=device), device)


def on_device(model, device: str):
    """``model`` with hooks on its call: the token ids (its first argument) moved to ``device`` before,
    the logits moved to the CPU after (the cache stays where the model keeps it). Nothing on the CPU."""
    import torch

    device = torch.device(device)
    if device.type == "cpu":
        return model

    def ids_in(mod, args):
        return (args[0].to(device),) + tuple(args[1:])

    def logits_out(mod, args, out):
        logits, cache = out
        return logits.cpu(), cache

    model.register_forward_pre_hook(ids_in)
    model.register_forward_hook(logits_out)
    return model


def placement(model, device: str) -> dict:
    """Where the model runs and in what: ``{"device": "cuda:0", "dtype": "bf16"}`` (the dtype of its
    floating-point parameters, read from them; a streamed model's are its meta parameters, already in
    the target dtype)."""
    from storelab.checkpoint.loader import DTYPE_NAMES

    short = {t: name for name, t in reversed(DTYPE_NAMES.items())}   # the first name of each: fp32, bf16, ...
    dtypes = sorted({short.get(p.dtype, str(p.dtype)) for p in model.parameters() if p.dtype.is_floating_point})
    return {"device": str(device), "dtype": dtypes[0] if len(dtypes) == 1 else "+".join(dtypes)}
