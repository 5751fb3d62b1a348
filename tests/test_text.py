"""storelab.text: a checkpoint folder's tokenizer, read with the tokenizers library."""

import json

import pytest

from storelab.text import Tokenizer, TokenizerError
from tests.helpers import SAMPLE_TEXT, write_tokenizer

TEMPLATE = ("{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<s>assistant:{% endif %}")


def test_round_trip_and_specials(tmp_path):
    write_tokenizer(tmp_path, chat_template=TEMPLATE)
    tok = Tokenizer.from_folder(tmp_path)
    ids = tok.encode("The river rose in the night.")
    assert ids[0] == tok.token_id("<s>")                    # add_bos_token
    assert tok.decode(ids) == "The river rose in the night."
    assert tok.eos_id == tok.token_id("</s>")
    assert len(tok.encode(SAMPLE_TEXT, special=False)) < len(SAMPLE_TEXT) / 3   # BPE merges learned
    assert tok.vocab_size <= 512


def test_chat_template(tmp_path):
    write_tokenizer(tmp_path, chat_template=TEMPLATE)
    tok = Tokenizer.from_folder(tmp_path)
    text = tok.render([{"role": "user", "content": "Where is Varen?"}])
    assert text == "<s>user: Where is Varen?\n<s>assistant:"
    ids = tok.chat([{"role": "user", "content": "Where is Varen?"}])
    assert ids.count(tok.token_id("<s>")) == 2                # the template's own, none added
    assert tok.decode(ids, skip_special=False) == text


def test_no_template_named(tmp_path):
    write_tokenizer(tmp_path)
    with pytest.raises(TokenizerError, match="tokenizer_config.json: no chat_template"):
        Tokenizer.from_folder(tmp_path).render([{"role": "user", "content": "hi"}])


def test_missing_and_malformed_name_the_file(tmp_path):
    with pytest.raises(TokenizerError, match=r"tokenizer\.json: missing"):
        Tokenizer.from_folder(tmp_path)
    (tmp_path / "tokenizer.model").write_bytes(b"\0")
    with pytest.raises(TokenizerError, match="found tokenizer.model"):
        Tokenizer.from_folder(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerError, match=r"tokenizer\.json: not a tokenizer"):
        Tokenizer.from_folder(tmp_path)
    write_tokenizer(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("[1, 2")
    with pytest.raises(TokenizerError, match=r"tokenizer_config\.json: not valid JSON"):
        Tokenizer.from_folder(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": 3}))
    with pytest.raises(TokenizerError, match="chat_template must be a string"):
        Tokenizer.from_folder(tmp_path)
