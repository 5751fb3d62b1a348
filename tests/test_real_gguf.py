"""The two real checkpoints of the ``real`` extra, read from their GGUF files as a user holds them:
SmolLM2-135M-Instruct (Q4_1, llama) and Gemma 3 270M (Q4_K_M, gemma3). Each skips when its package is not
installed (``make`` installs both from real.txt).

* logits equal transformers' GGUF load of the same file (its own dequantization and name mapping);
* a greedy continuation of a fixed chat prompt equals transformers' token for token, and
  ``storelab generate FILE --prompt ... --chat`` answers with it;
* ``storelab memory FILE --context 32768`` on Gemma is llama.cpp's iSWA allocation, computed here by hand
  from the header: the global layers' 32,768 cells and the window layers' pad(512 + n_ubatch, 256) cells.
"""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from storelab.cli import app
from storelab.subjects.real import real_subject

PROMPT = "What is the capital of France?"


def _path(name: str):
    s = real_subject(name)
    if not s.available():
        pytest.skip(f"{s.packages[0]} is not installed (the real extra: make installs real.txt)")
    return s.path()


@pytest.fixture(scope="module")
def smollm2():
    """(path, storelab model, storelab tokenizer, transformers model, transformers tokenizer)"""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from storelab.checkpoint import load
    from storelab.text import Tokenizer

    path = _path("smollm2-135m")
    ours = load(path, dtype="fp32")
    theirs = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    return path, ours, Tokenizer.load(path), theirs, AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def _logits_equal(ours, theirs, ids):
    with torch.no_grad():
        want = theirs(torch.tensor([ids])).logits[0].float()
        got = ours(torch.tensor([ids]))[0][0].float()
    err = (got - want).abs().max().item()
    assert err <= 1e-4 * want.abs().max().item(), f"max abs diff {err:.3g} (logits up to {want.abs().max():.3g})"


def test_smollm2_logits_and_tokens_equal_transformers(smollm2):
    path, ours, tok, theirs, their_tok = smollm2
    text = "The Eiffel Tower is in Paris. Ça coûte 12,50 € — 東京 🙂\n\n  def f(x):\n\treturn x"
    assert tok.encode(text) == their_tok.encode(text)
    _logits_equal(ours, theirs, tok.encode(text))


def test_smollm2_chat_answer_equals_transformers(smollm2):
    from storelab.commands.generate import generate_text

    path, ours, tok, theirs, their_tok = smollm2
    msgs = [{"role": "user", "content": PROMPT}]
    ids = tok.chat(msgs)
    assert ids == their_tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
    with torch.no_grad():
        want = theirs.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False)[0, len(ids):].tolist()
    stop = {tok.eos_id} - {None}
    want = want[:next((i for i, t in enumerate(want) if t in stop), len(want))]
    got = generate_text(ours, tok, ids, new_tokens=12, stop=stop)
    assert got["tokens"] == want
    assert "Paris" in tok.decode(want)
    res = CliRunner().invoke(app, ["generate", str(path), "--prompt", PROMPT, "--chat", "--new-tokens", "12",
                                   "--json"])
    assert res.exit_code == 0, res.output
    doc = json.loads(res.output)
    assert doc["text"].strip() == tok.decode(want).strip()


def test_gemma3_logits_equal_transformers():
    from transformers import AutoModelForCausalLM

    from storelab.checkpoint import load
    from storelab.text import Tokenizer

    path = _path("gemma3-270m")
    ours = load(path, dtype="fp32")
    theirs = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    _logits_equal(ours, theirs, Tokenizer.load(path).encode("The capital of France is"))


def test_gemma3_memory_is_llama_cpps_iswa():
    import gguf

    path = _path("gemma3-270m")
    meta = gguf.GGUFReader(path).fields

    def val(key):
        f = meta[key]
        return f.contents()

    n_layer, window = val("gemma3.block_count"), val("gemma3.attention.sliding_window")
    kv, k, v = val("gemma3.attention.head_count_kv"), val("gemma3.attention.key_length"), \
        val("gemma3.attention.value_length")
    n_global = len(range(5, n_layer, 6))          # Gemma 3: every sixth layer is global (5 local : 1 global)
    cell = kv * (k + v) * 2                        # f16 keys and values of one layer
    swa_cells = -(-(window + 512) // 256) * 256    # pad(n_swa + n_ubatch, 256)
    want = n_global * 32768 * cell + (n_layer - n_global) * swa_cells * cell
    res = CliRunner().invoke(app, ["memory", str(path), "--context", "32768", "--json"])
    assert res.exit_code == 0, res.output
    model = json.loads(res.output)["models"][0]
    assert model["engine"]["name"] == "llama.cpp"                      # a GGUF's default engine
    assert model["engine"]["total_bytes"] == want == (96 + 15) * 2**20  # 3 x 32,768 and 15 x 1,024 cells
    text = CliRunner().invoke(app, ["memory", str(path), "--context", "32768"]).output
    assert "llama.cpp" in text
