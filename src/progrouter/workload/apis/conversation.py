"""A Program's prompts as an agent conversation: system prompt, task, then one tool exchange per turn.

The trace gives each request's whole prompt (token blocks that grow turn by turn). An agent harness sends the
same thing as structure: the system prompt (the trace's shared blocks at the front), the task (the rest of the
first prompt) and, on every later turn, the previous turn's tool call followed by its result (the tokens the
new prompt adds). When a prompt does not extend the previous one (its context was cut or rewritten), the
conversation starts over from it. The tool call stands for the model's reply: it is derived from the trace
alone, never from the generated text, so every routing arm sends byte-identical requests.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np

from progrouter.workload.apis.base import RenderInput
from progrouter.workload.prompts import PromptBuilder, Tokens


@dataclass(frozen=True, slots=True)
class ToolExchange:
    """One tool round trip: the call the assistant made and the result the harness sends back."""

    call_id: str  # unique within the conversation: ``<api prefix><call_id>`` names it on the wire
    tool: int  # index into the harness's tool list
    argument: str
    result: str


@dataclass(frozen=True, slots=True)
class Conversation:
    system: str
    task: str
    exchanges: tuple[ToolExchange, ...] = ()


@dataclass(slots=True)
class _State:
    tokens: Tokens
    conversation: Conversation


def spell(tokens: Tokens) -> str:
    """Tokens as words (``t<id>``), one emulator token each (as ``PromptBuilder.text``)."""
    return " ".join(f"t{t}" for t in tokens.tolist())


class ConversationBuilder:
    """Keeps each Program's conversation so far and extends it with every request."""

    def __init__(self, prompts: PromptBuilder, block_size: int, shared: frozenset[int]) -> None:
        self._prompts = prompts
        self._block_size = block_size
        self._shared = shared
        self._state: dict[str, _State] = {}
        self._programs: dict[str, set[str]] = {}

    def turn(self, item: RenderInput) -> Conversation:
        tokens = self._prompts.token_ids(item.task.task_id, item.request_id, item.request)
        pid = item.program.program_id
        prev = self._state.get(pid)
        if prev is not None and _extends(tokens, prev.tokens):
            exchange = ToolExchange(
                call_id=_call_id(pid, item.step),
                tool=item.step % 4,
                argument=f"step {item.step}",
                result=spell(tokens[len(prev.tokens) :]),
            )
            conv = Conversation(
                prev.conversation.system, prev.conversation.task, (*prev.conversation.exchanges, exchange)
            )
        else:
            conv = self._fresh(item, tokens)
        self._state[pid] = _State(tokens, conv)
        self._programs.setdefault(item.task.task_id, set()).add(pid)
        return conv

    def _fresh(self, item: RenderInput, tokens: Tokens) -> Conversation:
        lead = 0
        for block in item.request.hash_ids:
            if block not in self._shared:
                break
            lead += 1
        n_system = min(lead * self._block_size, len(tokens))
        if n_system >= len(tokens):  # the task needs at least one token of its own
            n_system = max(0, len(tokens) - 1)
        return Conversation(spell(tokens[:n_system]), spell(tokens[n_system:]))

    def forget(self, task_id: str) -> None:
        for pid in self._programs.pop(task_id, ()):
            self._state.pop(pid, None)


def _extends(tokens: Tokens, prev: Tokens) -> bool:
    return len(tokens) > len(prev) and bool(np.array_equal(tokens[: len(prev)], prev))


def _call_id(program_id: str, step: int) -> str:
    digest = hashlib.blake2b(program_id.encode(), digest_size=6).hexdigest()
    return f"{digest}{step:04d}"
