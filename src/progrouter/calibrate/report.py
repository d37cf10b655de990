"""calibration.json: the AgentInfer coefficient names, fit quality and raw samples; and the router fragment.

The six coefficient keys are the ones ``spec/program_scheduling.md`` ("Offline calibration models") maps onto
``prefill_cost_model`` / ``decode_throughput_model``. ``decode_throughput_alpha`` is not measured here (it is
the decode throughput retained while a prefill is mixed into the batch; the cold-prefill and warm-decode
artifact cannot derive it), so the router fragment carries six fields and alpha stays configured separately.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from progrouter import __version__
from progrouter.calibrate.fit import FitResult, fit_decode, fit_prefill
from progrouter.calibrate.measure import Measurement, PrefillSample
from progrouter.config import ConfigError, ProgramSchedulingConfig, parse_config
from progrouter.engine.profiles import CALIBRATION_KEYS

FORMAT = "progrouter-calibration/1"

# AgentInfer calibration.json key -> (router group, router field): one table, kept with the engine profiles.
KEY_MAP = CALIBRATION_KEYS
ALPHA_NOTE = (
    "prefill_cost_model.decode_throughput_alpha is not measured by calibrate: it is the share of decode "
    "throughput kept while a prefill is mixed into the batch, and stays configured separately "
    "(default 0.15). "
    "Set it explicitly to silence the program_scheduling_reference_calibration warning."
)


def fastest_prefill(samples: Sequence[PrefillSample]) -> list[PrefillSample]:
    """The fastest repeat of each requested length, in first-seen order.

    Everything that disturbs a time-to-first-token on a busy host (a late wake-up of the server or the
    client, another tenant's burst) only ever adds to it, so the fastest repeat is the closest to what the
    engine charged; a mean would fold the host's load into the per-token coefficients.
    """
    best: dict[int, PrefillSample] = {}
    for s in samples:
        kept = best.get(s.requested_tokens)
        if kept is None or s.seconds < kept.seconds:
            best[s.requested_tokens] = s
    return list(best.values())


def fit_measurement(m: Measurement) -> tuple[FitResult, FitResult]:
    fastest = fastest_prefill(m.prefill)
    prefill = fit_prefill([s.uncached_tokens for s in fastest], [s.seconds for s in fastest])
    decode = fit_decode(
        [s.batch_size for s in m.decode],
        [s.context_tokens for s in m.decode],
        [s.step_seconds for s in m.decode],
    )
    return prefill, decode


def build_calibration(m: Measurement, prefill: FitResult, decode: FitResult) -> dict[str, Any]:
    """The calibration.json document."""
    coefficients = {
        "ttl_prefill_model_intercept_seconds": prefill.coefficient("intercept"),
        "ttl_prefill_model_linear_seconds_per_1k_tokens": prefill.coefficient("linear"),
        "ttl_prefill_model_quadratic_seconds_per_1k_tokens_squared": prefill.coefficient("quadratic"),
        "decode_step_fixed_seconds": decode.coefficient("fixed"),
        "decode_step_seconds_per_request": decode.coefficient("batch"),
        "decode_step_seconds_per_context_token": decode.coefficient("context"),
    }
    return {
        "format": FORMAT,
        **coefficients,
        "fit_quality": {
            "prefill": prefill.to_json() | {"x": "uncached prompt tokens / 1000", "y": "time to first token"},
            "decode": decode.to_json() | {"x": "B, C = Σ full contexts", "y": "decode step seconds"},
        },
        "backend": {
            "url": m.url,
            "model": m.model,
            "prompt_mode": m.prompt_mode,
            "max_model_len": m.max_model_len,
            "kv_capacity_tokens": m.kv_capacity_tokens,
        },
        "measured_at": _dt.datetime.fromtimestamp(m.started_at, _dt.UTC).isoformat(timespec="seconds"),
        "measurement_wall_seconds": m.wall_seconds,
        "tool": f"progrouter {__version__} calibrate",
        "alpha_note": ALPHA_NOTE,
        "warnings": list(dict.fromkeys(m.warnings)),
        "samples": m.to_json(),
    }


def router_fragment(calibration: dict[str, Any]) -> dict[str, Any]:
    """``{"prefill_cost_model": {3 fields}, "decode_throughput_model": {3 fields}}``, config-validated."""
    fragment: dict[str, dict[str, float]] = {"prefill_cost_model": {}, "decode_throughput_model": {}}
    for key, (group, name) in KEY_MAP.items():
        if key not in calibration:
            raise ConfigError(f"calibration file lacks {key!r}")
        fragment[group][name] = float(calibration[key])
    parse_config(ProgramSchedulingConfig, dict(fragment), prefix="calibrated program_scheduling fragment")
    return dict(fragment)


def write_json(path: Path, doc: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)


def load_calibration(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read calibration file {path}: {exc}") from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"{path} is not a JSON object")
    return doc
