"""The Responses API translation on its own: the chat body built from a Responses request,
and a chat stream's frames as the typed events (frames split across chunks, an error)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest

from gateway.config.guards import RequestLimits
from gateway.errors import OpenAIError
from gateway.http.responses_api import _events, to_chat

LIMITS = RequestLimits()


def test_chat_body() -> None:
    chat, call = to_chat(
        {
            "model": "m",
            "instructions": "Be Brom.",
            "input": [
                {"type": "message", "role": "developer", "content": "Short answers."},
                {"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            ],
            "max_output_tokens": 5,
            "prompt_cache_key": "p1",
            "metadata": {"a": "b"},
            "stream": True,
        },
        LIMITS,
    )
    assert chat == {
        "model": "m",
        "messages": [
            {"role": "system", "content": "Be Brom."},
            {"role": "system", "content": "Short answers."},
            {"role": "user", "content": "Hi"},
        ],
        "max_tokens": 5,
        "prompt_cache_key": "p1",
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    assert call.stream and call.id.startswith("resp_")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": "m"}, "input"),
        ({"model": "m", "input": "x", "tool_choice": "auto"}, "tool_choice"),
        ({"model": "m", "input": [{"type": "function_call_output"}]}, "input[0].type"),
        ({"model": "m", "input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
        ({"model": "m", "input": [{"role": {}, "content": "x"}]}, "input[0].role"),
        (
            {"model": "m", "input": [{"role": "user", "content": [{"type": [], "text": "x"}]}]},
            "input[0].content[0].type",
        ),
        ({"model": "m", "input": "x", "text": {"format": {"type": "grammar"}}}, "text.format.type"),
        ({"model": "m", "input": "x", "metadata": {"a": 1}}, "metadata"),
    ],
)
def test_refusals_name_the_field(body: dict[str, object], param: str) -> None:
    with pytest.raises(OpenAIError) as info:
        to_chat(dict(body), LIMITS)
    assert info.value.status == 400 and info.value.param == param


async def _chunks(frames: list[bytes]) -> AsyncIterator[bytes]:
    for frame in frames:
        yield frame


def _run(frames: list[bytes]) -> list[dict[str, object]]:
    _, call = to_chat({"model": "m", "input": "x", "stream": True}, LIMITS)

    async def collect() -> list[bytes]:
        return [e async for e in _events(call, _chunks(frames))]

    out = []
    for raw in asyncio.run(collect()):
        name, data = raw.decode().strip().split("\n")
        event = json.loads(data.removeprefix("data: "))
        assert name == f"event: {event['type']}"
        out.append(event)
    return out


def _chunk(content: str, finish: str | None = None) -> bytes:
    choice = {"index": 0, "delta": {"content": content}, "finish_reason": finish}
    return b"data: " + json.dumps({"model": "m", "choices": [choice]}).encode() + b"\n\n"


def test_stream_frames_split_across_chunks() -> None:
    usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
    stream = _chunk("Hel") + _chunk("lo", "stop")
    stream += b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n"
    stream += b"data: [DONE]\n\n"
    events = _run([stream[:10], stream[10:57], stream[57:]])
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["delta"] for e in events if e["type"] == "response.output_text.delta"] == [
        "Hel",
        "lo",
    ]
    done = events[-1]
    assert done["type"] == "response.completed"
    response = done["response"]
    assert isinstance(response, dict)
    assert response["usage"]["total_tokens"] == 5
    assert response["output"][0]["content"][0]["text"] == "Hello"


def test_stream_error_is_response_failed() -> None:
    error = {"error": {"message": "boom", "type": "server_error", "code": "upstream_error"}}
    events = _run([_chunk("Hi"), b"data: " + json.dumps(error).encode() + b"\n\n"])
    assert events[-1]["type"] == "response.failed"
    response = events[-1]["response"]
    assert isinstance(response, dict)
    assert response["status"] == "failed" and response["error"]["code"] == "upstream_error"
