"""A request's prompt token ids, computed in the router from the model's own tokenizer files.

kv_aware matches prompts against the blocks a Rank announced in its KV events, and those are token ids, so the
router needs the ids vLLM will compute, without asking the engine for every request. Token-id prompts are used
as they are. Text prompts are encoded as vLLM's completions endpoint does (with the tokenizer's special
tokens, e.g. BOS); chat messages are rendered with the model's chat template the way vLLM and transformers
render it (a sandboxed jinja2 environment, ``trim_blocks``/``lstrip_blocks``, ``add_generation_prompt``) and
the result is encoded without adding special tokens (the template writes them).

``tokenizers`` and ``jinja2`` are the ``progrouter[kv]`` extra: only ``--tokenizer`` needs them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from progrouter.config import ConfigError

TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "tokenizer_config.json"
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")
_SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string, or ``{"content": ...}``."""
    if isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _pick_template(value: Any) -> str | None:
    """``chat_template`` is a string, or a list of ``{"name", "template"}`` (the one named "default")."""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, Mapping)}
        chosen = named.get("default")
        return chosen if isinstance(chosen, str) else None
    return None


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"tokenizer: cannot read {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"tokenizer: {path} is not a JSON object")
    return data


class PromptTokenizer:
    """Encodes text and chat prompts to the ids the model's vLLM server computes for them."""

    def __init__(self, tokenizer: Any, chat_template: str | None, special_tokens: Mapping[str, str]) -> None:
        self._tokenizer = tokenizer
        self.chat_template = chat_template
        self._special = dict(special_tokens)
        self._template: Any = None
        if chat_template is not None:
            self._template = _compile_template(chat_template)

    @classmethod
    def load(cls, path: str) -> PromptTokenizer:
        """From a model directory (tokenizer.json, tokenizer_config.json, a chat template) or the file."""
        try:
            from tokenizers import Tokenizer
        except ImportError as exc:
            raise ConfigError(
                "--tokenizer needs the tokenizers package: pip install 'progrouter[kv]'"
            ) from exc
        where = Path(path)
        folder = where if where.is_dir() else where.parent
        file = where / TOKENIZER_FILE if where.is_dir() else where
        if not file.is_file():
            raise ConfigError(f"tokenizer: {path} holds no {TOKENIZER_FILE}")
        try:
            tokenizer = Tokenizer.from_file(str(file))
        except Exception as exc:  # tokenizers raises a plain Exception for a malformed file
            raise ConfigError(f"tokenizer: cannot load {file}: {exc}") from exc
        config = _read_json(folder / CONFIG_FILE) if (folder / CONFIG_FILE).is_file() else {}
        template = _pick_template(config.get("chat_template"))
        jinja, as_json = (folder / name for name in TEMPLATE_FILES)
        if jinja.is_file():
            template = jinja.read_text(encoding="utf-8")
        elif template is None and as_json.is_file():
            template = _pick_template(_read_json(as_json).get("chat_template"))
        special = {k: t for k in _SPECIAL_TOKENS if (t := _token_text(config.get(k))) is not None}
        return cls(tokenizer, template, special)

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        # encode_batch, not encode: only the batch call releases the GIL, so a long prompt tokenized in a
        # worker thread does not stall the event loop (encode holds it for the whole call).
        ids: list[int] = self._tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return ids

    def encode_text(self, text: str) -> list[int]:
        """As vLLM's /v1/completions encodes a text prompt (``add_special_tokens`` true)."""
        return self._encode(text, True)

    def render_chat(self, messages: Sequence[Any], tools: Any = None) -> str:
        """The chat template's text for ``messages`` with the generation prompt; ValueError if it fails."""
        if self._template is None:
            raise ValueError("the model has no chat template")
        import jinja2

        try:
            text: str = self._template.render(
                messages=messages, tools=tools, add_generation_prompt=True, **self._special
            )
        except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError) as exc:
            raise ValueError(f"chat template: {exc}") from exc
        return text

    def encode_chat(self, messages: Sequence[Any], tools: Any = None) -> list[int]:
        """As vLLM's /v1/chat/completions: the rendered template, encoded without adding special tokens."""
        return self._encode(self.render_chat(messages, tools), False)


def _compile_template(source: str) -> Any:
    """The template in transformers' environment: sandboxed, trimmed blocks, raise_exception, tojson."""
    try:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as exc:
        raise ConfigError("--tokenizer's chat template needs jinja2: pip install 'progrouter[kv]'") from exc

    def raise_exception(message: str) -> None:
        raise jinja2.TemplateError(message)

    def tojson(value: Any, indent: int | None = None) -> str:
        return json.dumps(value, ensure_ascii=False, indent=indent)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    try:
        return env.from_string(source)
    except jinja2.TemplateError as exc:
        raise ConfigError(f"tokenizer: the chat template does not compile: {exc}") from exc


def _int_ids(value: Any) -> list[int] | None:
    # set(map(type, ...)) walks the list in C: a per-token generator cost milliseconds on long prompts
    if isinstance(value, list) and value and set(map(type, value)) == {int}:
        return value
    return None


def needs_tokenizer(body: Mapping[str, Any] | None) -> bool:
    """Whether the body's prompt is text or chat (token ids need no tokenizer)."""
    if body is None:
        return False
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    return isinstance(prompt, str) or (prompt is None and isinstance(body.get("messages"), list))


def prompt_token_ids(body: Mapping[str, Any] | None, tokenizer: PromptTokenizer | None) -> list[int] | None:
    """The prompt's token ids, or None when they cannot be known (no tokenizer for text, no prompt, a
    template that fails: the policy then falls back to the character-level behaviour)."""
    if body is None:
        return None
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (list, str)):
        prompt = prompt[0]  # a batch of one
    ids = _int_ids(prompt)
    if ids is not None or tokenizer is None:
        return ids
    try:
        if isinstance(prompt, str):
            return tokenizer.encode_text(prompt)
        messages = body.get("messages")
        if isinstance(messages, list) and messages:
            return tokenizer.encode_chat(messages, body.get("tools"))
    except ValueError:
        return None
    return None
