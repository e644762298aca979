"""Reading and validating OpenAI request bodies: the size limit, JSON, the fields the gateway
needs (each mistake a 400 naming its `param`), the session key, the body sent upstream
(`stream_options.include_usage` forced on streams, everything else untouched: the client's
own bytes when nothing needs to change) and the
`RouteRequest` the router sees (canonical prompt text cut into chained-hash blocks)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from starlette.requests import Request

from gateway.config.guards import RequestLimits
from gateway.config.settings import RoutingSettings
from gateway.errors import OpenAIError, bad_request, body_too_large
from gateway.json_codec import decode_exact, encode
from gateway.pipeline.json_guard import check_shape
from router.blocks import chain_seed, hash_blocks, render_chat, render_prompt
from router.types import RouteRequest

Kind = Literal["chat", "completion"]


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    """What the gateway needs to know of a completion request; the body itself is kept."""

    kind: Kind
    body: dict[str, Any]
    model: str
    stream: bool
    client_wants_usage: bool  # stream_options.include_usage as the client sent it
    session_key: str | None
    prompt_text: str
    max_tokens: int | None
    cache_salt: str | None
    raw: bytes = b""  # the client's body as received (forwarded when nothing changes)
    fast_json: bool = True  # no NaN/Infinity in it: orjson may re-encode it


DEFAULT_LIMITS = RequestLimits()


def body_timeout(timeout_s: float) -> OpenAIError:
    # the client may still be sending: the connection cannot be reused
    return OpenAIError(
        408,
        f"The request body did not arrive in time (nothing for {timeout_s:g} s).",
        code="request_timeout",
        headers={"connection": "close"},
    )


async def read_body(request: Request, limit: int, timeout_s: float = 30.0) -> bytes:
    """The request body, refused with 413 as soon as it passes `limit` bytes and with 408
    when a piece takes longer than `timeout_s` (a body shorter than its Content-Length, a
    slow sender). A client that goes away raises starlette's `ClientDisconnect`."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise body_too_large(limit)
    chunks: list[bytes] = []
    size = 0
    pieces = request.stream()
    while True:
        try:
            async with asyncio.timeout(timeout_s):
                chunk = await anext(pieces)
        except StopAsyncIteration:
            break
        except TimeoutError:
            raise body_timeout(timeout_s) from None
        size += len(chunk)
        if size > limit:
            raise body_too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def decode_json_object(
    raw: bytes, limits: RequestLimits = DEFAULT_LIMITS
) -> tuple[dict[str, Any], bool]:
    """(body, fast_json) of a request body that must be a JSON object, no deeper than
    `limits.max_json_depth` and holding no lone surrogate (gateway/pipeline/json_guard.py)."""
    if not raw.strip():
        raise bad_request("The request body is empty; a JSON object was expected.")
    try:
        body, fast = decode_exact(raw)
    except RecursionError:
        raise too_deep(limits.max_json_depth) from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise bad_request(f"The request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    check_shape(raw, body, limits.max_json_depth)
    return body, fast


def too_deep(limit: int) -> OpenAIError:
    return bad_request(f"The request body nests deeper than {limit} levels.", code="json_too_deep")


def parse_json_object(raw: bytes, limits: RequestLimits = DEFAULT_LIMITS) -> dict[str, Any]:
    return decode_json_object(raw, limits)[0]


def _opt_int(body: Mapping[str, Any], name: str, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise bad_request(f"`{name}` must be an integer >= {minimum}.", param=name)
    return value


def _opt_str(body: Mapping[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise bad_request(f"`{name}` must be a string.", param=name)
    return value


def _common(
    body: dict[str, Any], session_header: str | None, limits: RequestLimits
) -> dict[str, Any]:
    model = body.get("model")
    if model is None:
        raise bad_request("You must provide a model parameter.", param="model")
    if not isinstance(model, str) or not model:
        raise bad_request("`model` must be a non-empty string.", param="model")
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request("`stream` must be a boolean.", param="stream")
    options = body.get("stream_options")
    wants_usage = False
    if options is not None:
        if not stream:
            raise bad_request(
                "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
                param="stream_options",
            )
        if not isinstance(options, dict):
            raise bad_request("`stream_options` must be an object.", param="stream_options")
        include = options.get("include_usage", False)
        if include is not None and not isinstance(include, bool):
            raise bad_request(
                "`stream_options.include_usage` must be a boolean.",
                param="stream_options.include_usage",
            )
        wants_usage = bool(include)
    max_tokens = _opt_int(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _opt_int(body, "max_tokens", 1)
    else:
        _opt_int(body, "max_tokens", 1)
    seed = body.get("seed")
    if seed is not None and (
        isinstance(seed, bool) or not isinstance(seed, int) or not -(2**63) <= seed < 2**63
    ):  # engines seed a 64-bit generator: anything else is their 500
        raise bad_request("`seed` must be an integer in the 64-bit signed range.", param="seed")
    n = _opt_int(body, "n", 1)
    if n is not None and n > MAX_CHOICES:
        raise bad_request(f"`n` must be at most {MAX_CHOICES}.", param="n")
    for number in ("temperature", "top_p"):
        value = body.get(number)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise bad_request(f"`{number}` must be a number.", param=number)
    cap = limits.max_session_key_chars
    if max_tokens is not None and max_tokens > limits.max_max_tokens:
        name = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        raise bad_request(f"`{name}` must be at most {limits.max_max_tokens}.", param=name)
    for name, value in (
        ("prompt_cache_key", _opt_str(body, "prompt_cache_key")),
        ("user", _opt_str(body, "user")),
        ("x-session-id", session_header),
    ):
        if value is not None and len(value) > cap:
            raise bad_request(
                f"`{name}` is longer than {cap} characters.", param=name, code="string_too_long"
            )
    session = _opt_str(body, "prompt_cache_key") or _opt_str(body, "user") or session_header
    return {
        "model": model,
        "stream": stream,
        "client_wants_usage": wants_usage,
        "session_key": session or None,
        "max_tokens": max_tokens,
        "cache_salt": _opt_str(body, "cache_salt"),
    }


def parse_chat(
    body: dict[str, Any],
    session_header: str | None,
    raw: bytes = b"",
    fast_json: bool = True,
    limits: RequestLimits = DEFAULT_LIMITS,
) -> ParsedRequest:
    common = _common(body, session_header, limits)
    messages = body.get("messages")
    if messages is None:
        raise bad_request("Missing required parameter: 'messages'.", param="messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("`messages` must be a non-empty array.", param="messages")
    if len(messages) > limits.max_messages:
        raise bad_request(
            f"`messages` holds more than {limits.max_messages} messages.", param="messages"
        )
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise bad_request(f"messages[{i}] must be an object.", param=f"messages[{i}]")
        role = message.get("role")
        if not isinstance(role, str) or not role:
            raise bad_request(
                f"Missing required parameter: 'messages[{i}].role'.", param=f"messages[{i}].role"
            )
        content = message.get("content")
        if content is not None and not isinstance(content, str | list):
            raise bad_request(
                f"messages[{i}].content must be a string or an array.",
                param=f"messages[{i}].content",
            )
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise bad_request("`tools` must be an array.", param="tools")
    text = render_chat(messages, tools)
    _check_prompt_size(text, "messages", limits)
    return ParsedRequest(
        kind="chat", body=body, prompt_text=text, raw=raw, fast_json=fast_json, **common
    )


def parse_completion(
    body: dict[str, Any],
    session_header: str | None,
    raw: bytes = b"",
    fast_json: bool = True,
    limits: RequestLimits = DEFAULT_LIMITS,
) -> ParsedRequest:
    common = _common(body, session_header, limits)
    prompt = body.get("prompt")
    if prompt is None:
        raise bad_request("Missing required parameter: 'prompt'.", param="prompt")
    valid = isinstance(prompt, str) or (
        isinstance(prompt, list)
        and len(prompt) > 0
        and (
            all(isinstance(p, str) for p in prompt)
            or all(
                isinstance(p, int) and not isinstance(p, bool) and 0 <= p < MAX_TOKEN_ID
                for p in prompt
            )
        )
    )
    if not valid:
        raise bad_request(
            "`prompt` must be a string, an array of strings or an array of token ids "
            f"(integers 0 <= id < {MAX_TOKEN_ID}).",
            param="prompt",
        )
    text = render_prompt(prompt)
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
        if len(prompt) > limits.max_prompt_tokens:
            raise _prompt_too_long("prompt", limits)
    else:
        _check_prompt_size(text, "prompt", limits)
    return ParsedRequest(
        kind="completion", body=body, prompt_text=text, raw=raw, fast_json=fast_json, **common
    )


MAX_CHOICES = 128
MAX_TOKEN_ID = 2**31  # no vocabulary comes near; larger ids only make engines fail


def _prompt_too_long(param: str, limits: RequestLimits) -> OpenAIError:
    return bad_request(
        f"The prompt is longer than {limits.max_prompt_tokens} tokens.",
        param=param,
        code="context_length_exceeded",
    )


def _check_prompt_size(text: str, param: str, limits: RequestLimits) -> None:
    # an estimate (4 characters a token) that never needs the tokenizer
    if len(text) > 4 * limits.max_prompt_tokens:
        raise _prompt_too_long(param, limits)


def upstream_body(parsed: ParsedRequest, stream_upstream: bool = False) -> bytes:
    """The body sent to the engine: the client's, with usage forced on for streams (and a
    stream asked for when `stream_upstream`, to be assembled for a non-streaming client);
    the client's exact bytes when that changes nothing."""
    body = parsed.body
    if stream_upstream and not parsed.stream:
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    elif parsed.stream and not parsed.client_wants_usage:
        options = dict(body.get("stream_options") or {})
        options["include_usage"] = True
        body = {**body, "stream_options": options}
    elif parsed.raw:
        return parsed.raw
    return encode(body, parsed.fast_json)


def route_request(parsed: ParsedRequest, routing: RoutingSettings) -> RouteRequest:
    """The request as the router sees it (approximate mode: blocks of characters)."""
    seed = chain_seed(parsed.model, parsed.cache_salt)
    hashes = hash_blocks(parsed.prompt_text, seed=seed, block_chars=routing.block_chars)
    return RouteRequest(
        model=parsed.model,
        block_hashes=hashes,
        block_tokens=routing.block_tokens,
        prompt_tokens=max(1, -(-len(parsed.prompt_text) // routing.chars_per_token)),
        session_key=parsed.session_key,
        max_tokens=parsed.max_tokens,
    )
