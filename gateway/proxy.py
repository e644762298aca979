"""Proxying one completion request: route, hint tierd, send upstream, fail over, relay.

The decision's instance is tried first, then its fallbacks (healthy candidates only). An
attempt fails over when the instance fails *before the client got a byte*: connection
error or timeout, a 5xx status, or a stream that dies before its first chunk. A 4xx from
the engine is the client's mistake: passed through, never retried elsewhere. Once bytes
have been sent, a failure ends the stream with an OpenAI-shaped `error` event and
`data: [DONE]`. A client that goes away cancels the upstream request (streams: Starlette
cancels the relay; non-streams: a watcher on the ASGI receive channel).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import anyio
import httpx
from fastapi.responses import Response, StreamingResponse
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from gateway.errors import (
    OpenAIError,
    bad_gateway,
    error_body,
    model_not_found,
    no_healthy_instance,
    sse_error_event,
)
from gateway.exchange import Exchange
from gateway.parse import ParsedRequest, route_request, upstream_body
from gateway.sse import SseRelay
from gateway.state import AppState
from router.types import NoCandidateError

log = logging.getLogger("warmgate.proxy")
T = TypeVar("T")

DONE = b"data: [DONE]\n\n"
_FORWARD_REQUEST = ("authorization", "openai-organization", "openai-project", "user-agent")
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


class ClientDisconnected(Exception):
    """The client went away while we waited on the upstream."""


class AttemptFailed(Exception):
    """An attempt failed before the client got a byte: try the next instance."""

    def __init__(
        self, kind: str, message: str, response: tuple[int, bytes, dict[str, str]] | None = None
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.response = response


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


async def race_disconnect(request: Request, awaitable: Awaitable[T]) -> T:
    """Await `awaitable`, cancelling it (and raising ClientDisconnected) if the client leaves."""
    work: asyncio.Future[T] = asyncio.ensure_future(awaitable)
    watch: asyncio.Future[Any] = asyncio.ensure_future(_wait_disconnect(request))
    both: set[asyncio.Future[Any]] = {work, watch}
    try:
        await asyncio.wait(both, return_when=asyncio.FIRST_COMPLETED)
    finally:
        if not work.done():
            work.cancel()
            await asyncio.gather(work, return_exceptions=True)
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
    if work.cancelled():
        raise ClientDisconnected()
    return work.result()


async def _first_chunk(it: AsyncIterator[bytes]) -> bytes:
    try:
        return await anext(it)
    except StopAsyncIteration:
        return b""


def _request_headers(request: Request, request_id: str) -> dict[str, str]:
    headers = {
        "content-type": "application/json",
        "accept-encoding": "identity",
        "x-request-id": request_id,
    }
    for name in _FORWARD_REQUEST:
        value = request.headers.get(name)
        if value is not None:
            headers[name] = value
    return headers


def _response_headers(upstream: httpx.Response, ex: Exchange, instance: str) -> dict[str, str]:
    headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _DROP_RESPONSE}
    headers.update(ex.routing_headers(instance))
    return headers


def _openai_error_body(content: bytes) -> bool:
    try:
        body = json.loads(content)
    except ValueError:
        return False
    return isinstance(body, dict) and isinstance(body.get("error"), dict)


async def proxy_completion(
    state: AppState, request: Request, parsed: ParsedRequest, path: str, request_id: str
) -> Response:
    """Serve one `/v1/chat/completions` or `/v1/completions` request."""
    started = time.monotonic()
    if parsed.model not in state.health.known_models():
        raise model_not_found(parsed.model)
    candidates = state.health.candidates_for(parsed.model)
    retry_after = state.settings.retry_after_s
    if not candidates:
        raise no_healthy_instance(parsed.model, retry_after)
    rr = route_request(parsed, state.settings.routing)
    shared = state.session_binder()  # gateway/shared.py: cross-replica session binding
    if shared is not None:
        await shared.lookup(rr)
    try:
        decision = state.router.route(rr, candidates)
    except NoCandidateError:
        raise no_healthy_instance(parsed.model, retry_after) from None
    if shared is not None:
        decision = shared.bind(rr, decision, candidates)
    state.metrics.decisions.labels(decision.instance, decision.policy).inc()
    ex = Exchange(state, parsed, rr, decision, started, request_id)
    state.prefetcher.hint(
        decision.instance,
        rr.block_hashes,
        state.settings.tiers.prefetch_deadline_s,
        parsed.session_key,
    )
    allowed = set(candidates)
    order = [decision.instance, *(f for f in decision.fallbacks if f in allowed)]
    order = list(dict.fromkeys(order))
    body = upstream_body(parsed)
    headers = _request_headers(request, request_id)
    last: AttemptFailed | None = None
    state.metrics.in_flight.inc()
    for attempt, instance in enumerate(order):
        if attempt:
            state.metrics.failovers.inc()
            state.stats.failovers += 1
            log.info("failing over to %s after: %s", instance, last, extra={"instance": instance})
        state.router.on_dispatch(rr, decision, instance)
        try:
            return await _attempt(state, request, ex, instance, path, body, headers)
        except AttemptFailed as failed:
            ex.attempt_failed(instance, failed.kind, str(failed))
            last = failed
        except ClientDisconnected:
            ex.complete(instance, "cancelled", ok=False)
            return Response(status_code=499)
        except BaseException:
            ex.complete(instance, "cancelled", ok=False)
            raise
    ex.finish_failed()
    assert last is not None
    if last.response is not None:
        status, content, upstream_headers = last.response
        if _openai_error_body(content):
            keep = {
                k: v
                for k, v in upstream_headers.items()
                if k in ("retry-after", "retry-after-ms", "x-should-retry")
            }
            keep.setdefault("x-should-retry", "true" if status in (502, 503, 504) else "false")
            return Response(
                content, status_code=status, media_type="application/json", headers=keep
            )
    raise bad_gateway(
        f"Every instance that serves `{parsed.model}` failed ({len(order)} tried); last: {last}",
        should_retry=True,
    )


async def _attempt(
    state: AppState,
    request: Request,
    ex: Exchange,
    instance: str,
    path: str,
    body: bytes,
    headers: dict[str, str],
) -> Response:
    url = state.health.instance_url(instance) + path
    upstream_request = state.client.build_request("POST", url, content=body, headers=headers)
    try:
        resp = await race_disconnect(request, state.client.send(upstream_request, stream=True))
    except httpx.TimeoutException as exc:
        raise AttemptFailed("timeout", f"{instance}: {type(exc).__name__}") from None
    except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.NetworkError) as exc:
        state.health.record_failure(instance, f"request failed: {type(exc).__name__}: {exc}")
        raise AttemptFailed("connect", f"{instance}: {type(exc).__name__}: {exc}") from None
    if resp.status_code >= 400:
        try:
            content = await race_disconnect(request, resp.aread())
        except httpx.HTTPError:
            content = b""
        finally:
            await resp.aclose()
        if resp.status_code >= 500:
            raise AttemptFailed(
                "status_5xx",
                f"{instance} answered {resp.status_code}",
                (resp.status_code, content, dict(resp.headers)),
            )
        ex.complete(instance, "client_error", ok=False)
        if not _openai_error_body(content):
            err = OpenAIError(
                resp.status_code,
                content.decode(errors="replace")[:500] or f"upstream answered {resp.status_code}",
                code="upstream_error",
            )
            content = json.dumps(err.body()).encode()
        return Response(
            content,
            status_code=resp.status_code,
            media_type="application/json",
            headers=ex.routing_headers(instance),
        )
    if not ex.parsed.stream:
        return await _whole(request, ex, instance, resp)
    return await _stream(request, ex, instance, resp)


async def _whole(request: Request, ex: Exchange, instance: str, resp: httpx.Response) -> Response:
    try:
        content = await race_disconnect(request, resp.aread())
    except httpx.HTTPError as exc:
        raise AttemptFailed("read", f"{instance}: {type(exc).__name__}: {exc}") from None
    finally:
        with anyio.CancelScope(shield=True):
            await resp.aclose()
    usage: dict[str, Any] | None = None
    try:
        parsed_body = json.loads(content)
        if isinstance(parsed_body, dict) and isinstance(parsed_body.get("usage"), dict):
            usage = parsed_body["usage"]
    except ValueError:
        pass
    ex.complete(instance, "ok", ok=True, usage=usage)
    return Response(
        content, status_code=resp.status_code, headers=_response_headers(resp, ex, instance)
    )


async def _stream(request: Request, ex: Exchange, instance: str, resp: httpx.Response) -> Response:
    it = resp.aiter_bytes()
    try:
        first = await race_disconnect(request, _first_chunk(it))
    except httpx.HTTPError as exc:
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
        ex.complete(instance, "cancelled", ok=False)  # no-op when the relay completed it

    return RelayResponse(
        body,
        cleanup=cleanup,
        status_code=resp.status_code,
        headers=_response_headers(resp, ex, instance),
        media_type="text/event-stream",
    )


class RelayResponse(StreamingResponse):
    """A streaming response that always cleans up, even when the client left before the
    first chunk was pulled (a generator that never started never runs its `finally`)."""

    def __init__(
        self,
        content: AsyncIterator[bytes],
        *,
        cleanup: Callable[[], Awaitable[None]],
        status_code: int,
        headers: dict[str, str],
        media_type: str,
    ) -> None:
        super().__init__(content, status_code=status_code, headers=headers, media_type=media_type)
        self._cleanup = cleanup

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            with anyio.CancelScope(shield=True):
                await self._cleanup()


async def _relay(
    ex: Exchange,
    instance: str,
    resp: httpx.Response,
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
    except httpx.HTTPError as exc:
        outcome = "upstream_error"
        ex.midstream_error(instance, "midstream")
        message = f"The upstream instance failed mid-stream ({type(exc).__name__})."
        yield (
            b"data: "
            + json.dumps(error_body(message, "server_error", None, "upstream_error")).encode()
            + b"\n\n"
        )
        yield DONE
    finally:
        with anyio.CancelScope(shield=True):
            await resp.aclose()
        ex.complete(instance, outcome, ok=ok, usage=relay.usage)
