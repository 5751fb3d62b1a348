"""Text in and out: a checkpoint's tokenizer, read with the ``tokenizers`` library.

``Tokenizer.load(PATH)`` reads a checkpoint folder (``from_folder``) or a GGUF file (``from_gguf``:
the vocabulary, merges, special tokens and chat template llama.cpp keeps in its metadata, rebuilt
as the fast tokenizer transformers builds from them; ``storelab.text_gguf``).
``Tokenizer.from_folder(DIR)`` reads ``DIR/tokenizer.json`` (the fast-tokenizer file every
family this library loads ships) and, where present, ``DIR/tokenizer_config.json`` for the
chat template, the special tokens and whether a beginning-of-sequence token is added.
``encode(text) -> list[int]``, ``decode(ids) -> str``; ``chat(messages)`` renders the chat
template (Jinja, as transformers renders it: a sandboxed environment, ``raise_exception``
and ``add_generation_prompt``) and encodes the result without adding special tokens again.

Nothing is downloaded: a folder without ``tokenizer.json``, or with one the library cannot
parse, is a ``TokenizerError`` that names the file. ``sentencepiece``/``tiktoken`` files
(``tokenizer.model``, ``*.tiktoken``) are named in the error, since converting them needs
code this library does not carry.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from storelab.files import read_json, regular_file

__all__ = ["Tokenizer", "TokenizerError", "has_tokenizer"]

TOKENIZER = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
OTHER_FORMATS = ("tokenizer.model", "tiktoken.model", "vocab.json")


class TokenizerError(ValueError):
    """A tokenizer that cannot be read; the message names the file."""


def _regular(path: Path) -> Path:
    """``path`` when a regular file; a folder or a FIFO of a tokenizer file's name refused by name."""
    try:
        return regular_file(path)
    except ValueError as e:
        raise TokenizerError(str(e)) from None


def has_tokenizer(folder: str | Path) -> bool:
    return (Path(folder) / TOKENIZER).is_file()


def _token_text(v: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return v["content"]
    return None


@dataclass
class Tokenizer:
    """A ``tokenizers.Tokenizer`` with the folder's chat template and special tokens."""

    backend: Any
    path: Path
    chat_template: str | None = None
    specials: dict[str, str] = field(default_factory=dict)   # bos_token, eos_token, pad_token, ... -> text
    add_bos: bool = False
    template_from: str = ""      # where the chat template is read, named in errors ("FILE: KEY")

    def __post_init__(self):
        if not self.template_from:
            self.template_from = f"{self.path.parent / TOKENIZER_CONFIG}: chat_template"

    @classmethod
    def load(cls, path: str | Path) -> "Tokenizer":
        """A checkpoint's tokenizer: a GGUF file's (``from_gguf``), else a folder's (``from_folder``)."""
        from storelab.checkpoint.gguf.header import is_gguf

        return cls.from_gguf(path) if is_gguf(path) else cls.from_folder(path)

    @classmethod
    def from_gguf(cls, path: str | Path) -> "Tokenizer":
        """The tokenizer and chat template a GGUF file's metadata holds (its header only; no tensor
        byte read). A file without ``tokenizer.ggml.model``, or with a model this library does not
        build, is a ``TokenizerError`` naming the file and the key."""
        from storelab.text_gguf import build, read_vocab

        vocab = read_vocab(path)
        backend, specials, add_bos = build(vocab)
        return cls(backend=backend, path=vocab.path, chat_template=vocab.chat_template, specials=specials,
                   add_bos=add_bos, template_from=f"{vocab.path}: tokenizer.chat_template")

    @classmethod
    def from_folder(cls, folder: str | Path) -> "Tokenizer":
        from tokenizers import Tokenizer as Backend

        folder = Path(folder)
        path = folder / TOKENIZER
        if path.exists():  # a folder or a FIFO of that name: said so, not "missing"
            _regular(path)
        else:
            others = [n for n in OTHER_FORMATS if (folder / n).exists()]
            hint = f" (found {', '.join(others)}: only tokenizer.json is read)" if others else ""
            raise TokenizerError(f"{path}: missing; text needs the checkpoint's tokenizer.json{hint}")
        try:
            backend = Backend.from_file(str(path))
        except Exception as e:  # the library raises its own Exception type on any malformed file
            raise TokenizerError(f"{path}: not a tokenizer the tokenizers library can read ({e})") from None
        cfg_path = folder / TOKENIZER_CONFIG
        cfg: dict = {}
        if cfg_path.exists():
            try:
                cfg = read_json(cfg_path)
            except ValueError as e:
                raise TokenizerError(str(e)) from None
            if not isinstance(cfg, dict):
                raise TokenizerError(f"{cfg_path}: expected a JSON object, got {type(cfg).__name__}")
        template = cfg.get("chat_template")
        if isinstance(template, list):  # several named templates: the default one
            template = next((t.get("template") for t in template if isinstance(t, dict)
                             and t.get("name") == "default"), None)
        jinja = folder / "chat_template.jinja"  # newer folders keep the template in its own file
        if template is None and jinja.exists():
            _regular(jinja)
            template = jinja.read_text()
        if template is not None and not isinstance(template, str):
            raise TokenizerError(f"{cfg_path}: chat_template must be a string, got {type(template).__name__}")
        specials = {k: t for k in ("bos_token", "eos_token", "pad_token", "unk_token")
                    if (t := _token_text(cfg.get(k))) is not None}
        return cls(backend=backend, path=path, chat_template=template, specials=specials,
                   add_bos=bool(cfg.get("add_bos_token", False)))

    # -- ids ------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def token_id(self, text: str) -> int | None:
        return self.backend.token_to_id(text)

    @property
    def eos_id(self) -> int | None:
        t = self.specials.get("eos_token")
        return None if t is None else self.token_id(t)

    def encode(self, text: str, *, special: bool = True) -> list[int]:
        """Token ids of ``text``; ``special`` adds what the tokenizer's post-processor adds (and BOS if asked)."""
        if not isinstance(text, str):
            raise TypeError(f"text: expected a string, got {type(text).__name__}")
        ids = self.backend.encode(text, add_special_tokens=special).ids
        bos = self.token_id(self.specials["bos_token"]) if self.add_bos and "bos_token" in self.specials else None
        if special and bos is not None and (not ids or ids[0] != bos):
            ids = [bos] + ids
        return ids

    def decode(self, ids: list[int], *, skip_special: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special)

    @property
    def _origin(self) -> Path:
        """The checkpoint named in chat-template errors: the folder, or the GGUF file."""
        return self.path if self.path.suffix == ".gguf" else self.path.parent

    # -- chat -----------------------------------------------------------------------------------
    def render(self, messages: list[dict[str, str]], *, add_generation_prompt: bool = True) -> str:
        """The chat template applied to ``messages`` ([{"role": ..., "content": ...}])."""
        if self.chat_template is None:
            where, key = self.template_from.rsplit(": ", 1)
            raise TokenizerError(f"{where}: no {key} (use plain text)")
        from jinja2 import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(msg):
            raise TokenizerError(f"chat template of {self._origin}: {msg}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
        try:
            return env.from_string(self.chat_template).render(
                messages=messages, add_generation_prompt=add_generation_prompt, **self.specials)
        except (TemplateError, OverflowError, RecursionError) as e:  # the sandbox's range limit, a looping macro
            raise TokenizerError(f"chat template of {self._origin}: {e or type(e).__name__}") from None

    def chat(self, messages: list[dict[str, str]], *, add_generation_prompt: bool = True) -> list[int]:
        """Token ids of the rendered chat (the template writes its own special tokens)."""
        return self.backend.encode(self.render(messages, add_generation_prompt=add_generation_prompt),
                                   add_special_tokens=False).ids
