"""Log setup of `progrouter serve`: stderr always, plus a rotating file when ``--log-dir`` is given."""

from __future__ import annotations

import logging
import sys
from logging.handlers import RotatingFileHandler
from pathlib import Path

from progrouter.server.edge.request_id import RequestIdFilter
from progrouter.server.telemetry.log_format import TEXT_FORMAT

LOG_FILE_NAME = "progrouter.log"
LOG_FILE_BYTES = 50 * 1024 * 1024
LOG_FILE_BACKUPS = 5


def configure_logging(
    level: str, log_dir: str | None, formatter: logging.Formatter | None = None
) -> Path | None:
    """Root logging at ``level`` to stderr and, with ``log_dir``, to ``log_dir/progrouter.log``, each line
    with its request id (``formatter``: text by default, see ``log_format.py``).

    The file rotates at 50 MiB and keeps 5 old files, so a long-running router never fills the disk.
    Returns the log file's path (None without ``log_dir``).
    """
    handlers: list[logging.Handler] = [logging.StreamHandler(sys.stderr)]
    path = None
    if log_dir is not None:
        Path(log_dir).mkdir(parents=True, exist_ok=True)
        path = Path(log_dir) / LOG_FILE_NAME
        handlers.append(
            RotatingFileHandler(path, maxBytes=LOG_FILE_BYTES, backupCount=LOG_FILE_BACKUPS, encoding="utf-8")
        )
    for handler in handlers:
        handler.addFilter(RequestIdFilter())
        handler.setFormatter(formatter or logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=handlers, force=True)
    return path
