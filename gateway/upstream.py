"""Reading one engine response, in the mode the client needs.

- `stream()`: the client streams: the first chunk is read before anything is answered (a
  failure until then may fail over), then events are relayed as they complete; a failure
  after that ends the stream with an OpenAI-shaped `error` event and `data: [DONE]`.
- `assemble()`: the client did not stream but the engine did (`stream_upstream`): chunks
  are folded into the non-streaming answer; nothing is sent before the end.
- `whole()`: the engine answered one JSON body.
Each raises `AttemptFailed` for a failure that happened before the client got a byte.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import anyio
from fastapi.responses import JSONResponse, Response
from starlette.requests import Request

from gateway.aggregate import StreamAggregator
from gateway.disconnect import RelayResponse, race_disconnect
from gateway.errors import sse_error_event
from gateway.exchange import Exchange
from gateway.h1pool import UpstreamError, UpstreamResponse
from gateway.jsonc import decode
from gateway.sse import SseRelay

DONE = b"data: [DONE]\n\n"
_DROP_RESPONSE = {
    "content-length",
    "content-encoding",
    "transfer-encoding",
    "connection",
    "date",
    "server",
    "x-request-id",
    "keep-alive",
}


class AttemptFailed(Exception):
    """An attempt failed before the client got a byte: try the next instance."""

    def __init__(
        self, kind: str, message: str, response: tuple[int, bytes, dict[str, str]] | None = None
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.response = response


async def _first_chunk(it: AsyncIterator[bytes]) -> bytes:
    try:
        return await anext(it)
    except StopAsyncIteration:
        return b""


def response_headers(upstream: UpstreamResponse, ex: Exchange, instance: str) -> dict[str, str]:
    headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _DROP_RESPONSE}
    headers.update(ex.routing_headers(instance))
    return headers


async def assemble(
    request: Request, ex: Exchange, instance: str, resp: UpstreamResponse
) -> Response:
    """A non-streaming client's answer, assembled from the engine's stream: nothing has
    been sent before the end, so any failure on the way can still fail over."""
    aggregator = StreamAggregator(ex.parsed.kind)
    relay = SseRelay(strip_usage=False, on_chunk=aggregator.add)

    async def consume() -> None:
        async for chunk in resp.aiter_bytes():
            ex.inspect(instance, relay, chunk)
        relay.flush()

    try:
        await race_disconnect(request, consume())
    except UpstreamError as exc:
        raise AttemptFailed("read", f"{instance}: {type(exc).__name__}: {exc}") from None
    finally:
        with anyio.CancelScope(shield=True):
            await resp.aclose()
    if relay.error is not None:
        raise AttemptFailed("engine_error", f"{instance}: {relay.error.get('message')}")
    if not relay.saw_done:
        raise AttemptFailed("truncated", f"{instance}: the stream ended before [DONE]")
    ex.complete(instance, "ok", ok=True, usage=aggregator.usage)
    headers = {k: v for k, v in response_headers(resp, ex, instance).items() if k != "content-type"}
    return JSONResponse(aggregator.result(), status_code=resp.status_code, headers=headers)


async def whole(request: Request, ex: Exchange, instance: str, resp: UpstreamResponse) -> Response:
    try:
        content = await race_disconnect(request, resp.aread())
    except UpstreamError as exc:
        raise AttemptFailed("read", f"{instance}: {type(exc).__name__}: {exc}") from None
    finally:
        with anyio.CancelScope(shield=True):
            await resp.aclose()
    usage: dict[str, Any] | None = None
    try:
        parsed_body, _ = decode(content)
        if isinstance(parsed_body, dict) and isinstance(parsed_body.get("usage"), dict):
            usage = parsed_body["usage"]
    except ValueError:
        pass
    ex.complete(instance, "ok", ok=True, usage=usage)
    return Response(
        content, status_code=resp.status_code, headers=response_headers(resp, ex, instance)
    )


async def stream(request: Request, ex: Exchange, instance: str, resp: UpstreamResponse) -> Response:
    it = resp.aiter_bytes()
    try:
        first = await race_disconnect(request, _first_chunk(it))
    except UpstreamError as exc:
        await resp.aclose()
        raise AttemptFailed("read", f"{instance}: {type(exc).__name__}: {exc}") from None
    except BaseException:
        with anyio.CancelScope(shield=True):
            await resp.aclose()
        raise
    if not first:
        await resp.aclose()
        raise AttemptFailed("read", f"{instance}: the stream ended before its first byte")
    relay = SseRelay(strip_usage=not ex.parsed.client_wants_usage)
    body = _relay(ex, instance, resp, it, first, relay)

    async def cleanup() -> None:
        await body.aclose()  # runs the relay's own `finally` if it had started
        await resp.aclose()
        # no-op when the relay completed it; else the engine's own bytes decide the outcome
        if relay.finished:
            ex.complete(instance, "ok", ok=True, usage=relay.usage)
        else:
            ex.complete(instance, "cancelled", ok=False)

    return RelayResponse(
        body,
        cleanup=cleanup,
        status_code=resp.status_code,
        headers=response_headers(resp, ex, instance),
        media_type="text/event-stream",
    )


async def _relay(
    ex: Exchange,
    instance: str,
    resp: UpstreamResponse,
    it: AsyncIterator[bytes],
    first: bytes,
    relay: SseRelay,
) -> AsyncGenerator[bytes, None]:
    """Pass events on as they complete; end cleanly, with an error event, or cancelled."""
    outcome, ok = "cancelled", False
    try:
        for piece in ex.inspect(instance, relay, first):
            yield piece
        async for chunk in it:
            for piece in ex.inspect(instance, relay, chunk):
                yield piece
        tail = relay.flush()
        if tail:
            yield tail
        if relay.error is not None:
            outcome = "upstream_error"
            ex.midstream_error(instance, "engine_error")
            if not relay.saw_done:
                yield DONE
        elif not relay.saw_done:
            outcome = "upstream_error"
            ex.midstream_error(instance, "truncated")
            yield sse_error_event(
                "The upstream instance ended the stream early.", code="upstream_error"
            )
            yield DONE
        else:
            outcome, ok = "ok", True
    except UpstreamError as exc:
        outcome = "upstream_error"
        ex.midstream_error(instance, "midstream")
        message = f"The upstream instance failed mid-stream ({type(exc).__name__})."
        yield sse_error_event(message, code="upstream_error")
        yield DONE
    finally:
        with anyio.CancelScope(shield=True):
            await resp.aclose()
        if outcome == "cancelled" and relay.finished:
            # The engine had sent everything ([DONE] or finish_reason) when the client
            # left: a client that closes right after [DONE] got a complete answer.
            outcome, ok = "ok", True
        ex.complete(instance, outcome, ok=ok, usage=relay.usage)
