"""aiohttp's own log records, stripped of what a client sent before they reach a log above DEBUG.

aiohttp logs parser and handler failures with the exception attached, and its messages quote the bytes that
failed to parse: the start of an oversize header (an ``Authorization`` value, say), a request line, a body.
Above DEBUG such a record keeps its fixed text and the exception's type; its arguments, traceback and the
exception's message are dropped. At DEBUG (a developer's choice) records pass unchanged.
"""

from __future__ import annotations

import logging
import re

AIOHTTP_LOGGERS = ("aiohttp.access", "aiohttp.client", "aiohttp.internal", "aiohttp.server", "aiohttp.web")
_PLACEHOLDER = re.compile(r"%(\([^)]*\))?[-#0 +]*\d*(\.\d+)?[sdrifgexXo]")


class ClientBytesFilter(logging.Filter):
    """Rewrites aiohttp records above DEBUG to their fixed text plus the exception type."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno <= logging.DEBUG:
            return True
        template = str(record.msg).split("\n", 1)[0][:200]
        text = _PLACEHOLDER.sub("<…>", template) if record.args else template
        if record.exc_info and record.exc_info[0] is not None:
            text = f"{text} ({record.exc_info[0].__name__})"
        record.msg, record.args = text, ()
        record.exc_info, record.exc_text, record.stack_info = None, None, None
        return True


_FILTER = ClientBytesFilter()


def install_aiohttp_log_filter() -> None:
    """Attach the filter to aiohttp's loggers (once; the loggers are process-wide)."""
    for name in AIOHTTP_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
