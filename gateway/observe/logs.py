"""JSON-lines logging (`contracts.json_logs`, the format tierd and the simulated engine log
in too): one object per record with time, level, logger, message and the `request_id` of
the request being served (carried in a context variable set by the request-id middleware),
secrets redacted. uvicorn's loggers are routed through the same formatter."""

from __future__ import annotations

import logging.config
from contextvars import ContextVar
from typing import Any

from contracts.json_logs import JsonFormatter
from router.state.redact import redact

# A ContextVar is per-task by construction: each request sees only its own id.
REQUEST_ID: ContextVar[str | None] = ContextVar("warmgate_request_id", default=None)


def json_formatter() -> JsonFormatter:
    """The gateway's log lines: `contracts.json_logs`' format, secrets redacted, each line
    with the `request_id` of the request it is about."""
    return JsonFormatter(context={"request_id": REQUEST_ID}, scrub=redact)


def logging_config(level: str = "info") -> dict[str, Any]:
    """A dictConfig for our loggers and uvicorn's, all as JSON lines on stderr."""
    lvl = level.upper()
    handler = {"class": "logging.StreamHandler", "formatter": "json", "stream": "ext://sys.stderr"}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": json_formatter}},
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
