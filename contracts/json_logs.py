"""The JSON-lines log format of every warmgate process (the gateway, tierd, the simulated
engine): one object per record,

    {"ts": "2026-01-02T03:04:05.678Z", "level": "info", "logger": "...", "msg": "...", ...}

`ts` in UTC with milliseconds, `level` in lower case, then the formatter's static fields
(the simulated engine's `instance`), the fields of its context variables (the gateway's
`request_id`) unless the record carries its own, every `extra=` field of the record, and
`exc` when there is an exception. Strings are cut (`clip`) and passed through `scrub` (the
gateway's secret redaction) when one is given.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from typing import Any

MAX_FIELD_CHARS = 512  # a client-chosen string (a session key) is cut to this in a log line
MAX_MESSAGE_CHARS = 8192

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "color_message"}


def clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...({len(text)} chars)"


def _same(text: str) -> str:
    return text


class JsonFormatter(logging.Formatter):
    """Formats a record as one JSON line (see the module's docstring)."""

    def __init__(
        self,
        *,
        static: Mapping[str, Any] | None = None,
        context: Mapping[str, ContextVar[str | None]] | None = None,
        scrub: Callable[[str], str] | None = None,
    ) -> None:
        super().__init__()
        self.static = dict(static or {})
        self.context = dict(context or {})
        self.scrub = scrub or _same

    def format(self, record: logging.LogRecord) -> str:
        scrub = self.scrub
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": scrub(clip(record.getMessage(), MAX_MESSAGE_CHARS)),
            **self.static,
        }
        for key, var in self.context.items():
            value = getattr(record, key, None) or var.get()
            if value:
                out[key] = value
        for key, value in vars(record).items():
            if key in _STANDARD or key in self.context or key.startswith("_"):
                continue
            out[key] = scrub(clip(value, MAX_FIELD_CHARS)) if isinstance(value, str) else value
        if record.exc_info:
            out["exc"] = scrub(self.formatException(record.exc_info))
        return json.dumps(out, default=str)
