"""The request side of `POST /v1/responses` (gateway/http/responses_api.py answers it): a
Responses API body checked field by field and translated to a chat completion body, with
`previous_response_id`'s conversation looked up first. A field the gateway cannot serve is a
400 naming it in `param`."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from gateway.config.guards import RequestLimits
from gateway.errors import OpenAIError, bad_request
from gateway.pipeline.response_store import (
    Conversation,
    ResponseStore,
    ResponseStoreUnavailableError,
    load,
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
