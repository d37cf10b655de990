"""What `progrouter serve` sets up before it listens: its logs (format, file) and, optionally, its traces."""

from __future__ import annotations

from pathlib import Path

from progrouter.config import RouterConfig
from progrouter.server.telemetry import tracing
from progrouter.server.telemetry.log_format import formatter
from progrouter.server.telemetry.logs import configure_logging


def setup_telemetry(config: RouterConfig) -> Path | None:
    """Logs in ``config.log_format`` (and to ``log_dir``); traces to ``otlp_traces_endpoint`` when set.

    Returns the log file's path (None without ``log_dir``); OSError when the log file cannot be written.
    """
    path = configure_logging(config.log_level, config.log_dir, formatter(config.log_format))
    tracing.configure(config.otlp_traces_endpoint)
    return path
