"""Token usage read from backend responses, JSON or SSE, as forwarded (upstream ``program_adapter.rs``).

The scheduler learns a request's real prompt size, cached prefix and output length only from the ``usage``
object a backend returns. It may sit at ``usage`` (OpenAI chat/completions, Anthropic message_delta),
``message.usage`` (Anthropic message_start) or ``response.usage`` (OpenAI Responses events), in OpenAI or
Anthropic shape. Anthropic splits the prompt into uncached input, cache reads and cache writes, so the prompt
is their sum (10 + 30 + 20 → 60), never counted twice. Streams repeat usage; values merge monotonically.

Three SSE dialects end differently, and the accumulator knows each end (``done``): chat and completions with
``data: [DONE]``; Anthropic Messages with the ``message_stop`` event (usage came in ``message_start`` and
``message_delta``); OpenAI Responses with ``response.completed`` (or ``response.incomplete`` /
``response.failed``), whose data line carries the usage. A stream cut before its end keeps whatever usage
went by (none, or ``message_start``'s prompt alone); the ticket completes once with that.

Sans-I/O: the SSE accumulator is fed raw byte chunks as they are forwarded and an explicit ``now``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from progrouter.program import UsageObservation
from progrouter.routing.hash_key import is_mapping

MAX_PARTIAL_SSE_LINE_BYTES = 1024 * 1024
_USAGE_MARKER = b'"usage"'
_DONE_MARKER = b"[DONE]"
_EVENT_PREFIX = b"event:"
# Events after which a stream says nothing more (Anthropic Messages, OpenAI Responses).
_TERMINAL_EVENTS = frozenset(
    {b"message_stop", b"response.completed", b"response.incomplete", b"response.failed"}
)
_CACHE_READ_KEYS = ("cache_read_input_tokens", "cached_input_tokens", "cached_tokens")
# Objects whose own ``usage`` counts too: Anthropic's message_start, OpenAI Responses events.
_NESTING_KEYS = ("message", "response")


def _count(value: Any) -> int | None:
    """A token count: a non-negative JSON integer (bools and floats are not counts)."""
    if type(value) is int or (isinstance(value, int) and not isinstance(value, bool)):  # exact int first
        return value if value >= 0 else None
    return None


def _first_count(usage: Mapping[str, Any], keys: tuple[str, ...]) -> int | None:
    for key in keys:
        value = usage.get(key)
        if value is not None:  # most keys are absent: no call for them
            count = _count(value)
            if count is not None:
                return count
    return None


def _nested_count(usage: Mapping[str, Any], outer: str, inner: str) -> int | None:
    details = usage.get(outer)
    return _count(details.get(inner)) if details is not None and is_mapping(details) else None


def usage_from_object(usage: Mapping[str, Any]) -> UsageObservation:
    """One ``usage`` object in OpenAI or Anthropic shape."""
    cache_read = _first_count(usage, _CACHE_READ_KEYS)
    prompt = _count(usage.get("prompt_tokens"))
    if prompt is None:
        input_tokens = _count(usage.get("input_tokens"))
        if input_tokens is not None:
            creation = _count(usage.get("cache_creation_input_tokens")) or 0
            prompt = input_tokens + (cache_read or 0) + creation
    completion = _first_count(usage, ("completion_tokens", "output_tokens"))
    cached = _nested_count(usage, "prompt_tokens_details", "cached_tokens")
    if cached is None:
        cached = _nested_count(usage, "input_tokens_details", "cached_tokens")
    if cached is None:
        cached = cache_read
    return UsageObservation(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached)


def merge_usage_from_value(into: UsageObservation, value: Any) -> None:
    """Merge every usage object a decoded response or event carries into ``into``."""
    if not is_mapping(value):
        return
    usage = value.get("usage")
    if is_mapping(usage):
        into.merge(usage_from_object(usage))
    for outer in _NESTING_KEYS:
        node = value.get(outer)
        if node is not None and is_mapping(node):  # the usual answer has neither: no call for it
            usage = node.get("usage")
            if is_mapping(usage):
                into.merge(usage_from_object(usage))


def parse_json_usage(body: bytes) -> UsageObservation:
    """Usage of a complete JSON response body (empty when absent or unparsable)."""
    usage = UsageObservation()
    merge_json_usage(usage, body)
    return usage


def merge_json_usage(into: UsageObservation, body: bytes) -> None:
    """Merge the usage of a complete JSON response body into ``into`` (nothing when absent or unparsable)."""
    try:  # not contextlib.suppress: a context manager per response costs more than the parse
        value = orjson.loads(body)
    except orjson.JSONDecodeError:
        return
    merge_usage_from_value(into, value)


class SseUsageAccumulator:
    """Collects usage from a server-sent-event stream fed in arbitrary byte chunks.

    Lines may be split across chunks; a partial line longer than 1 MiB is dropped (up to its end) rather
    than buffered without bound. Only ``data:`` lines that mention ``"usage"`` are decoded, so the cost on a
    long token stream is a byte search per line.
    """

    __slots__ = ("_buffer", "_ending", "_skipping", "done", "first_output_at", "usage")

    def __init__(self) -> None:
        self.usage = UsageObservation()
        self.first_output_at: float | None = None
        self.done = False  # the stream's end went by (see the module): the worker has said all it will say
        self._buffer = bytearray()
        self._skipping = False  # inside an oversized line: drop bytes until its newline
        self._ending = False  # the last ``event:`` line named a terminal event: its data line ends the stream

    def feed(self, chunk: bytes, now: float) -> None:
        """Take the next forwarded chunk; ``now`` stamps the first non-empty one (decode start)."""
        if not chunk:
            return
        if self.first_output_at is None:
            self.first_output_at = now
        start = 0
        while True:
            newline = chunk.find(b"\n", start)
            if newline < 0:
                break
            if self._skipping:
                self._skipping = False
            elif self._buffer:
                self._buffer += chunk[start:newline]
                self._line(bytes(self._buffer))
                self._buffer.clear()
            else:
                self._line(chunk[start:newline])
            start = newline + 1
        if start < len(chunk) and not self._skipping:
            self._buffer += chunk[start:]
            if len(self._buffer) > MAX_PARTIAL_SSE_LINE_BYTES:
                self._buffer.clear()
                self._skipping = True

    def finish(self) -> UsageObservation:
        """Flush a final unterminated line and return the merged usage."""
        if self._buffer and not self._skipping:
            self._line(bytes(self._buffer))
        self._buffer.clear()
        self._skipping = False
        return self.usage

    def decode_seconds(self, now: float) -> float | None:
        """Seconds since the first output chunk, or None if nothing was streamed."""
        return None if self.first_output_at is None else max(0.0, now - self.first_output_at)

    def _line(self, line: bytes) -> None:
        if line.startswith(_EVENT_PREFIX):
            self._ending = line[6:].strip() in _TERMINAL_EVENTS
            return
        if _USAGE_MARKER not in line:
            if self._ending:
                if line.startswith(b"data:"):  # a terminal event's data line: the end
                    self.done = True
            elif _DONE_MARKER in line and line.strip().removeprefix(b"data:").strip() == b"[DONE]":
                self.done = True
            return
        line = line.strip()
        if not line.startswith(b"data:"):
            return
        data = line[5:].strip()
        if not data or data == b"[DONE]":
            return
        try:  # not contextlib.suppress: a context manager per usage line costs more than the parse
            value = orjson.loads(data)
        except orjson.JSONDecodeError:
            value = None
        merge_usage_from_value(self.usage, value)
        if self._ending:
            self.done = True  # after its usage is in: the ticket may be finished once ``done`` is seen
