"""A Program's demand in tokens: what admission reserves for it and the ledger charges while it is Active."""

from __future__ import annotations

from typing import TYPE_CHECKING

from progrouter.program.formulas.growth import private_tokens

if TYPE_CHECKING:
    from progrouter.program.core.state import Program
    from progrouter.program.types import RequestHints


def program_private_tokens(
    program: Program, decode_buffer_tokens: int, expected_output_tokens: int | None = None
) -> int:
    """A Program's private demand: max(0, context − shared prefix) + (expected output, else decode buffer)."""
    return private_tokens(
        program.estimated_context_tokens,
        program.lifecycle.shared_prefix.tokens,
        expected_output_tokens=expected_output_tokens,
        output_token_reservation=program.lifecycle.output_token_reservation,
        decode_buffer_tokens=decode_buffer_tokens,
    )


def required_tokens(program: Program, front: RequestHints | None, decode_buffer_tokens: int) -> int:
    """A waiting Program's demand: its private tokens with its front request's expected output, if given
    (``front``: the hints of its front request)."""
    expected = front.expected_output_tokens if front is not None else None
    return program_private_tokens(program, decode_buffer_tokens, expected)
