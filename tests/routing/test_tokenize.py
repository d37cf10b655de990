"""The router's tokenizer: the model's files, vLLM's rules for text and chat prompts, token ids as is."""

from __future__ import annotations

from pathlib import Path

import pytest

from progrouter.config import ConfigError
from progrouter.routing.tokenize import PromptTokenizer, prompt_token_ids
from support.tiny_tokenizer import BOS_ID, token_id, write_tiny_tokenizer


@pytest.fixture
def tok(tmp_path: Path) -> PromptTokenizer:
    return PromptTokenizer.load(str(write_tiny_tokenizer(tmp_path / "model")))


def test_text_prompt_gets_the_special_tokens_as_completions_does(tok: PromptTokenizer) -> None:
    assert tok.encode_text("w1 w2 w3") == [BOS_ID, token_id("w1"), token_id("w2"), token_id("w3")]


def test_chat_is_rendered_with_the_model_template_and_encoded_without_extra_specials(
    tok: PromptTokenizer,
) -> None:
    messages = [{"role": "system", "content": "w7"}, {"role": "user", "content": "w8 w9"}]
    assert tok.render_chat(messages) == "<s><|system|> w7 <|end|> <|user|> w8 w9 <|end|> <|assistant|>"
    ids = tok.encode_chat(messages)
    assert ids[0] == BOS_ID and ids.count(BOS_ID) == 1  # the template's BOS, not a second one
    assert ids[-1] == token_id("<|assistant|>")


def test_a_longer_conversation_extends_the_token_prefix(tok: PromptTokenizer) -> None:
    first = [{"role": "user", "content": "w1 w2"}]
    second = [*first, {"role": "assistant", "content": "w3"}, {"role": "user", "content": "w4"}]
    a, b = tok.encode_chat(first), tok.encode_chat(second)
    assert b[: len(a) - 1] == a[:-1]  # all but the generation prompt is a prefix of the next turn


def test_prompt_token_ids_by_kind(tok: PromptTokenizer) -> None:
    assert prompt_token_ids({"prompt": [5, 6, 7]}, None) == [5, 6, 7]
    assert prompt_token_ids({"prompt": [[5, 6]]}, tok) == [5, 6]
    assert prompt_token_ids({"prompt": "w1"}, tok) == [BOS_ID, token_id("w1")]
    assert prompt_token_ids({"prompt": "w1"}, None) is None  # text without a tokenizer: unknown
    assert prompt_token_ids({"messages": [{"role": "user", "content": "w1"}]}, None) is None
    assert prompt_token_ids({"prompt": [True, 2]}, None) is None
    assert prompt_token_ids({"max_tokens": 3}, tok) is None
    assert prompt_token_ids(None, tok) is None


def test_a_template_that_raises_gives_no_ids(tmp_path: Path) -> None:
    folder = write_tiny_tokenizer(tmp_path / "m", chat_template="{{ raise_exception('no system role') }}")
    tok = PromptTokenizer.load(str(folder))
    assert prompt_token_ids({"messages": [{"role": "user", "content": "w1"}]}, tok) is None


def test_chat_template_jinja_file_wins_and_tojson_works(tmp_path: Path) -> None:
    folder = write_tiny_tokenizer(tmp_path / "m")
    (folder / "chat_template.jinja").write_text("{{ messages[0]['content'] }} {{ tools | tojson }}")
    tok = PromptTokenizer.load(str(folder))
    assert tok.render_chat([{"role": "user", "content": "w1"}], tools=[{"a": "é"}]) == 'w1 [{"a": "é"}]'


def test_bad_paths_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"holds no tokenizer\.json"):
        PromptTokenizer.load(str(tmp_path))
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ConfigError, match="cannot load"):
        PromptTokenizer.load(str(tmp_path))


def test_a_model_without_template_encodes_text_only(tmp_path: Path) -> None:
    tok = PromptTokenizer.load(
        str(write_tiny_tokenizer(tmp_path / "m", chat_template=None) / "tokenizer.json")
    )
    assert tok.encode_text("w2") == [BOS_ID, token_id("w2")]
    assert prompt_token_ids({"messages": [{"role": "user", "content": "w1"}]}, tok) is None
