"""``storelab bench families``: a training step of a hybrid checkpoint family, ours against transformers'.

The peer is transformers 5.23's tiny model of the family itself (its pure-torch CPU path), built from one
config, saved with ``save_pretrained`` and read back by ``storelab.load``: the same weights, so the two
sides compute the same function (their logits are compared once, to 1e-4 relative). One step is the one of
``storelab bench train`` (``train.train_step_fn``): gradients to None, the forward, the next-token
cross-entropy from the logits, ``loss.backward()``; fp32, interleaved rounds, best of rounds.

Rows (issue 28's targets, >= 2x at B = 4, T = 512 and T = 2,048):

* ``nemotron_h``: Nemotron-H's stack as published (Mamba-2 "M", NoPE attention "*", ReLU^2 MLP "-"), pattern
  ``M-M-M*-M-`` (4 Mamba-2 mixers, 1 attention, 4 MLPs): d_model 256, Mamba-2 8 heads of 32 with state 64,
  attention 4 heads (2 KV) of 64, MLP 1,024, vocabulary 4,096.

(Falcon-H1's parallel attention + Mamba-2 layer has no family in storelab yet: no row.)
"""

from __future__ import annotations

import gc
import tempfile
from typing import Any, Callable

import torch

from storelab.bench.timing import compare
from storelab.bench.train import train_step_fn

TARGET = 2.0

TINY = {
    "nemotron_h": dict(hidden_size=256, hybrid_override_pattern="M-M-M*-M-", num_attention_heads=4,
                       num_key_value_heads=2, head_dim=64, intermediate_size=1024, mamba_num_heads=8,
                       mamba_head_dim=32, ssm_state_size=64, n_groups=1, conv_kernel=4, chunk_size=128,
                       vocab_size=4096, bos_token_id=1, eos_token_id=2, pad_token_id=0),
}
QUICK = {"nemotron_h": dict(TINY["nemotron_h"], hidden_size=64, intermediate_size=128, mamba_num_heads=4,
                            mamba_head_dim=16, ssm_state_size=16, head_dim=16, vocab_size=256)}


def build_pair(model_type: str, settings: dict) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(ours, transformers') on the same weights, both in training mode."""
    from transformers import AutoConfig, AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from storelab.checkpoint import load

    hf_logging.set_verbosity_error()  # its notes on absent CUDA kernels and its progress bars: not our output
    hf_logging.disable_progress_bar()
    torch.manual_seed(0)
    hf = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **settings))
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        ours = load(d, dtype="fp32")
    return ours.train(), hf.train()


def bench_family_train(model_type: str, *, B: int = 4, T: int = 2048, repeats: int = 3, budget_s: float = 120.0,
                       quick: bool = False) -> dict[str, Any]:
    settings = (QUICK if quick else TINY)[model_type]
    ours, hf = build_pair(model_type, settings)
    ids = torch.randint(0, settings["vocab_size"], (B, T), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = ours(ids[:1, :64])[0], hf(input_ids=ids[:1, :64], use_cache=False).logits
    agree = float((a - b).abs().max() / b.abs().max())
    fns: dict[str, Callable] = {"ours": train_step_fn(ours, ids, peer=False),
                                "peer": train_step_fn(hf, ids, peer=True)}
    t = compare(fns, repeats=repeats, warmup=1, budget_s=budget_s, inference=False)
    ours_s, peer_s = t["ours"].best, t["peer"].best
    row = {"family": model_type, "B": B, "T": T, "params": sum(p.numel() for p in ours.parameters()),
           "logits_rel_diff": agree, "ours_ms": ours_s * 1e3, "peer_ms": peer_s * 1e3,
           "speedup": peer_s / ours_s, "target": TARGET, "meets_target": peer_s / ours_s >= TARGET,
           "timings": {k: v.as_dict() for k, v in t.items()}}
    del ours, hf, fns
    gc.collect()
    return row


def bench_families(*, lengths: tuple[int, ...] = (512, 2048), B: int = 4, repeats: int = 3, budget_s: float = 120.0,
                   quick: bool = False) -> dict[str, Any]:
    rows = [bench_family_train(mt, B=B, T=T, repeats=repeats, budget_s=budget_s, quick=quick)
            for mt in TINY for T in lengths]
    return {"rows": rows, "quick": quick}
