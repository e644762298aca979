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

import logging
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import anyio
from fastapi.responses import Response

from contracts.errors import UpstreamError as WarmgateUpstreamError
from gateway.errors import sse_error_event
from gateway.json_codec import decode, encode
from gateway.pipeline.lifecycle import RequestLifecycle
from gateway.upstream.aggregate import StreamAggregator
from gateway.upstream.continuation import SoFar, Stitcher, so_far
from gateway.upstream.disconnect import Abandoned, RelayResponse
from gateway.upstream.inflight import Attempt
from gateway.upstream.sse import SseRelay
from gateway.upstream.token_ids import client_wants as client_wants_ids
from gateway.upstream.token_ids import strip as strip_ids
from gateway.upstream.transport import TransportError, UpstreamResponse, UpstreamTimeout

log = logging.getLogger("warmgate.proxy")

DONE = b"data: [DONE]\n\n"
# An assembled answer's upstream pieces read per wake-up after its first token: fewer
# wake-ups (CPU) against the parsing left for after the last one (latency).
ASSEMBLE_PIECES = 16
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


class AttemptFailed(WarmgateUpstreamError):
    """An attempt failed before the client got a byte: try the next instance. One subclass
    per way of failing; `kind` is its metric label (`warmgate_upstream_errors_total`)."""

    kind = "failed"

    def __init__(
        self,
        message: str,
        response: tuple[int, bytes, dict[str, str]] | None = None,
        *,
        unhealthy: str | None = None,
    ) -> None:
        super().__init__(message)
        self.response = response
        self.unhealthy = unhealthy  # the engine's fault, as its health records it


class AttemptHung(AttemptFailed):
    kind = "hung"  # the engine stopped answering (abandoned past its deadline)


class AttemptTimedOut(AttemptFailed):
    kind = "timeout"


class AttemptLocalFailure(AttemptFailed):
    kind = "local"  # the gateway ran out of descriptors or buffers: not the engine's fault


class AttemptConnectFailed(AttemptFailed):
    kind = "connect"


class AttemptRead(AttemptFailed):
    kind = "read"  # the answer broke off while being read


class EngineErrorEvent(AttemptFailed):
    kind = "engine_error"  # the engine's stream carried an error event before any byte


class StreamTruncated(AttemptFailed):
    kind = "truncated"  # the stream ended before [DONE]


class EngineBusy(AttemptFailed):
    kind = "status_429"


class EngineServerError(AttemptFailed):
    kind = "status_5xx"


async def _first_chunk(it: AsyncIterator[bytes]) -> bytes:
    try:
        return await anext(it)
    except StopAsyncIteration:
        return b""


def response_headers(
    upstream: UpstreamResponse, life: RequestLifecycle, instance: str
) -> dict[str, str]:
    headers = {k: v for k, v in upstream.headers.items() if k.lower() not in _DROP_RESPONSE}
    headers.update(life.routing_headers(instance))
    return headers


async def assemble(life: RequestLifecycle, instance: str, resp: UpstreamResponse) -> Response:
    """A non-streaming client's answer, assembled from the engine's stream: nothing has
    been sent before the end, so any failure on the way can still fail over."""
    aggregator = StreamAggregator(life.parsed.kind)
    relay = SseRelay(strip_usage=False, on_chunk=aggregator.add)
    t = life.timeouts

    async def consume() -> None:
        coalescing = False
        async for chunk in resp.aiter_bytes(t.stall_s, first_s=t.first_byte_s):
            life.inspect(instance, relay, chunk)
            if relay.saw_content and not coalescing:
                # TTFT is known and nothing is sent before the end: wake once for many tokens
                resp.coalesce(ASSEMBLE_PIECES)
                coalescing = True
        relay.flush()

    try:
        await life.watch.guard(consume())
    except TransportError as exc:
        raise AttemptRead(f"{instance}: {type(exc).__name__}: {exc}") from None
    finally:
        with anyio.CancelScope(shield=True):
            await resp.aclose()
    if relay.error is not None:
        raise EngineErrorEvent(f"{instance}: {relay.error.get('message')}")
    if not relay.saw_done:
        raise StreamTruncated(f"{instance}: the stream ended before [DONE]")
    life.ended("ok", instance, aggregator.usage)
    life.served(instance)
    headers = {
        k: v for k, v in response_headers(resp, life, instance).items() if k != "content-type"
    }
    return Response(
        encode(aggregator.result(), relay.fast),
        status_code=resp.status_code,
        headers=headers,
        media_type="application/json",
    )


async def whole(life: RequestLifecycle, instance: str, resp: UpstreamResponse) -> Response:
    try:
        content = await life.watch.guard(resp.aread())
    except TransportError as exc:
        raise AttemptRead(f"{instance}: {type(exc).__name__}: {exc}") from None
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
    life.ended("ok", instance, usage)
    life.served(instance)
    return Response(
        content, status_code=resp.status_code, headers=response_headers(resp, life, instance)
    )


@dataclass
class Resumed:
    """A continuation under way on another instance: its first chunk already read."""

    instance: str
    resp: UpstreamResponse
    it: AsyncIterator[bytes]
    first: bytes
    attempt: Attempt
    mode: str = "text"  # how it goes on: "token_ids" or "text" (gateway.upstream.continuation)
    kind: str = ""  # the format of its chunks, when not the client's


Resume = Callable[[SoFar], Awaitable[Resumed | None]]


async def stream(
    life: RequestLifecycle,
    instance: str,
    resp: UpstreamResponse,
    attempt: Attempt,
    resume: Resume | None = None,
) -> Response:
    t = life.timeouts
    it = resp.aiter_bytes(t.stall_s, first_s=t.first_byte_s)
    try:
        first = await life.watch.guard(_first_chunk(it), attempt.abandoned)
    except (TransportError, Abandoned) as exc:
        await resp.aclose()
        raise AttemptRead(f"{instance}: {type(exc).__name__}: {exc}") from None
    except BaseException:
        with anyio.CancelScope(shield=True):
            await resp.aclose()
        raise
    if not first:
        await resp.aclose()
        raise AttemptRead(f"{instance}: the stream ended before its first byte")
    attempt.streaming = True  # from here the relay owns it (and ends it)
    run = _Relay(life, instance, resp, it, attempt, resume)
    body = run.frames(first)

    async def cleanup() -> None:
        await body.aclose()  # runs the relay's own `finally` if it had started
        await run.close()  # if it had not
        life.close()  # the stream's end, as the relay left it (never started: cancelled)

    return RelayResponse(
        body,
        watch=life.watch,
        cleanup=cleanup,
        status_code=resp.status_code,
        headers=response_headers(resp, life, instance),
        media_type="text/event-stream",
    )


class _Relay:
    """One client stream, relayed from one engine or, after a failure mid-stream, from the
    next (`resume`); it ends cleanly, with an error event, or cancelled."""

    def __init__(
        self,
        life: RequestLifecycle,
        instance: str,
        resp: UpstreamResponse,
        it: AsyncIterator[bytes],
        attempt: Attempt,
        resume: Resume | None,
    ) -> None:
        self.life = life
        self.first_instance = self.instance = instance
        self.resp, self.it, self.attempt = resp, it, attempt
        self.resume = resume
        # the frames sent, token ids included: what a continuation goes on from
        self.sent: list[bytes] | None = [] if resume is not None else None
        self.relay = SseRelay(
            strip_usage=not life.parsed.client_wants_usage,
            for_reading=None if resume is None else strip_ids,  # the ids are read from `sent`
        )
        # a continuable stream was asked for token ids (gateway.upstream.token_ids): the
        # client sees them only if it asked too
        self.strip_ids = resume is not None and not client_wants_ids(life.parsed)
        self.stitch: Stitcher | None = None
        self.continued_from: list[str] = []
        self.stalled_on: list[str] = []  # of those, where it went silent past stall_s
        self.closed = False  # the current engine response, closed

    def _out(self, pieces: list[bytes]) -> list[bytes]:
        if self.stitch is not None:
            pieces = [p for p in map(self.stitch, pieces) if p]
        if self.sent is not None:
            self.sent.extend(pieces)
        if self.strip_ids:
            pieces = [strip_ids(p) for p in pieces]
        return pieces

    async def close(self) -> None:
        """Close the engine's response and end its attempt (once; the cleanup calls it
        again for a stream that never started)."""
        if self.closed:
            return
        self.closed = True
        with anyio.CancelScope(shield=True):
            await self.resp.aclose()
        self.life.end(self.attempt)

    async def frames(self, first: bytes) -> AsyncGenerator[bytes, None]:
        life = self.life
        outcome = "cancelled"
        try:
            pending = first
            while True:
                failure, detail = None, ""
                try:
                    # the events of one upstream read go out in one write to the client
                    if out := b"".join(self._out(life.inspect(self.instance, self.relay, pending))):
                        yield out
                    async for chunk in self.it:
                        if out := b"".join(
                            self._out(life.inspect(self.instance, self.relay, chunk))
                        ):
                            yield out
                    tail = self._out([self.relay.flush()])
                    for piece in tail:
                        if piece:
                            yield piece
                    if self.relay.error is None and not self.relay.saw_done:
                        failure, detail = "truncated", "ended the stream early"
                except TransportError as exc:
                    failure, detail = "midstream", f"failed mid-stream ({type(exc).__name__})"
                    if isinstance(exc, UpstreamTimeout):
                        self.stalled_on.append(self.instance)
                if failure is None:
                    break
                life.midstream_error(self.instance, failure)
                sent = so_far(self.sent, life.parsed.kind) if self.sent is not None else None
                if self.relay.saw_finish or (sent is not None and sent.finished):
                    yield DONE  # the answer was whole; only its end was lost
                    outcome = "ok"
                    return
                resumed = await self._continue(sent)
                if resumed is None:
                    outcome = "upstream_error"
                    yield sse_error_event(f"The upstream instance {detail}.", code="upstream_error")
                    yield DONE
                    return
                assert self.stitch is not None
                yield self.stitch.comment()
                pending = resumed.first
            if self.relay.error is not None:
                outcome = "upstream_error"
                life.midstream_error(self.instance, "engine_error")
                if not self.relay.saw_done:
                    yield DONE
            else:
                outcome = "ok"
                life.served(self.instance)
        finally:
            await self.close()
            if outcome == "cancelled" and self.relay.finished:
                # The engine had sent everything ([DONE] or finish_reason) when the client
                # left: a client that closes right after [DONE] got a complete answer.
                outcome = "ok"
            life.ended(outcome, self.first_instance, self.relay.usage)

    async def _continue(self, sent: SoFar | None) -> Resumed | None:
        life = self.life
        if self.resume is None:
            return None
        if sent is None:
            life.continuation("impossible")
            return None
        self.continued_from.append(self.instance)
        sent.continued_from = list(self.continued_from)
        sent.stalled_on = list(self.stalled_on)
        resumed = await self.resume(sent)
        if resumed is None:
            life.continuation("failed")
            return None
        life.continuation("continued", resumed.mode)
        await self.close()
        log.info(
            "stream continued on %s after %s failed (%d tokens sent, by %s)",
            resumed.instance,
            self.instance,
            sent.tokens,
            resumed.mode,
            extra={"instance": resumed.instance},
        )
        self.instance, self.resp, self.it, self.attempt = (
            resumed.instance,
            resumed.resp,
            resumed.it,
            resumed.attempt,
        )
        self.closed = False
        self.relay = SseRelay(strip_usage=not self.life.parsed.client_wants_usage)
        self.stitch = Stitcher(
            sent, self.life.parsed.kind, resumed.instance, resumed.mode, resumed.kind
        )
        return resumed
