"""Where braid's log records go, and in which format (``--log-format``).

Two streams, as uvicorn (vLLM's server) has them: the access log (logger ``braid.access``, one
line per HTTP request: :mod:`braid.http.access_log`) on stdout, and every other record (braid's
loggers, hypercorn's error logger, anything else that propagates to the root logger) on stderr.
``text`` writes ``TIME LEVEL LOGGER: MESSAGE`` lines; ``json`` writes one JSON object per line with
``time`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger``, ``message``, ``exception`` (the
traceback, when the record has one) and ``stack`` (when asked for); an access record adds its
fields, and its message is the readable line the text format shows.

Our own formatter rather than python-json-logger or structlog: the object above takes a dozen
lines with msgspec (already the JSON encoder of the hot path, and faster than the json module
those use), and it must stay flat and fixed for log agents, which neither library's defaults are
without configuration of their own.

Nothing braid logs comes from a request's body: prompts and completions never reach a log line.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import IO, Any, Literal

import msgspec

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")

ACCESS_LOGGER = "braid.access"
"""The access log's logger; its records carry their fields as the ``access`` attribute."""

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_encode = msgspec.json.Encoder().encode


def utc_time(created: float) -> str:
    """``created`` (seconds since the epoch) as ``2025-01-31T12:00:00.123Z``."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(created)) + f".{int(created * 1000) % 1000:03d}Z"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (see the module's fields)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "time": utc_time(record.created),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        access = getattr(record, "access", None)
        if access is not None:
            doc.update(access)
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            doc["exception"] = record.exc_text
        if record.stack_info:
            doc["stack"] = self.formatStack(record.stack_info)
        return _encode(doc).decode()


def formatter(log_format: LogFormat) -> logging.Formatter:
    return JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)


def configure(
    log_format: LogFormat,
    *,
    level: int = logging.INFO,
    errors: IO[str] | None = None,
    access: IO[str] | None = None,
) -> None:
    """Send every record to ``errors`` (default stderr) and the access log's to ``access``
    (default stdout), each in ``log_format``. Replaces the root logger's handlers, so a second
    call (a test) does not write each record twice."""
    fmt = formatter(log_format)
    handler = logging.StreamHandler(errors if errors is not None else sys.stderr)
    handler.setFormatter(fmt)
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level)
    access_handler = logging.StreamHandler(access if access is not None else sys.stdout)
    access_handler.setFormatter(fmt)
    access_logger = logging.getLogger(ACCESS_LOGGER)
    access_logger.handlers = [access_handler]
    access_logger.propagate = False


__all__ = ["ACCESS_LOGGER", "LOG_FORMATS", "JsonFormatter", "LogFormat", "configure", "formatter", "utc_time"]
