"""Constrained least-squares fits of the two cost models (pure: numbers in, coefficients out).

Prefill: ``seconds = intercept + linear·x + quadratic·x²`` with x = uncached tokens / 1000, all three ≥ 0.
Decode:  ``step_seconds = fixed + batch·B + context·C`` with fixed > 0 and the other two ≥ 0
(B = requests in the decode batch, C = the sum of their full contexts), the constraints the config enforces.

Both fits minimise *relative* residuals by default (each row weighted by 1/y): measured times span two orders
of magnitude, and an unweighted fit would let the longest prompts decide the intercept alone. R² and the
residuals reported are on the original (seconds) scale.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray
from scipy.optimize import lsq_linear

PREFILL_TERMS = ("intercept", "linear", "quadratic")
DECODE_TERMS = ("fixed", "batch", "context")
# The smallest fixed step we accept: the config requires fixed_step_seconds > 0.
MIN_FIXED_STEP_SECONDS = 1e-6


class FitError(ValueError):
    """The samples cannot determine the model (too few, or not varied enough)."""


@dataclass(frozen=True)
class FitResult:
    """Coefficients (in ``terms`` order) and how well they explain the samples."""

    terms: tuple[str, ...]
    coefficients: tuple[float, ...]
    r_squared: float
    rmse_seconds: float
    max_abs_residual_seconds: float
    mean_abs_relative_residual: float
    residuals_seconds: tuple[float, ...]
    samples: int

    def coefficient(self, term: str) -> float:
        return self.coefficients[self.terms.index(term)]

    def to_json(self) -> dict[str, Any]:
        return {
            "terms": list(self.terms),
            "coefficients": dict(zip(self.terms, self.coefficients, strict=True)),
            "r_squared": self.r_squared,
            "rmse_seconds": self.rmse_seconds,
            "max_abs_residual_seconds": self.max_abs_residual_seconds,
            "mean_abs_relative_residual": self.mean_abs_relative_residual,
            "residuals_seconds": list(self.residuals_seconds),
            "samples": self.samples,
        }


def prefill_design(uncached_tokens: Sequence[float]) -> NDArray[np.float64]:
    x = np.asarray(uncached_tokens, dtype=np.float64) / 1000.0
    return np.column_stack([np.ones_like(x), x, x * x])


def decode_design(batch_sizes: Sequence[float], context_tokens: Sequence[float]) -> NDArray[np.float64]:
    b = np.asarray(batch_sizes, dtype=np.float64)
    c = np.asarray(context_tokens, dtype=np.float64)
    return np.column_stack([np.ones_like(b), b, c])


def fit_prefill(
    uncached_tokens: Sequence[float], seconds: Sequence[float], *, relative: bool = True
) -> FitResult:
    """Fit the cold-prefill model; needs at least three distinct prompt lengths."""
    if len(set(uncached_tokens)) < 3:
        raise FitError("prefill fit needs samples at three or more distinct uncached-token counts")
    return _fit(PREFILL_TERMS, prefill_design(uncached_tokens), seconds, (0.0, 0.0, 0.0), relative)


def fit_decode(
    batch_sizes: Sequence[float],
    context_tokens: Sequence[float],
    step_seconds: Sequence[float],
    *,
    relative: bool = True,
) -> FitResult:
    """Fit the decode step model; needs distinct batch sizes and contexts not proportional to them."""
    design = decode_design(batch_sizes, context_tokens)
    if len(set(batch_sizes)) < 2:
        raise FitError("decode fit needs samples at two or more distinct batch sizes")
    if np.linalg.matrix_rank(design) < 3:
        raise FitError("decode fit needs contexts that vary independently of the batch size")
    return _fit(DECODE_TERMS, design, step_seconds, (MIN_FIXED_STEP_SECONDS, 0.0, 0.0), relative)


def _fit(
    terms: tuple[str, ...],
    design: NDArray[np.float64],
    seconds: Sequence[float],
    lower: tuple[float, ...],
    relative: bool,
) -> FitResult:
    y = np.asarray(seconds, dtype=np.float64)
    if y.shape[0] != design.shape[0]:
        raise FitError("sample arrays differ in length")
    if y.shape[0] < len(terms):
        raise FitError(f"need at least {len(terms)} samples, got {y.shape[0]}")
    if not np.all(np.isfinite(y)) or np.any(y <= 0):
        raise FitError("measured times must be finite and > 0")
    weights = 1.0 / y if relative else np.ones_like(y)
    a = design * weights[:, None]
    b = y * weights
    # Scale columns to unit norm so that a per-token coefficient (~1e-7) and a fixed one (~1e-2) are solved
    # with the same precision; bounds are divided by the same scale.
    scale = np.linalg.norm(a, axis=0)
    scale[scale == 0] = 1.0
    lower_scaled = np.asarray(lower, dtype=np.float64) * scale
    result = lsq_linear(a / scale, b, bounds=(lower_scaled, np.full(len(terms), np.inf)), method="bvls")
    coef = np.maximum(result.x / scale, np.asarray(lower, dtype=np.float64))
    predicted = design @ coef
    residuals = y - predicted
    ss_res = float(np.sum(residuals**2))
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    r_squared = 1.0 - ss_res / ss_tot if ss_tot > 0 else (1.0 if ss_res == 0 else 0.0)
    return FitResult(
        terms=terms,
        coefficients=tuple(float(c) for c in coef),
        r_squared=r_squared,
        rmse_seconds=float(np.sqrt(ss_res / len(y))),
        max_abs_residual_seconds=float(np.max(np.abs(residuals))),
        mean_abs_relative_residual=float(np.mean(np.abs(residuals) / y)),
        residuals_seconds=tuple(float(r) for r in residuals),
        samples=len(y),
    )
