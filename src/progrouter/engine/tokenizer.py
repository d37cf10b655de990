"""A deterministic word tokenizer, so prompts have stable token ids without a model's vocabulary.

Rule: text is split on whitespace; each word is one token. A word ``tok<N>`` with ``3 <= N < vocab_size`` is
token N (so detokenized output re-tokenizes to the same ids); any other word is
``3 + crc32(utf-8 bytes) mod (vocab_size - 3)``. Ids 0-2 are PAD, BOS and EOS and never come from text.
Detokenizing gives the first word seen for an id, else ``tok<N>``; EOS detokenizes to nothing (as vLLM skips
special tokens). No BOS is added: a text prompt of w words is exactly w tokens.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

from progrouter.engine.request import EOS_TOKEN_ID, FIRST_WORD_TOKEN_ID

_MAX_MEMO = 1 << 20


class Tokenizer:
    def __init__(self, vocab_size: int = 32000) -> None:
        self.vocab_size = vocab_size
        self._span = vocab_size - FIRST_WORD_TOKEN_ID
        self._ids: dict[str, int] = {}
        self._words: dict[int, str] = {}

    def encode(self, text: str) -> list[int]:
        ids = self._ids
        out = []
        for word in text.split():
            token = ids.get(word)
            if token is None:
                token = self._word_id(word)
            out.append(token)
        return out

    def _word_id(self, word: str) -> int:
        token: int | None = None
        if word.startswith("tok") and word[3:].isdigit() and word[3:].isascii():
            n = int(word[3:])
            if FIRST_WORD_TOKEN_ID <= n < self.vocab_size:
                token = n
        if token is None:
            token = FIRST_WORD_TOKEN_ID + zlib.crc32(word.encode("utf-8", "surrogatepass")) % self._span
            self._words.setdefault(token, word)
        if len(self._ids) >= _MAX_MEMO:
            self._ids.clear()
        self._ids[word] = token
        return token

    def token_text(self, token: int) -> str:
        """One token as it appears in generated text: a leading space, then the word."""
        if token == EOS_TOKEN_ID or token < FIRST_WORD_TOKEN_ID:
            return ""
        return " " + self._words.get(token, f"tok{token}")

    def decode(self, token_ids: Iterable[int]) -> str:
        return "".join(self.token_text(t) for t in token_ids).removeprefix(" ")

    def is_valid_id(self, token: int) -> bool:
        return 0 <= token < self.vocab_size
