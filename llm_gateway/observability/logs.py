"""Logging: JSON lines on stderr, and one access-log line per request when it ends.

The access line carries request id, key *name*, model, backend, engine, status, outcome, tokens,
TTFT and duration: never a prompt, a key, or a header value. Every log record goes through one
JSON formatter, so a log shipper needs no parsing rules.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import orjson

ACCESS = "gateway.access"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        else:
            out["msg"] = record.getMessage()
        if record.exc_info and record.exc_info[0] is not None:
            out["exc_type"] = record.exc_info[0].__name__
            out["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(out, default=str).decode()


def setup_logging(level: str) -> None:
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root.addHandler(handler)
    root.setLevel(level.upper())
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        lg = logging.getLogger(name)
        lg.handlers.clear()
        lg.propagate = True
        # the root's level, set on each: uvicorn asks `logger.level <= TRACE` (the logger's own level, 0 while
        # unset, not its effective one) on every connection made and lost, and with 0 formats a prefix and
        # calls `log` for a line no handler takes
        lg.setLevel(root.level)
    logging.getLogger("uvicorn.access").disabled = True  # our own access line replaces it


class AccessLog:
    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self._log = logging.getLogger(ACCESS)

    def emit(self, fields: dict[str, Any]) -> None:
        if self.enabled and self._log.isEnabledFor(logging.INFO):
            fields["ts_end"] = round(time.time(), 3)
            self._log.info("request", extra={"fields": fields})
