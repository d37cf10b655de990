"""fit.py on synthetic data: exact recovery, constraints, fit quality, and refusing underdetermined data."""

from __future__ import annotations

import numpy as np
import pytest

from progrouter.calibrate.fit import MIN_FIXED_STEP_SECONDS, FitError, fit_decode, fit_prefill
from progrouter.calibrate.measure import PrefillSample
from progrouter.calibrate.report import fastest_prefill

PREFILL = (0.066, 0.057, 0.0044)
DECODE = (0.0106, 0.00042, 1.42e-7)


def prefill_truth(tokens: np.ndarray, coef: tuple[float, float, float] = PREFILL) -> np.ndarray:
    x = tokens / 1000.0
    return coef[0] + coef[1] * x + coef[2] * x * x


def decode_grid() -> tuple[np.ndarray, np.ndarray]:
    b = np.array([1, 2, 4, 8] * 3, dtype=float)
    per_request = np.repeat([512.0, 2048.0, 8192.0], 4)
    return b, b * per_request


def test_prefill_exact_data_recovers_coefficients() -> None:
    tokens = np.array([256, 512, 1024, 2048, 4096, 8192] * 2, dtype=float)
    fit = fit_prefill(tokens.tolist(), prefill_truth(tokens).tolist())
    assert fit.coefficients == pytest.approx(PREFILL, rel=1e-6)
    assert fit.r_squared == pytest.approx(1.0, abs=1e-9)
    assert fit.samples == 12
    assert max(abs(r) for r in fit.residuals_seconds) < 1e-9


def test_prefill_noisy_data_within_tolerance() -> None:
    rng = np.random.default_rng(7)
    tokens = np.repeat([256, 512, 1024, 2048, 4096, 8192], 5).astype(float)
    y = prefill_truth(tokens) * (1 + rng.normal(0, 0.01, tokens.size))
    fit = fit_prefill(tokens.tolist(), y.tolist())
    assert fit.coefficients == pytest.approx(PREFILL, rel=0.05)
    assert 0.99 < fit.r_squared < 1.0


def test_prefill_coefficients_never_negative() -> None:
    # A concave curve: the unconstrained quadratic term would be negative.
    tokens = np.array([500, 1000, 2000, 4000, 8000], dtype=float)
    y = 0.02 + 0.1 * (tokens / 1000) - 0.004 * (tokens / 1000) ** 2
    fit = fit_prefill(tokens.tolist(), y.tolist())
    assert all(c >= 0 for c in fit.coefficients)
    assert fit.coefficient("quadratic") == 0.0
    unconstrained = np.polyfit(tokens / 1000, y, 2)
    assert unconstrained[0] < 0  # the constraint did bind
    assert fit.r_squared < 1.0


def test_prefill_needs_three_lengths() -> None:
    with pytest.raises(FitError, match="three or more distinct"):
        fit_prefill([1000, 1000, 2000, 2000], [0.1, 0.1, 0.2, 0.2])


def test_prefill_rejects_non_positive_times() -> None:
    with pytest.raises(FitError, match="> 0"):
        fit_prefill([100, 200, 300], [0.1, 0.0, 0.3])


def test_decode_exact_data_recovers_coefficients() -> None:
    b, c = decode_grid()
    y = DECODE[0] + DECODE[1] * b + DECODE[2] * c
    fit = fit_decode(b.tolist(), c.tolist(), y.tolist())
    assert fit.coefficients == pytest.approx(DECODE, rel=1e-6)
    assert fit.r_squared == pytest.approx(1.0, abs=1e-9)


def test_decode_noisy_data_within_tolerance() -> None:
    rng = np.random.default_rng(3)
    b, c = decode_grid()
    b, c = np.tile(b, 3), np.tile(c, 3)
    y = (DECODE[0] + DECODE[1] * b + DECODE[2] * c) * (1 + rng.normal(0, 0.003, b.size))
    fit = fit_decode(b.tolist(), c.tolist(), y.tolist())
    assert fit.coefficients == pytest.approx(DECODE, rel=0.05)


def test_decode_fixed_step_stays_positive() -> None:
    # Data that a line through the origin explains best: the fit must still keep fixed > 0.
    b, c = decode_grid()
    y = 0.002 * b + 1e-7 * c
    fit = fit_decode(b.tolist(), c.tolist(), y.tolist())
    assert fit.coefficient("fixed") >= MIN_FIXED_STEP_SECONDS
    assert fit.coefficient("batch") >= 0 and fit.coefficient("context") >= 0


def test_decode_needs_context_independent_of_batch() -> None:
    b = [1.0, 2.0, 4.0, 8.0]
    with pytest.raises(FitError, match="vary independently"):
        fit_decode(b, [1000 * x for x in b], [0.01, 0.011, 0.013, 0.017])
    with pytest.raises(FitError, match="two or more distinct batch"):
        fit_decode([4.0, 4.0, 4.0], [1000.0, 2000.0, 3000.0], [0.01, 0.02, 0.03])


def test_to_json_names_every_term() -> None:
    tokens = np.array([1000, 2000, 4000], dtype=float)
    doc = fit_prefill(tokens.tolist(), prefill_truth(tokens).tolist()).to_json()
    assert set(doc["coefficients"]) == {"intercept", "linear", "quadratic"}
    assert doc["samples"] == 3 and len(doc["residuals_seconds"]) == 3


def test_the_fastest_repeat_of_each_length_is_fitted() -> None:
    # A busy host only ever adds to a time to first token: of each length's repeats, one ran undisturbed and
    # the others were late by up to 8 %. The fastest repeats recover the truth; a fit over all would not.
    rng = np.random.default_rng(3)
    samples = []
    for n in [256, 1024, 2048, 4096, 8192]:
        true = float(prefill_truth(np.array([n], dtype=float))[0])
        late = [true * (1 + d) for d in rng.uniform(0.02, 0.08, 2)]
        samples += [PrefillSample(n, n, 0, s, s) for s in [*late[:1], true, *late[1:]]]
    fastest = fastest_prefill(samples)
    assert [s.requested_tokens for s in fastest] == [256, 1024, 2048, 4096, 8192]
    fit = fit_prefill([s.uncached_tokens for s in fastest], [s.seconds for s in fastest])
    assert fit.coefficients == pytest.approx(PREFILL, rel=1e-6) and fit.samples == 5
    everything = fit_prefill([s.uncached_tokens for s in samples], [s.seconds for s in samples])
    assert everything.coefficients != pytest.approx(PREFILL, rel=0.01)
