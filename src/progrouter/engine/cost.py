"""Step time: how many modelled seconds one engine step takes, from the router's own cost coefficients.

A step decodes B requests whose contexts sum to C tokens and computes prefill chunks. It costs

    step = [B > 0] * (fixed + batch*B + context*C)  +  sum over prefill chunks of chunk_seconds

Prefill is the cold-prefill formula ``P(u) = intercept + linear*x + quadratic*x**2`` (x = u/1000) over the
*uncached* tokens of a request, split exactly across its chunks. A request admitted with ``k`` tokens from the
prefix cache whose chunk computes tokens ``[s, e)`` pays, with offsets ``s' = s-k`` and ``e' = e-k``:

    chunk_seconds = Q(e') - Q(s')  (+ intercept when s' == 0),   Q(y) = linear*y/1000 + quadratic*(y/1000)**2

so the chunks of one prefill telescope to ``P(n - k)`` however the token budget splits them: a lone cold
prefill of n tokens costs exactly ``prefill_seconds(n)``, which is also its time to first token (the first
token is sampled in the step that finishes the prefill). The request finishing its prefill is not in B; it
joins the decode batch from the next step on. The decode terms are charged only when some request decodes,
so a prefill alone is not charged a decode step twice. Decode context C counts every token a decoding request
attends to (its prompt, its output so far and the token being computed).
"""

from __future__ import annotations

from progrouter.config import DecodeThroughputModel, PrefillCostModel


class StepCostModel:
    """Pre-extracted coefficients (attribute access on pydantic models is slow on the hot path)."""

    __slots__ = ("_batch", "_context", "_fixed", "_intercept", "_linear", "_quadratic")

    def __init__(self, prefill: PrefillCostModel, decode: DecodeThroughputModel) -> None:
        self._intercept = prefill.intercept_seconds
        self._linear = prefill.linear_seconds_per_1k_tokens / 1000.0
        self._quadratic = prefill.quadratic_seconds_per_1k_tokens_squared / 1e6
        self._fixed = decode.fixed_step_seconds
        self._batch = decode.batch_step_seconds_per_request
        self._context = decode.context_step_seconds_per_token

    def decode_seconds(self, batch_size: int, context_tokens: int) -> float:
        if batch_size <= 0:
            return 0.0
        return self._fixed + self._batch * batch_size + self._context * context_tokens

    def prefill_chunk_seconds(self, start_offset: int, end_offset: int) -> float:
        """Cost of computing uncached tokens ``[start_offset, end_offset)`` of one request's prefill."""
        lin, quad = self._linear, self._quadratic
        s, e = start_offset, end_offset
        cost = lin * (e - s) + quad * (e * e - s * s)
        if s == 0 and e > 0:
            cost += self._intercept
        return cost

    def prefill_seconds(self, uncached_tokens: int) -> float:
        """The whole cold prefill; equals ``PrefillCostModel.prefill_seconds``."""
        return self.prefill_chunk_seconds(0, uncached_tokens)
