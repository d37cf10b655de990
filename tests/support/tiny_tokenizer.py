"""A tiny Hugging Face tokenizer written to disk: WordLevel over ``w0..w499`` and chat markers, BOS added to
text prompts by its post-processor, a chat template in tokenizer_config.json (as a model directory has)."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, models, pre_tokenizers, processors

SPECIALS = ("<unk>", "<s>", "</s>")
MARKERS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
WORDS = tuple(f"w{i}" for i in range(500))
BOS_ID = 1
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} <|end|> {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def token_id(word: str) -> int:
    return (SPECIALS + MARKERS + WORDS).index(word)


def write_tiny_tokenizer(folder: Path, *, chat_template: str | None = CHAT_TEMPLATE) -> Path:
    """The model directory ``folder`` with tokenizer.json and tokenizer_config.json; returns ``folder``."""
    vocab = {w: i for i, w in enumerate(SPECIALS + MARKERS + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(list(SPECIALS))  # split out of the text wherever they stand, as in real models
    tok.add_tokens(list(MARKERS))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", BOS_ID)])
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    config: dict[str, object] = {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "unk_token": "<unk>"}
    if chat_template is not None:
        config["chat_template"] = chat_template
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return folder
