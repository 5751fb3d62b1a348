"""Test helpers: closeness with a readable report, oracle capture from transformers, stand-ins for fla."""

from __future__ import annotations

import torch


def assert_close(actual: torch.Tensor, expected: torch.Tensor, atol: float = 1e-5, what: str = "") -> None:
    """Fail with max-abs and relative error when |actual - expected| > atol anywhere."""
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    diff = (actual.double() - expected.double()).abs()
    mx = diff.max().item() if diff.numel() else 0.0
    rel = mx / max(expected.double().abs().max().item(), 1e-30) if diff.numel() else 0.0
    assert mx <= atol, f"{what}: max abs diff {mx:.3e} > {atol:.1e} (relative {rel:.3e})"


def capture(model: torch.nn.Module, submodule: torch.nn.Module, *inputs, **kwargs):
    """Run ``model(*inputs, **kwargs)`` and return (args, kwargs, output) seen by ``submodule``."""
    seen = {}

    def hook(mod, args, kw, out):
        if "args" not in seen:
            seen["args"], seen["kwargs"], seen["out"] = args, kw, out

    h = submodule.register_forward_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            model(*inputs, **kwargs)
    finally:
        h.remove()
    return seen["args"], seen["kwargs"], seen["out"]


def tiny_hf_model(model_type: str, **settings):
    """Build a tiny random transformers model (the oracle) for ``model_type``, in eval mode."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(0)
    cfg = AutoConfig.for_model(model_type, **settings)
    return AutoModelForCausalLM.from_config(cfg).eval()


def install_fake_fla(monkeypatch, chunk_gated_delta_rule, chunk_kda) -> None:
    """Stand-ins for fla's two kernels in sys.modules (``fla.ops.gated_delta_rule``, ``fla.ops.kda``),
    CUDA said to be available and CPU tensors sent to fla: a store built now dispatches to them."""
    import sys
    import types

    import storelab.ops.fla as fla_dispatch

    gdr = types.ModuleType("fla.ops.gated_delta_rule")
    gdr.chunk_gated_delta_rule = chunk_gated_delta_rule
    kda_mod = types.ModuleType("fla.ops.kda")
    kda_mod.chunk_kda = chunk_kda
    for name, mod in (("fla", types.ModuleType("fla")), ("fla.ops", types.ModuleType("fla.ops")),
                      ("fla.ops.gated_delta_rule", gdr), ("fla.ops.kda", kda_mod)):
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(fla_dispatch, "FLA_DEVICES", ("cpu",))
    monkeypatch.delenv("STORELAB_FLA", raising=False)


def one_pass_and_chunks(m: torch.nn.Module, x: torch.Tensor, chunks: list[int]):
    """Store ``m`` over x [B, T, D] in one pass and in ``chunks`` with the state carried, without gradients:
    (one pass's output, its state, the chunks' outputs concatenated, the state after the last chunk)."""
    with torch.no_grad():
        want, full = m(x)
        st, ys, t = None, [], 0
        for c in chunks:
            y, st = m(x[:, t:t + c], st)
            ys.append(y)
            t += c
    return want, full, torch.cat(ys, 1), st


SAMPLE_TEXT = (
    "The river rose in the night and the bridge keepers counted the stones twice. "
    "A key opens one door; a map opens many. The capital of the northern province is Varen, "
    "and its harbour freezes in the winter months. Seven blue lamps hang over the market square. "
    "When the bell rings at noon the bakers close their shutters and the children run home. "
)


def write_tokenizer(folder, text: str = SAMPLE_TEXT, *, vocab: int = 512, chat_template: str | None = None) -> None:
    """A byte-level BPE tokenizer trained on ``text``, written as ``folder/tokenizer.json`` (and a
    tokenizer_config.json with BOS/EOS and, when given, a chat template): what a checkpoint ships."""
    import json
    from pathlib import Path

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([text] * 4, trainer)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    cfg = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "add_bos_token": True}
    if chat_template is not None:
        cfg["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
