"""OpenAI request validation and response shapes for the simulated engine.

Requests are checked field by field so a client's mistake gets a 400 naming the offending
`param`, in OpenAI's error shape `{"error": {"message", "type", "param", "code"}}`.
Unknown fields are ignored, as vLLM does. Responses and SSE chunks follow the shapes of
`chat.completion`, `chat.completion.chunk` and `text_completion`.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from contracts.errors import ApiError


class APIError(ApiError):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type_: str = "invalid_request_error",
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type_

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad(message: str, param: str | None = None) -> APIError:
    return APIError(400, message, param=param)


@dataclass
class GenerationParams:
    model: str
    max_tokens: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    ignore_eos: bool = False
    seed: int | None = None
    cache_salt: str | None = None
    session: str | None = None  # prompt_cache_key, else user: whose KV this is
    return_token_ids: bool = False  # vLLM's: prompt and generated token ids in the answer


def parse_json(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad("request body must be a JSON object")
    return body


def _opt_int(body: dict[str, Any], name: str, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad(f"'{name}' must be an integer", name)
    if value < minimum:
        raise bad(f"'{name}' must be at least {minimum}, got {value}", name)
    return value


def _opt_bool(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise bad(f"'{name}' must be a boolean", name)
    return value


def parse_params(body: dict[str, Any], *, chat: bool) -> GenerationParams:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("'model' is required and must be a string", "model")
    n = _opt_int(body, "n", 1)
    if n is not None and n != 1:
        raise bad("only n=1 is supported", "n")
    max_tokens = _opt_int(body, "max_tokens", 1)
    if chat:
        mct = _opt_int(body, "max_completion_tokens", 1)
        max_tokens = mct if mct is not None else max_tokens
    stop_raw = body.get("stop")
    if stop_raw is None:
        stop: list[str] = []
    elif isinstance(stop_raw, str):
        stop = [stop_raw]
    elif isinstance(stop_raw, list) and all(isinstance(s, str) for s in stop_raw):
        stop = list(stop_raw)
    else:
        raise bad("'stop' must be a string or a list of strings", "stop")
    stream = _opt_bool(body, "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise bad("'stream_options' is only allowed when 'stream' is true", "stream_options")
        if not isinstance(options, dict):
            raise bad("'stream_options' must be an object", "stream_options")
        include_usage = bool(options.get("include_usage", False))
    seed = body.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise bad("'seed' must be an integer", "seed")
    salt = body.get("cache_salt")
    if salt is not None and not isinstance(salt, str):
        raise bad("'cache_salt' must be a string", "cache_salt")
    session = body.get("prompt_cache_key") or body.get("user")
    return GenerationParams(
        session=session if isinstance(session, str) else None,
        model=model,
        max_tokens=max_tokens,
        stop=stop,
        stream=stream,
        include_usage=include_usage,
        ignore_eos=_opt_bool(body, "ignore_eos"),
        seed=seed,
        cache_salt=salt or None,
        return_token_ids=_opt_bool(body, "return_token_ids"),
    )


def parse_messages(body: dict[str, Any]) -> list[dict[str, Any]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("'messages' must be a non-empty list", "messages")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise bad(f"messages[{i}] must be an object with a 'role'", f"messages[{i}]")
        content = m.get("content")
        if content is not None and not isinstance(content, str | list):
            raise bad(f"messages[{i}].content must be a string or a list", f"messages[{i}]")
    return messages


def parse_tools(body: dict[str, Any]) -> list[Any] | None:
    tools = body.get("tools")
    if tools is None:
        return None
    if not isinstance(tools, list):
        raise bad("'tools' must be a list", "tools")
    return tools


def _token_ids(value: Any) -> list[int] | None:
    if (
        isinstance(value, list)
        and value
        and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in value)
    ):
        return [int(t) for t in value]
    return None


MAX_BATCH_PROMPTS = 64


def parse_prompts(body: dict[str, Any]) -> list[str | list[int]]:
    """A completions `prompt`: a string, token ids, or a batch of either (one choice each)."""
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return [prompt]
    ids = _token_ids(prompt)
    if ids is not None:
        return [ids]
    if isinstance(prompt, list) and 0 < len(prompt) <= MAX_BATCH_PROMPTS:
        if all(isinstance(p, str) for p in prompt):
            return list(prompt)
        batch = [_token_ids(p) for p in prompt]
        if all(b is not None for b in batch):
            return [b for b in batch if b is not None]
    raise bad(
        f"'prompt' must be a string, token ids, or a list of up to {MAX_BATCH_PROMPTS} of either",
        "prompt",
    )


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


@dataclass
class ResponseShape:
    """Builds the bodies and chunks of one response (chat or text completion)."""

    chat: bool
    model: str
    request_id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.request_id:
            self.request_id = new_id("chatcmpl" if self.chat else "cmpl")

    def full(
        self,
        choices: Sequence[tuple[str, str | None]],
        use: dict[str, Any],
        ids: Sequence[tuple[list[int], list[int]]] | None = None,
    ) -> dict[str, Any]:
        """The whole answer; with `ids` (each choice's prompt and output token ids, asked
        with `return_token_ids`) placed as vLLM places them."""
        out: list[dict[str, Any]] = []
        for i, (text, finish_reason) in enumerate(choices):
            choice: dict[str, Any] = {"index": i, "logprobs": None, "finish_reason": finish_reason}
            if self.chat:
                choice["message"] = {"role": "assistant", "content": text, "tool_calls": []}
            else:
                choice["text"] = text
            if ids is not None:
                choice["token_ids"] = ids[i][1]
                if not self.chat:
                    choice["prompt_token_ids"] = ids[i][0]
            out.append(choice)
        body: dict[str, Any] = {
            "id": self.request_id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": out,
            "usage": use,
        }
        if ids is not None and self.chat:
            body["prompt_token_ids"] = ids[0][0]
        return body

    def chunk(
        self,
        text: str,
        finish_reason: str | None,
        *,
        index: int = 0,
        first: bool = False,
        with_usage_field: bool = False,
        token_ids: Sequence[int] | None = None,
        prompt_token_ids: Sequence[int] | None = None,
    ) -> dict[str, Any]:
        """One SSE chunk. `token_ids` (this chunk's generated ids) and `prompt_token_ids`
        are vLLM's `return_token_ids` fields: the prompt's ids on a chat stream's opening
        chunk, at the top; in a completions stream's first choice chunk, in the choice."""
        choice: dict[str, Any] = {
            "index": index,
            "logprobs": None,
            "finish_reason": finish_reason,
        }
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if first else {}
            if text or first or token_ids is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text
            if prompt_token_ids is not None:
                choice["prompt_token_ids"] = list(prompt_token_ids)
        if token_ids is not None:
            choice["token_ids"] = list(token_ids)
        out: dict[str, Any] = {
            "id": self.request_id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
        }
        if with_usage_field:
            out["usage"] = None
        if self.chat and prompt_token_ids is not None:
            out["prompt_token_ids"] = list(prompt_token_ids)
        return out

    def usage_chunk(self, use: dict[str, Any]) -> dict[str, Any]:
        return {
            "id": self.request_id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": use,
        }


def sse(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
