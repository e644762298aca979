"""JSON-lines logging: one object per record with time, level, logger, message and the
`request_id` of the request being served (carried in a context variable set by the
request-id middleware). uvicorn's loggers are routed through the same formatter."""

from __future__ import annotations

import json
import logging
import logging.config
import time
from contextvars import ContextVar
from typing import Any

from router.state.redact import redact

# A ContextVar is per-task by construction: each request sees only its own id.
REQUEST_ID: ContextVar[str | None] = ContextVar("warmgate_request_id", default=None)

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "color_message"}
MAX_FIELD_CHARS = 512  # a client-chosen string (a session key) is cut to this in a log line
MAX_MESSAGE_CHARS = 8192


def clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...({len(text)} chars)"


class JsonFormatter(logging.Formatter):
    """Formats a record as a JSON line; extra fields given with `extra=` are kept."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": redact(clip(record.getMessage(), MAX_MESSAGE_CHARS)),
        }
        request_id = getattr(record, "request_id", None) or REQUEST_ID.get()
        if request_id:
            out["request_id"] = request_id
        for key, value in vars(record).items():
            if key not in _STANDARD and key != "request_id" and not key.startswith("_"):
                out[key] = redact(clip(value, MAX_FIELD_CHARS)) if isinstance(value, str) else value
        if record.exc_info:
            out["exc"] = redact(self.formatException(record.exc_info))
        return json.dumps(out, default=str)


def logging_config(level: str = "info") -> dict[str, Any]:
    """A dictConfig for our loggers and uvicorn's, all as JSON lines on stderr."""
    lvl = level.upper()
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": JsonFormatter}},
        "handlers": {"json": handler},
        "loggers": {
            "warmgate": {"handlers": ["json"], "level": lvl, "propagate": False},
            "uvicorn": {"handlers": ["json"], "level": lvl, "propagate": False},
            "uvicorn.error": {"handlers": ["json"], "level": lvl, "propagate": False},
            "uvicorn.access": {"handlers": ["json"], "level": lvl, "propagate": False},
        },
    }


def configure_logging(level: str = "info") -> None:
    logging.config.dictConfig(logging_config(level))
