"""A GGUF file's tokenizer: llama.cpp's ``tokenizer.*`` metadata rebuilt as a ``tokenizers.Tokenizer``.

A GGUF (llama.cpp, Ollama, LM Studio) has no ``tokenizer.json``: its vocabulary, merges, token
types, special token ids and chat template are metadata under llama.cpp's key names
(``gguf-py/gguf/constants.py`` ``Keys.Tokenizer``; written by ``gguf-py/gguf/vocab.py`` and
``convert_hf_to_gguf.py``, read by ``src/llama-vocab.cpp``). ``read_vocab(path)`` reads those keys
from the header (``storelab.checkpoint.gguf.header``: no tensor byte is read); ``build(vocab)``
turns them into the fast tokenizer, the named special tokens and the BOS flag that
``storelab.text.Tokenizer.from_gguf`` wraps.

The reference is transformers 5.23's reading of the same keys (``integrations/gguf/
gguf_tokenizer_mapping.py``: ``get_gguf_tokenizer``, ``convert_gguf_tokenizer`` and the tokenizer
classes it hands the vocabulary to), so that ids and decoded text equal
``AutoTokenizer.from_pretrained(folder, gguf_file=name)``'s; ``tests/test_text_gguf.py`` holds them
equal on byte-level and SentencePiece files. What ``tokenizer.ggml.model`` (and, for SentencePiece
files, ``general.architecture``) selects:

| model  | architecture          | built as                                                               |
|--------|-----------------------|------------------------------------------------------------------------|
| gpt2   | any                   | byte-level BPE: GPT-2's pre-tokenizer and byte alphabet, the file's merges |
| llama  | gemma, gemma2, gemma3 | Gemma's SentencePiece BPE: a space is ``▁`` (normalizer), no prefix space; multi-space tokens stored with real spaces respelled ``▁``; merges rebuilt in file order |
| llama  | phi3                  | Llama's, but ``▁`` prepended by the normalizer, not a pre-tokenizer     |
| llama  | any other             | Llama's SentencePiece BPE: ``▁`` before the first piece (Metaspace), byte fallback, merges from the file or rebuilt from the scores |
| gemma4 | any                   | Gemma's, merges from the file or the scores; no BOS added               |

Then, whatever the model:

- ``tokenizer.ggml.pre`` names the pre-tokenizer; for the names in ``SPLITS`` the text is split
  by that regex (llama.cpp ``llama-vocab.cpp``'s per-name regexes, as transformers spells them)
  before the byte-level mapping; other names keep the recipe's own.
- token types (``gguf.TokenType``): CONTROL (3) tokens are special added tokens (matched whole in
  text, dropped by ``decode(skip_special=True)``), except in a byte-level vocabulary a token
  spelled outside the byte alphabet (a mislabel); USER_DEFINED (4) tokens are plain added tokens.
- ``bos/eos/unknown/padding_token_id`` name the special tokens; the tokens the reference class
  names by default (``<s>``, ``<|endoftext|>``, ...) are special too where the vocabulary has them.
- BOS is added when ``tokenizer.ggml.add_bos_token`` says so (a ``llama`` vocabulary without the
  key adds it, as llama.cpp does), EOS when ``add_eos_token`` does.

Where transformers departs from llama.cpp we follow transformers (the oracle): it ignores
``tokenizer.ggml.add_space_prefix`` (Llama's recipe always prepends ``▁``), and knows no split
regex for some pre-tokenizer names llama.cpp has (``smollm``'s single digits: SmolLM2's
vocabulary holds no multi-digit token, so ids agree there). A default-named token that the
vocabulary lacks is not appended (transformers appends it with a new id past the model's rows).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from collections.abc import Sequence
from typing import Any, Callable

__all__ = ["GgufVocab", "Recipe", "read_vocab", "build", "recipe_for", "SPLITS", "RECIPES"]

# gguf.TokenType (gguf-py/gguf/constants.py)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

KEY = "tokenizer.ggml."
SPECIAL_IDS = {"bos_token": "bos_token_id", "eos_token": "eos_token_id",
               "unk_token": "unknown_token_id", "pad_token": "padding_token_id"}


def _error(msg: str):
    from storelab.text import TokenizerError

    return TokenizerError(msg)


# -- the metadata -------------------------------------------------------------------------------
@dataclass(frozen=True)
class GgufVocab:
    """The ``tokenizer.*`` keys of one GGUF file, checked (errors name the file and the key)."""

    path: Path
    arch: str                            # general.architecture
    model: str                           # tokenizer.ggml.model: gpt2, llama, gemma4, ...
    pre: str | None                      # tokenizer.ggml.pre
    tokens: list[str]
    scores: list[float] | None
    types: list[int] | None              # gguf.TokenType per token
    merges: list[tuple[str, str]] | None
    special_ids: dict[str, int]          # bos_token, eos_token, unk_token, pad_token -> id
    add_bos: bool | None                 # None: the key is absent
    add_eos: bool | None
    chat_template: str | None


def read_vocab(path: str | Path) -> GgufVocab:
    """The tokenizer metadata of a GGUF file (its header only)."""
    from storelab.checkpoint.gguf.header import read_header
    from storelab.checkpoint.shards import CheckpointError

    path = Path(path)
    try:
        meta = read_header(path).meta
    except CheckpointError as e:
        raise _error(str(e)) from None

    def get(key: str, kind: type | tuple[type, ...], default: Any = None) -> Any:
        v = meta.get(key, default)
        if v is not default and (not isinstance(v, kind) or (kind in (int, float) and isinstance(v, bool))):
            raise _error(f"{path}: {key} is {type(v).__name__} {v!r:.60}, expected {getattr(kind, '__name__', kind)}")
        return v

    def array(key: str, kind: type | tuple[type, ...], n: int | None) -> list | None:
        v = meta.get(key)
        if v is None:
            return None
        if isinstance(v, (str, bytes)) or not isinstance(v, Sequence):
            raise _error(f"{path}: {key} is {type(v).__name__} {v!r:.60}, expected an array")
        v = list(v)     # the header may keep a string array undecoded until read
        if n is not None and len(v) != n:
            raise _error(f"{path}: {key} has {len(v)} entries, tokenizer.ggml.tokens {n}")
        bad = next((i for i, x in enumerate(v) if not isinstance(x, kind) or isinstance(x, bool)), None)
        if bad is not None:
            raise _error(f"{path}: {key}[{bad}] is {type(v[bad]).__name__} {v[bad]!r:.60}")
        return v

    model = get(KEY + "model", str)
    if model is None:
        raise _error(f"{path}: no {KEY}model in its metadata: the GGUF carries no tokenizer")
    tokens = array(KEY + "tokens", str, None)
    if not tokens:
        raise _error(f"{path}: no {KEY}tokens in its metadata (tokenizer.ggml.model is {model!r})")
    merges = None
    if (raw := array(KEY + "merges", str, None)) is not None:
        merges = []
        for i, m in enumerate(raw):
            pair = tuple(m.split(" "))
            if len(pair) != 2:
                raise _error(f"{path}: {KEY}merges[{i}] is {m!r}: expected two pieces separated by one space")
            merges.append(pair)
    ids = {}
    for name, key in SPECIAL_IDS.items():
        i = get(KEY + key, int)
        if i is not None and not 0 <= i < len(tokens):
            raise _error(f"{path}: {KEY}{key} is {i}, outside the {len(tokens)} tokens")
        if i is not None:
            ids[name] = i
    return GgufVocab(
        path=path, arch=get("general.architecture", str, ""), model=model, pre=get(KEY + "pre", str),
        tokens=tokens, scores=array(KEY + "scores", (int, float), len(tokens)),
        types=array(KEY + "token_type", int, len(tokens)), merges=merges, special_ids=ids,
        add_bos=get(KEY + "add_bos_token", bool), add_eos=get(KEY + "add_eos_token", bool),
        chat_template=get("tokenizer.chat_template", str))


# -- the pieces the recipes share ------------------------------------------------------------------
def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map (openai/gpt-2 ``encoder.py`` ``bytes_to_unicode``):
    printable Latin-1 bytes stand for themselves, the others for 256 + n in byte order."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    spelled = {b: chr(b) for b in keep}
    extra = (b for b in range(256) if b not in spelled)
    spelled.update({b: chr(256 + n) for n, b in enumerate(extra)})
    return dict(sorted(spelled.items()))


def merges_from_scores(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """BPE merges implied by a vocabulary: every split of a token into two tokens, best score first
    (ties: the longer left piece, then the longer right one), each token's splits in vocabulary order.
    SentencePiece BPE files store scores, not merges; this is transformers' ``generate_merges``
    (``tokenization_utils_base.py``), which the oracle uses, in the same order."""
    found = []
    for piece, score in scores.items():
        local = [(piece[:k], piece[k:], score) for k in range(1, len(piece))
                 if piece[:k] in vocab and piece[k:] in vocab]
        local.sort(key=lambda m: (vocab[m[0]], vocab[m[1]]))
        found.extend(local)
    found.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)   # stable: equal keys keep order
    return [(left, right) for left, right, _ in found]


def _merges(v: GgufVocab, vocab: dict[str, int], scores: dict[str, float] | None = None) -> list[tuple[str, str]]:
    """The file's merges, or those its scores (or the given ranking) imply."""
    if v.merges is not None:
        return v.merges
    if scores is None:
        if v.scores is None:
            raise _error(f"{v.path}: neither {KEY}merges nor {KEY}scores: a {v.model!r} vocabulary needs one")
        scores = dict(zip(v.tokens, v.scores))
    return merges_from_scores(vocab, scores)


def _spm_decoder(strip_prefix: bool):
    from tokenizers import decoders

    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if strip_prefix:   # the ▁ Metaspace put before the first piece
        steps.append(decoders.Strip(content=" ", left=1, right=0))
    return decoders.Sequence(steps)


# -- the recipes ----------------------------------------------------------------------------------
def _byte_level(v: GgufVocab):
    """transformers ``byte_level_tokenizer`` -> ``GPT2Tokenizer``: tokens the file spells with real
    bytes (added tokens llama.cpp stores decoded) are respelled in the byte alphabet."""
    from tokenizers import Tokenizer as Backend, decoders, models, pre_tokenizers

    spell = byte_alphabet()
    alphabet = set(spell.values())
    vocab = {t if set(t) <= alphabet else "".join(spell[b] for b in t.encode("utf-8")): i
             for i, t in enumerate(v.tokens)}
    backend = Backend(models.BPE(vocab=vocab, merges=_merges(v, {t: i for i, t in enumerate(v.tokens)}),
                                 dropout=None, continuing_subword_prefix="", end_of_word_suffix="",
                                 fuse_unk=False))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    return backend


def _llama_spm(v: GgufVocab):
    """transformers ``sentencepiece_tokenizer`` -> ``LlamaTokenizer`` (legacy=False: ``▁`` before the
    first piece only)."""
    from tokenizers import Tokenizer as Backend, models, pre_tokenizers

    vocab = {t: i for i, t in enumerate(v.tokens)}
    backend = Backend(models.BPE(vocab=vocab, merges=_merges(v, vocab), fuse_unk=True, byte_fallback=True,
                                 dropout=None))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
    backend.decoder = _spm_decoder(strip_prefix=True)
    return backend


def _phi3_spm(v: GgufVocab):
    """transformers ``phi3_tokenizer``: Llama's, the ``▁`` prefix and spaces from a normalizer, so a
    text starting with a space keeps one more ``▁`` than Metaspace gives."""
    from tokenizers import normalizers

    backend = _llama_spm(v)
    backend.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    backend.pre_tokenizer = None
    return backend


def _gemma_backend(vocab: dict[str, int], merges: list[tuple[str, str]]):
    """transformers ``GemmaTokenizer``'s pipeline."""
    from tokenizers import Tokenizer as Backend, models, normalizers, pre_tokenizers

    backend = Backend(models.BPE(vocab=vocab, merges=merges, fuse_unk=True, unk_token="<unk>", dropout=None,
                                 byte_fallback=True))
    backend.normalizer = normalizers.Replace(" ", "▁")
    backend.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
    backend.decoder = _spm_decoder(strip_prefix=False)
    return backend


def _gemma_spm(v: GgufVocab):
    """transformers ``gemma_tokenizer``: a token of spaces only is stored with real spaces and looked
    up as ``▁``s; the file's scores do not follow Gemma's merge order, its token order does."""
    tokens = ["▁" * len(t) if " " in t and not t.strip() else t for t in v.tokens]
    vocab = {t: i for i, t in enumerate(tokens)}
    return _gemma_backend(vocab, _merges(v, vocab, {t: -i for i, t in enumerate(tokens)}))


def _gemma4(v: GgufVocab):
    vocab = {t: i for i, t in enumerate(v.tokens)}
    return _gemma_backend(vocab, _merges(v, vocab))


@dataclass(frozen=True)
class Recipe:
    """How one kind of GGUF vocabulary becomes a ``tokenizers.Tokenizer``."""

    name: str
    build: Callable[[GgufVocab], Any]
    class_specials: tuple[str, ...]      # tokens the reference class makes special (where the vocabulary has them)
    bos_unsaid: bool = False             # add BOS when the file has no add_bos_token key
    bos_forced: bool | None = None       # add BOS (or not) whatever the file says


LLAMA_SPECIALS = ("<unk>", "<s>", "</s>")
GEMMA_SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>")
RECIPES = {
    "gpt2": Recipe("byte-level BPE", _byte_level, ("<|endoftext|>",)),
    "llama": Recipe("SentencePiece BPE (Llama)", _llama_spm, LLAMA_SPECIALS, bos_unsaid=True),
    # gemma4: llama.cpp forces BOS on, the reference tokenizer does not (ggml-org/llama.cpp#21500)
    "gemma4": Recipe("SentencePiece BPE (Gemma 4)", _gemma4, GEMMA_SPECIALS, bos_forced=False),
}
SPM_BY_ARCH = {    # a "llama" vocabulary built another way for these architectures
    "gemma": Recipe("SentencePiece BPE (Gemma)", _gemma_spm, GEMMA_SPECIALS, bos_unsaid=True),
    "gemma2": Recipe("SentencePiece BPE (Gemma)", _gemma_spm, GEMMA_SPECIALS, bos_unsaid=True),
    "gemma3": Recipe("SentencePiece BPE (Gemma)", _gemma_spm, GEMMA_SPECIALS, bos_unsaid=True),
    "phi3": Recipe("SentencePiece BPE (Phi-3)", _phi3_spm, LLAMA_SPECIALS, bos_unsaid=True),
}

# -- pre-tokenizer names -> split regexes (llama.cpp llama-vocab.cpp; transformers' spelling) ---------
_LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
           r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
          r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
           r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
           r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
           r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_GPT4O = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
          r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPLITS = {
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
                     "jina-v5-nano", "dbrx", "smaug-bpe"), _LLAMA3),
    "tekken": _TEKKEN,
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"), _QWEN2),
    "qwen35": _QWEN35,
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O),
}


def recipe_for(v: GgufVocab) -> Recipe:
    if v.model == "llama" and v.arch in SPM_BY_ARCH:
        return SPM_BY_ARCH[v.arch]
    if v.model not in RECIPES:
        raise _error(f"{v.path}: {KEY}model is {v.model!r}, not one this library reads "
                     f"(known: {', '.join(sorted(RECIPES))})")
    return RECIPES[v.model]


# -- all together ---------------------------------------------------------------------------------
def build(v: GgufVocab) -> tuple[Any, dict[str, str], bool]:
    """``(tokenizers.Tokenizer, {bos_token: text, ...}, add_bos)`` for a GGUF's vocabulary; the
    tokenizer's post-processor adds BOS/EOS as the file asks."""
    from tokenizers import AddedToken, Regex, pre_tokenizers, processors

    recipe = recipe_for(v)
    backend = recipe.build(v)
    if (split := SPLITS.get(v.pre)) is not None:
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])

    def special(t: str):
        return AddedToken(t, normalized=False, special=True)

    # the order transformers adds them in: the class's defaults, CONTROL, USER_DEFINED, the named ids
    backend.add_special_tokens([special(t) for t in recipe.class_specials if backend.token_to_id(t) is not None])
    types = v.types or ()
    alphabet = set(byte_alphabet().values()) if v.model == "gpt2" else None
    backend.add_special_tokens([special(t) for t, k in zip(v.tokens, types)
                                if k == CONTROL and (alphabet is None or set(t) <= alphabet)])
    known = backend.get_vocab(with_added_tokens=True)
    backend.add_tokens([AddedToken(t, normalized=False, special=False) for t, k in zip(v.tokens, types)
                        if k == USER_DEFINED and t in known])
    specials = {name: v.tokens[i] for name, i in v.special_ids.items()}
    added = {t.content for t in backend.get_added_tokens_decoder().values()}
    backend.add_special_tokens([special(t) for t in dict.fromkeys(specials.values()) if t not in added])

    add_bos = recipe.bos_forced if recipe.bos_forced is not None else (
        v.add_bos if v.add_bos is not None else recipe.bos_unsaid)
    add_bos = add_bos and "bos_token" in specials
    add_eos = bool(v.add_eos) and "eos_token" in specials
    bos, eos = specials.get("bos_token"), specials.get("eos_token")
    single = f"{f'{bos}:0 ' if add_bos else ''}$A:0{f' {eos}:0' if add_eos else ''}"
    pair = f"{single}{f' {bos}:1' if add_bos else ''} $B:1{f' {eos}:1' if add_eos else ''}"
    backend.post_processor = processors.TemplateProcessing(
        single=single, pair=pair,
        special_tokens=[(t, backend.token_to_id(t)) for t, on in ((bos, add_bos), (eos, add_eos)) if on])
    return backend, specials, add_bos
