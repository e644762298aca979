"""A whole answer's end is reported once the answer is handed to the server (off the
client's path), exactly once, however sending ends."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from fastapi.responses import Response

from gateway.http.proxy import ReportedAfterSend


async def _receive() -> dict[str, Any]:
    return {"type": "http.disconnect"}


def test_the_end_is_reported_after_the_answer_is_sent_as_rendered() -> None:
    events: list[Any] = []

    async def send(message: dict[str, Any]) -> None:
        events.append((message["type"], message.get("status"), message.get("body")))

    answer = Response(b'{"ok":1}', status_code=201, media_type="application/json")
    wrapped = ReportedAfterSend(answer, lambda: events.append("reported"))
    asyncio.run(wrapped({"type": "http"}, _receive, send))
    assert events == [
        ("http.response.start", 201, None),
        ("http.response.body", None, b'{"ok":1}'),
        "reported",
    ]
    assert wrapped.headers["content-type"] == "application/json"


def test_the_end_is_reported_when_sending_fails() -> None:
    reported: list[str] = []

    async def send(message: dict[str, Any]) -> None:
        raise OSError("the client's socket is gone")

    wrapped = ReportedAfterSend(Response(b"x"), lambda: reported.append("reported"))
    with pytest.raises(OSError):
        asyncio.run(wrapped({"type": "http"}, _receive, send))
    assert reported == ["reported"]
