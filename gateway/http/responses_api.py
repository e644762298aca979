"""`POST /v1/responses` (OpenAI's Responses API) translated to a chat completion.

The engines have no Responses API of their own: the request becomes a chat body
(`instructions` a system message, `input` the messages, `max_output_tokens` `max_tokens`,
`temperature`, `top_p`, `user`, `prompt_cache_key` as they are, `text.format` JSON schema as
`response_format`) that goes through the chat path unchanged (parse, limits, routing,
failover, accounting), and the chat answer is translated back: one Response object, or the
Responses API's typed stream events (`response.created` … `response.completed`), each with its
`sequence_number`. A field the gateway cannot serve (tools, images…) is a 400 naming it in
`param`.

`previous_response_id`: a completed response is stored (unless `store` is false) with the whole
conversation it ends (gateway/pipeline/response_store.py), and a request naming it continues
that conversation: the chat body is the chain's messages plus the new input, so routing sees
the whole prefix while the client sends only the new line. Unlike OpenAI's API, a continuation
without `instructions` keeps the chain's (a game NPC's persona is the prefix its cache holds),
and without `prompt_cache_key` or `user` it keeps the chain's session key. An unknown or expired
id is the API's 400 `previous_response_not_found` naming `previous_response_id`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterable
from typing import Any

from fastapi.responses import Response, StreamingResponse

from gateway.http.responses_request import ResponsesCall, prepare, to_chat
from gateway.json_codec import decode
from gateway.pipeline.response_store import Conversation, save

__all__ = ["ResponsesCall", "answer", "prepare", "response_object", "to_chat"]

_DROP_HEADERS = {"content-length", "content-type"}


def _usage(usage: Any) -> dict[str, Any] | None:
    if not isinstance(usage, dict):
        return None
    prompt = int(usage.get("prompt_tokens") or 0)
    completion = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": int(cached or 0)},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": int(usage.get("total_tokens") or prompt + completion),
    }


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def _item(call: ResponsesCall, text: str | None, status: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": call.item_id,
        "status": status,
        "role": "assistant",
        "content": [] if text is None else [_part(text)],
    }


def response_object(
    call: ResponsesCall,
    *,
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None,
    finish_reason: Any = None,
    model: str | None = None,
) -> dict[str, Any]:
    body = call.body
    incomplete = status == "completed" and finish_reason == "length"
    text_format = body.get("text", {}).get("format") if isinstance(body.get("text"), dict) else None
    return {
        "id": call.id,
        "object": "response",
        "created_at": call.created_at,
        "status": "incomplete" if incomplete else status,
        "error": None,
        "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "model": model or call.model,
        "output": output,
        "parallel_tool_calls": False,
        "previous_response_id": body.get("previous_response_id"),
        "store": body.get("store") is not False,
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "text": {"format": text_format or {"type": "text"}},
        "tool_choice": "none",
        "tools": [],
        "truncation": "disabled",
        "usage": usage,
        "user": body.get("user"),
        "prompt_cache_key": body.get("prompt_cache_key"),
        "metadata": body.get("metadata") or {},
    }


def _headers(response: Response) -> dict[str, str]:
    return {k: v for k, v in response.headers.items() if k.lower() not in _DROP_HEADERS}


async def _store(call: ResponsesCall, obj: dict[str, Any], text: str) -> None:
    """Keep a finished response's conversation for a later `previous_response_id`."""
    if call.store is None or obj["status"] not in ("completed", "incomplete"):
        return
    before = call.conversation
    after = [*before.messages, {"role": "assistant", "content": text}]
    await save(call.store, call.id, Conversation(before.instructions, after, before.session))


async def answer(call: ResponsesCall, response: Response) -> Response:
    """The chat path's answer, as the Responses API answers: errors pass through."""
    if response.status_code >= 400:
        return response
    if isinstance(response, StreamingResponse):
        if call.stream:
            response.body_iterator = _events(call, response.body_iterator)
        return response
    chat, _ = decode(bytes(response.body))
    choice = (chat.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    text = message.get("content") or ""
    obj = response_object(
        call,
        status="completed",
        output=[_item(call, text, "completed")],
        usage=_usage(chat.get("usage")),
        finish_reason=choice.get("finish_reason"),
        model=chat.get("model"),
    )
    await _store(call, obj, text)
    return Response(
        json.dumps(obj).encode(),
        status_code=response.status_code,
        media_type="application/json",
        headers=_headers(response),
    )


class _Events:
    def __init__(self) -> None:
        self.sequence = 0

    def frame(self, kind: str, **fields: Any) -> bytes:
        event = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return f"event: {kind}\ndata: {json.dumps(event)}\n\n".encode()


async def _events(
    call: ResponsesCall, chunks: AsyncIterable[str | bytes | memoryview[int]]
) -> AsyncGenerator[bytes, None]:
    """The chat stream's SSE frames as the Responses API's typed events."""
    out = _Events()
    where = {"item_id": call.item_id, "output_index": 0, "content_index": 0}
    pending = response_object(call, status="in_progress", output=[], usage=None)
    yield out.frame("response.created", response=pending)
    yield out.frame("response.in_progress", response=pending)
    yield out.frame(
        "response.output_item.added", output_index=0, item=_item(call, None, "in_progress")
    )
    yield out.frame("response.content_part.added", **where, part=_part(""))
    text: list[str] = []
    usage: dict[str, Any] | None = None
    finish_reason: Any = None
    model: str | None = None
    buffer = b""
    async for chunk in chunks:
        buffer += chunk.encode() if isinstance(chunk, str) else bytes(chunk)
        *frames, buffer = buffer.replace(b"\r\n", b"\n").split(b"\n\n")
        for frame in frames:
            for line in frame.split(b"\n"):
                if not line.startswith(b"data:"):
                    continue  # comments (a continuation's note), event names
                data = line[5:].strip()
                if data == b"[DONE]":
                    continue
                try:
                    event, _ = decode(data)
                except ValueError:
                    continue
                if not isinstance(event, dict):
                    continue
                if isinstance(event.get("error"), dict):
                    err = event["error"]
                    failed = response_object(call, status="failed", output=[], usage=None)
                    failed["error"] = {
                        "code": err.get("code") or "server_error",
                        "message": err.get("message") or "",
                    }
                    yield out.frame("response.failed", response=failed)
                    return
                model = model or event.get("model")
                if event.get("usage"):
                    usage = _usage(event["usage"])
                for choice in event.get("choices") or ():
                    delta = (choice.get("delta") or {}).get("content")
                    if delta:
                        text.append(delta)
                        yield out.frame(
                            "response.output_text.delta", **where, delta=delta, logprobs=[]
                        )
                    if choice.get("finish_reason"):
                        finish_reason = choice["finish_reason"]
    whole = "".join(text)
    yield out.frame("response.output_text.done", **where, text=whole, logprobs=[])
    yield out.frame("response.content_part.done", **where, part=_part(whole))
    item = _item(call, whole, "completed")
    yield out.frame("response.output_item.done", output_index=0, item=item)
    done = response_object(
        call,
        status="completed",
        output=[item],
        usage=usage,
        finish_reason=finish_reason,
        model=model,
    )
    await _store(call, done, whole)  # before the client hears it is done, so it can continue
    kind = "response.completed" if done["status"] == "completed" else "response.incomplete"
    yield out.frame(kind, response=done)
