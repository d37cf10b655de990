"""Prompt-token accounting of one finished request, as vLLM's usage blocks report it.

vLLM splits a prompt's tokens three ways: ``cached`` (read from the prefix cache), ``created`` (computed and
written to the prefix cache: the prompt's whole blocks that were not already cached) and the rest (computed,
not cached: the partial last block). The chat API reports the total and the cached share; the Messages API
subtracts both cache shares from ``input_tokens``; the Responses API reports the total with both shares as
details. Each dialect shapes this one record.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TokenUsage:
    prompt: int
    cached: int
    created: int
    output: int

    @classmethod
    def of(cls, n_prompt: int, n_cached: int, n_output: int, block_size: int) -> TokenUsage:
        """vLLM's ``created``: the prompt's whole blocks held after prefill, less the ones that were hits."""
        return cls(n_prompt, n_cached, max(0, n_prompt // block_size * block_size - n_cached), n_output)

    @property
    def uncached(self) -> int:
        return max(0, self.prompt - self.cached - self.created)
