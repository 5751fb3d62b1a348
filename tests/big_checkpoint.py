"""A Qwen3-Next checkpoint of a chosen size, written fast: the tensor names and shapes of transformers'
model built on ``meta`` (nothing allocated), one shard per layer (and the index), each tensor's bytes a
stretch of one random pool of fp32 values (scaled to its fan-in) written straight to the file, so
writing a few GB costs no random generation and holds no more than the pool in memory.

Most of the bytes are routed experts (16 per layer, two chosen per token), so a forward pass over a
few tokens computes with a small part of what it reads. Used by tests/test_checkpoint_stream.py;
also a script: ``python -m tests.big_checkpoint DIR ['{"num_hidden_layers": 4}']``."""

from __future__ import annotations

import json
import re
import struct
import sys
from pathlib import Path

import torch

# about 1.9 GB in fp32: 32 layers of 16 experts x 3 x 1024 x 256 (50 MiB a layer), hidden 1024: a streamed
# layer's weights, read and converted, cost a few times its bytes at the peak, so layers stay small beside
# the third of the total the test allows
BIG = dict(hidden_size=1024, num_hidden_layers=32, num_attention_heads=8, num_key_value_heads=2, head_dim=128,
           vocab_size=4096, intermediate_size=1024, num_experts=16, num_experts_per_tok=2,
           moe_intermediate_size=256, shared_expert_intermediate_size=256, linear_conv_kernel_dim=4,
           linear_key_head_dim=64, linear_value_head_dim=64, linear_num_key_heads=4, linear_num_value_heads=8,
           bos_token_id=1, eos_token_id=2, pad_token_id=0)
POOL = 1 << 22   # fp32 values in the random pool


def _write_shard(path: Path, shapes: dict[str, torch.Size], pool: torch.Tensor, start: int) -> tuple[int, int]:
    """One safetensors file (header by hand, then each tensor's bytes); (bytes of tensors, next pool start)."""
    header, off = {}, 0
    for name, shape in shapes.items():
        n = 4 * torch.Size(shape).numel()
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for name, shape in shapes.items():
            numel = torch.Size(shape).numel()
            scale = 0.5 if len(shape) == 1 or name.endswith(("A_log", "dt_bias")) else 3 ** 0.5 / shape[-1] ** 0.5
            left = numel
            while left:
                take = min(left, POOL - start)
                f.write((pool[start:start + take] * scale).numpy().tobytes())
                left -= take
                start = (start + take) % POOL
            start = (start + 7919) % POOL      # the next tensor starts elsewhere in the pool
    return off, start


def write(folder: str | Path, **settings) -> int:
    """Write the checkpoint into ``folder``; return the bytes of its tensors."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = AutoConfig.for_model("qwen3_next", **{**BIG, **settings})
    with torch.device("meta"):
        hf = AutoModelForCausalLM.from_config(cfg)
    groups: dict[str, dict[str, torch.Size]] = {}
    for name, t in hf.state_dict().items():
        m = re.match(r"model\.layers\.(\d+)\.", name)
        groups.setdefault(f"layer{int(m.group(1)):03d}" if m else "rest", {})[name] = t.shape
    pool = torch.rand(POOL, generator=torch.Generator().manual_seed(0)) * 2 - 1
    weight_map, total, start = {}, 0, 0
    for key, shapes in sorted(groups.items()):
        fname = f"model-{key}.safetensors"
        n, start = _write_shard(folder / fname, shapes, pool, start)
        total += n
        weight_map.update({name: fname for name in shapes})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                    "weight_map": weight_map}))
    d = cfg.to_dict()
    d["dtype"] = "float32"
    (folder / "config.json").write_text(json.dumps(d))
    return total


if __name__ == "__main__":
    print(write(sys.argv[1], **json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}))
