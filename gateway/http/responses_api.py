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
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterable
from dataclasses import dataclass, field
from typing import Any

from fastapi.responses import Response, StreamingResponse

from gateway.config.guards import RequestLimits
from gateway.errors import OpenAIError, bad_request
from gateway.json_codec import decode
from gateway.pipeline.response_store import (
    Conversation,
    ResponseStore,
    ResponseStoreUnavailableError,
    load,
    save,
)

# Fields of the Responses API the gateway serves; anything else is refused by name.
_SERVED = frozenset(
    {
        "model",
        "input",
        "instructions",
        "max_output_tokens",
        "temperature",
        "top_p",
        "user",
        "prompt_cache_key",
        "metadata",
        "previous_response_id",
        "stream",
        "store",
        "text",
    }
)
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = {"input_text", "output_text", "text"}
_DROP_HEADERS = {"content-length", "content-type"}


@dataclass
class ResponsesCall:
    """What the translation back needs of the client's request, and what storing its answer
    needs: the conversation before the answer, and the store (None: `store` is false)."""

    body: dict[str, Any]
    model: str
    stream: bool
    conversation: Conversation = field(default_factory=lambda: Conversation(None, []))
    store: ResponseStore | None = None
    created_at: int = field(default_factory=lambda: int(time.time()))
    id: str = field(default_factory=lambda: "resp_" + uuid.uuid4().hex)
    item_id: str = field(default_factory=lambda: "msg_" + uuid.uuid4().hex)


def _unserved(name: str) -> OpenAIError:
    return bad_request(
        f"`{name}` is not supported by this gateway's Responses API "
        "(served: " + ", ".join(sorted(_SERVED)) + ").",
        param=name,
        code="unsupported_parameter",
    )


def _content_text(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"`{param}` must be a string or an array of parts.", param=param)
    texts: list[str] = []
    for j, part in enumerate(content):
        where = f"{param}[{j}]"
        if not isinstance(part, dict):
            raise bad_request(f"`{where}` must be an object.", param=where)
        kind = part.get("type")
        if not isinstance(kind, str) or kind not in _TEXT_PARTS:
            raise bad_request(
                f"`{where}.type` {kind!r} is not supported: only input_text parts are.",
                param=f"{where}.type",
                code="unsupported_parameter",
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise bad_request(f"`{where}.text` must be a string.", param=f"{where}.text")
        texts.append(text)
    return "".join(texts)


def _instructions(body: dict[str, Any]) -> str | None:
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise bad_request("`instructions` must be a string.", param="instructions")
    return instructions


def _messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    """The chat messages of `input` (the instructions apart)."""
    messages: list[dict[str, Any]] = []
    items = body.get("input")
    if items is None:
        raise bad_request("Missing required parameter: 'input'.", param="input")
    if isinstance(items, str):
        messages.append({"role": "user", "content": items})
        return messages
    if not isinstance(items, list) or not items:
        raise bad_request("`input` must be a string or a non-empty array of items.", param="input")
    for i, item in enumerate(items):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise bad_request(f"`{where}` must be an object.", param=where)
        kind = item.get("type", "message")
        if kind != "message":
            raise bad_request(
                f"`{where}.type` {kind!r} is not supported: only message items are.",
                param=f"{where}.type",
                code="unsupported_parameter",
            )
        role = item.get("role")
        if not isinstance(role, str) or role not in _ROLES:
            raise bad_request(
                f"`{where}.role` must be one of user, assistant, system, developer.",
                param=f"{where}.role",
            )
        content = item.get("content")
        if content is None:
            raise bad_request(
                f"Missing required parameter: '{where}.content'.", param=f"{where}.content"
            )
        messages.append(
            {"role": _ROLES[role], "content": _content_text(content, f"{where}.content")}
        )
    return messages


def _response_format(text: Any) -> dict[str, Any] | None:
    if not isinstance(text, dict):
        raise bad_request("`text` must be an object.", param="text")
    unknown = set(text) - {"format"}
    if unknown:
        raise _unserved(f"text.{sorted(unknown)[0]}")
    fmt = text.get("format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise bad_request("`text.format` must be an object.", param="text.format")
    kind = fmt.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = fmt.get("schema")
        if not isinstance(schema, dict):
            raise bad_request("`text.format.schema` must be an object.", param="text.format.schema")
        spec: dict[str, Any] = {"name": fmt.get("name") or "response", "schema": schema}
        if fmt.get("strict") is not None:
            spec["strict"] = fmt["strict"]
        return {"type": "json_schema", "json_schema": spec}
    raise bad_request(
        "`text.format.type` must be text, json_object or json_schema.", param="text.format.type"
    )


def previous_not_found(response_id: str) -> OpenAIError:
    """The API's answer to a `previous_response_id` it does not know (or no longer)."""
    return bad_request(
        f"Previous response with id '{response_id}' not found.",
        param="previous_response_id",
        code="previous_response_not_found",
    )


async def prepare(
    body: dict[str, Any], limits: RequestLimits, store: ResponseStore
) -> tuple[dict[str, Any], ResponsesCall]:
    """`to_chat` after looking up `previous_response_id` in `store`; the call stores its
    answer there unless `store` is false."""
    previous = body.get("previous_response_id")
    prior = None
    if previous is not None:
        if not isinstance(previous, str):
            raise bad_request(
                "`previous_response_id` must be a string.", param="previous_response_id"
            )
        try:
            prior = await load(store, previous)
        except ResponseStoreUnavailableError as exc:
            raise OpenAIError(
                503,
                f"The stored responses cannot be reached: {exc}",
                type="server_error",
                code="service_unavailable",
            ) from None
        if prior is None:
            raise previous_not_found(previous)
    chat, call = to_chat(body, limits, prior)
    if body.get("store") is not False:
        call.store = store
    return chat, call


def to_chat(
    body: dict[str, Any], limits: RequestLimits, prior: Conversation | None = None
) -> tuple[dict[str, Any], ResponsesCall]:
    """The chat completion body for a Responses request continuing `prior` (the conversation
    of its `previous_response_id`), and what answering it needs."""
    for name in body:
        if name not in _SERVED:
            raise _unserved(name)
    model = body.get("model")
    if model is None:
        raise bad_request("You must provide a model parameter.", param="model")
    if not isinstance(model, str) or not model:
        raise bad_request("`model` must be a non-empty string.", param="model")
    stream = body.get("stream") or False
    if not isinstance(stream, bool):
        raise bad_request("`stream` must be a boolean.", param="stream")
    store = body.get("store")
    if store is not None and not isinstance(store, bool):
        raise bad_request("`store` must be a boolean.", param="store")
    metadata = body.get("metadata")
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise bad_request("`metadata` must be an object of strings.", param="metadata")
    instructions = _instructions(body)
    history = _messages(body)
    if prior is not None:
        history = prior.messages + history
        if instructions is None:
            instructions = prior.instructions
    system = [] if instructions is None else [{"role": "system", "content": instructions}]
    chat: dict[str, Any] = {"model": model, "messages": system + history}
    max_out = body.get("max_output_tokens")
    if max_out is not None:
        if isinstance(max_out, bool) or not isinstance(max_out, int) or max_out < 1:
            raise bad_request(
                "`max_output_tokens` must be an integer >= 1.", param="max_output_tokens"
            )
        if max_out > limits.max_max_tokens:
            raise bad_request(
                f"`max_output_tokens` must be at most {limits.max_max_tokens}.",
                param="max_output_tokens",
            )
        chat["max_tokens"] = max_out
    for name in ("temperature", "top_p", "user", "prompt_cache_key"):
        if body.get(name) is not None:
            chat[name] = body[name]
    if prior is not None and prior.session and "user" not in chat:
        chat.setdefault("prompt_cache_key", prior.session)  # the chain's session sticks
    if body.get("text") is not None:
        response_format = _response_format(body["text"])
        if response_format is not None:
            chat["response_format"] = response_format
    if stream:
        chat["stream"] = True
        chat["stream_options"] = {"include_usage": True}
    session = chat.get("prompt_cache_key") or chat.get("user")
    conversation = Conversation(
        instructions, history, session if isinstance(session, str) else None
    )
    return chat, ResponsesCall(body=body, model=model, stream=stream, conversation=conversation)


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
