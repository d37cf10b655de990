"""A PNG of measured samples against the fitted models (matplotlib, Agg: no display needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def write_plot(path: Path, calibration: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    samples = calibration["samples"]
    quality = calibration["fit_quality"]
    fig, (ax_p, ax_d) = plt.subplots(1, 2, figsize=(12, 4.8))

    tokens = np.array([s["uncached_tokens"] for s in samples["prefill"]], dtype=float)
    seconds = np.array([s["seconds"] for s in samples["prefill"]], dtype=float)
    a = calibration["ttl_prefill_model_intercept_seconds"]
    b = calibration["ttl_prefill_model_linear_seconds_per_1k_tokens"]
    c = calibration["ttl_prefill_model_quadratic_seconds_per_1k_tokens_squared"]
    xs = np.linspace(0.0, max(float(tokens.max()), 1.0) * 1.05, 200)
    k = xs / 1000.0
    ax_p.scatter(tokens, seconds * 1000, s=14, label="measured (TTFT)")
    ax_p.plot(xs, (a + b * k + c * k * k) * 1000, color="C1", label="fit")
    ax_p.set_xlabel("uncached prompt tokens")
    ax_p.set_ylabel("cold prefill (ms)")
    ax_p.set_title(f"Prefill: {a * 1e3:.1f} ms + {b * 1e3:.1f} ms·x + {c * 1e3:.2f} ms·x²  (x = k tokens)")
    ax_p.text(
        0.02,
        0.95,
        f"R² = {quality['prefill']['r_squared']:.4f}, n = {len(tokens)}",
        transform=ax_p.transAxes,
        va="top",
    )
    ax_p.legend(loc="lower right")

    fixed = calibration["decode_step_fixed_seconds"]
    per_req = calibration["decode_step_seconds_per_request"]
    per_tok = calibration["decode_step_seconds_per_context_token"]
    decode = samples["decode"]
    batches = sorted({int(s["batch_size"]) for s in decode})
    c_max = max((float(s["context_tokens"]) for s in decode), default=1.0) * 1.05
    for i, batch in enumerate(batches):
        pts = [s for s in decode if int(s["batch_size"]) == batch]
        cs = np.array([s["context_tokens"] for s in pts], dtype=float)
        ys = np.array([s["step_seconds"] for s in pts], dtype=float)
        color = f"C{i % 10}"
        ax_d.scatter(cs, ys * 1000, s=18, color=color, label=f"B={batch}")
        line = np.linspace(0.0, c_max, 50)
        ax_d.plot(line, (fixed + per_req * batch + per_tok * line) * 1000, color=color, lw=1)
    ax_d.set_xlabel("C = Σ full contexts in the batch (tokens)")
    ax_d.set_ylabel("decode step (ms)")
    ax_d.set_title(f"Decode: {fixed * 1e3:.2f} ms + {per_req * 1e3:.3f} ms·B + {per_tok * 1e9:.2f} ns·C")
    ax_d.text(
        0.02,
        0.95,
        f"R² = {quality['decode']['r_squared']:.4f}, n = {len(decode)}",
        transform=ax_d.transAxes,
        va="top",
    )
    ax_d.legend(loc="lower right", fontsize="small")
    model = calibration.get("backend", {}).get("model", "?")
    fig.suptitle(f"progrouter calibrate — {model}")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
