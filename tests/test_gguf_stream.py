"""A GGUF file streamed (``storelab.checkpoint.stream``): each layer's GGUF tensors read and dequantized during its
call through ``GGUFShards``, which counts its reads as ``CountingShards`` counts a folder's.

* the streamed model's logits and cache equal the loaded model's, bit for bit, a decoding step included (a Q8_0
  llama and a tied-embedding F32 qwen3);
* ``plan(path, shards=CountingShards)`` of a GGUF has read the headers alone (``bytes_read == header_bytes``, the
  size of the header up to the data section); one streamed call then reads every stored tensor byte once (the tied
  head's embedding twice);
* ``tensor_bytes`` and ``tensor`` name what they read.
"""

from __future__ import annotations

import os

import gguf
import pytest
import torch

from storelab.checkpoint import CheckpointError, load
from storelab.checkpoint.gguf import read_header
from storelab.checkpoint.loader import plan
from storelab.checkpoint.reader import CountingShards
from storelab.checkpoint.stream import stream
from tests.family_harness import ids_of, tiny_hf
from tests.gguf_writer import write_gguf

os.environ.setdefault("USE_HUB_KERNELS", "0")

COMMON = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, vocab_size=128,
              intermediate_size=96, bos_token_id=1, eos_token_id=2, pad_token_id=0, max_position_embeddings=512,
              head_dim=16)
CASES = {"llama": ("llama", COMMON, gguf.GGMLQuantizationType.Q8_0),
         "qwen3": ("qwen3", dict(COMMON, tie_word_embeddings=True), None)}


@pytest.mark.parametrize("arch", list(CASES))
def test_streamed_gguf_equals_loaded(arch, tmp_path):
    mt, settings, qtype = CASES[arch]
    path = tmp_path / f"{arch}.gguf"
    write_gguf(tiny_hf(mt, settings), arch, path, qtype=qtype)
    h = read_header(path)

    p = plan(path, shards=CountingShards)
    assert p.shards.bytes_read == p.shards.header_bytes == h.header_bytes > 0
    assert h.header_bytes == min(t.offset for t in h.tensors.values())   # one file: the data section's start

    loaded, streamed = load(path), stream(path)
    ids = ids_of(13)
    with torch.no_grad():
        la, ca = loaded(ids)
        reader = streamed.streamed.shards
        before = reader.bytes_read
        lb, cb = streamed(ids)
        once = sum(t.nbytes for t in h.tensors.values())
        tied = h.tensors["token_embd.weight"].nbytes if "output.weight" not in h.tensors else 0
        assert reader.bytes_read - before == once + tied
        assert torch.equal(la, lb)
        assert [s.nbytes() for s in ca] == [s.nbytes() for s in cb]
        sa, _ = loaded(ids[:, -1:], ca)
        sb, _ = streamed(ids[:, -1:], cb)
        assert torch.equal(sa, sb)
    assert next(streamed.parameters()).device.type == "meta"   # nothing kept between calls
    assert reader.tensor_bytes(["model.embed_tokens.weight"]) == h.tensors["token_embd.weight"].nbytes
    with pytest.raises(CheckpointError, match="missing tensor 'model.nope.weight'"):
        reader.tensor("model.nope.weight")
