"""Secrets out of text meant for people: the password of a URL (`redis://user:pw@host`) and
`password=...` pairs, as found in connection errors, `/readyz` detail and log lines."""

from __future__ import annotations

import re

_URL_PASSWORD = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^:/@\s]*):[^@\s/]+@")
_PAIR = re.compile(r"(?i)\b(password|passwd|pwd|secret|token)(['\"]?\s*[:=]\s*['\"]?)[^'\",\s})]+")


def redact(text: str) -> str:
    if "@" in text:
        text = _URL_PASSWORD.sub(r"\1:***@", text)
    return _PAIR.sub(r"\1\2***", text)
