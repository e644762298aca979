"""Proxying one completion request: route, hint tierd, send upstream, fail over, relay.

The decision's instance is tried first, then its fallbacks (healthy candidates only). An
attempt fails over when the instance fails *before the client got a byte*: connection
error or timeout, a 5xx or 429 status, or a stream that dies before its first chunk (when
every instance fails, the last engine error is passed through if it is OpenAI-shaped, else
a 502). Any other 4xx from the engine is the client's mistake: passed through, never
retried elsewhere. Once bytes have been sent, a failure ends the stream with an
OpenAI-shaped `error` event and `data: [DONE]`. A client that goes away cancels the
upstream request (streams: Starlette cancels the relay; non-streams: a watcher on the ASGI
receive channel). How one engine response is read (relayed, assembled or whole) lives in
`gateway.upstream.relay`.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from fastapi.responses import Response
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from gateway.config.warm import PrioritySettings
from gateway.errors import (
    OpenAIError,
    bad_gateway,
)
from gateway.pipeline.decide import RequestPipeline, Routed
from gateway.pipeline.lifecycle import RequestLifecycle
from gateway.pipeline.parse import ParsedRequest, upstream_body
from gateway.pipeline.prefill_gate import GateTimeout, PrefillGate
from gateway.pipeline.priority import NONE, RequestPriority, admit, background_shed
from gateway.state import AppState
from gateway.upstream.disconnect import Abandoned, ClientDisconnected, RelayResponse
from gateway.upstream.inflight import Attempt
from gateway.upstream.relay import (
    AttemptConnectFailed,
    AttemptFailed,
    AttemptHung,
    AttemptLocalFailure,
    AttemptTimedOut,
    EngineBusy,
    EngineServerError,
    Resume,
    assemble,
    stream,
    whole,
)
from gateway.upstream.resume import resumer as _resumer
from gateway.upstream.token_ids import ask as ask_token_ids
from gateway.upstream.transport import (
    Target,
    TransportError,
    UpstreamLocalError,
    UpstreamTimeout,
    target_of,
)

log = logging.getLogger("warmgate.proxy")

_FORWARD_REQUEST = {
    name.encode(): name
    for name in (
        "authorization",
        "openai-organization",
        "openai-project",
        "user-agent",
        "traceparent",  # W3C trace context: the engine's own spans join the client's trace
        "tracestate",
    )
}


def _request_headers(request: Request, request_id: str, *, forward_auth: bool) -> dict[str, str]:
    headers = {
        "content-type": "application/json",
        "accept-encoding": "identity",
        "x-request-id": request_id,
    }
    # One pass over the raw headers (a `request.headers.get()` scans them all each time).
    for raw_name, raw_value in request.scope["headers"]:
        name = _FORWARD_REQUEST.get(raw_name)
        if name is None or name in headers:
            continue  # not forwarded, or a repeat: the first one counts
        if name == "authorization" and not forward_auth:
            continue  # the client's key is the gateway's, not the engines'
        headers[name] = raw_value.decode("latin-1")
    return headers


def _openai_error_body(content: bytes) -> bool:
    try:
        body = json.loads(content)
    except ValueError:
        return False
    return isinstance(body, dict) and isinstance(body.get("error"), dict)


async def proxy_completion(
    state: AppState,
    request: Request,
    parsed: ParsedRequest,
    path: str,
    request_id: str,
    priority: RequestPriority = NONE,
    *,
    report_after_send: bool = True,
) -> Response:
    """Serve one `/v1/chat/completions` or `/v1/completions` request (`priority`: its class
    and TTFT deadline, gateway/pipeline/priority.py). A whole answer's end is reported (the
    lifecycle's close: router hooks, metrics, stats, the log line) once the answer has been
    handed to the client, off its path, unless `report_after_send` is False (a caller that
    does not send the answer as it is: it is reported before it is returned)."""
    started = time.monotonic()
    trace = state.tracing.begin(request.scope["headers"])  # gateway.observe.tracing
    pipeline = state.pipeline
    assert pipeline is not None, "built in the lifespan"
    routed = await pipeline.decide(parsed, dry_run=False)
    if priority.asks:  # shed background work, meet the deadline or answer at once
        routed = admit(routed, priority, state.inflight.count, state.settings.priority)
    trace.decided(routed, path)
    life = RequestLifecycle(
        state, request.receive, parsed, routed.route, routed.decision, started, request_id, trace
    )
    try:
        response = await _attempts(state, pipeline, request, life, routed, path, priority)
    except BaseException:
        life.close()
        raise
    if isinstance(response, RelayResponse):
        return response  # a stream's own cleanup closes it when it ends
    if not report_after_send:
        life.close()
        return response
    return ReportedAfterSend(response, life.close)


class ReportedAfterSend(Response):
    """A whole answer, as rendered, whose request's end (`report`) runs once the answer has
    been handed to the server, however sending ends. The send itself does not yield to the
    event loop (its bytes go to the socket's buffer), so nothing else the gateway serves
    can see the request before its end is reported."""

    def __init__(self, answer: Response, report: Callable[[], None]) -> None:
        # not Response.__init__: the answer is rendered already (body and headers)
        self.status_code = answer.status_code
        self.body = answer.body
        self.raw_headers = answer.raw_headers
        self.background = answer.background
        self._report = report

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._report()


async def _attempts(
    state: AppState,
    pipeline: RequestPipeline,
    request: Request,
    life: RequestLifecycle,
    routed: Routed,
    path: str,
    priority: RequestPriority,
) -> Response:
    """The decision's instance, then its fallbacks, until one answers."""
    parsed = life.parsed
    await pipeline.hold_for_prefetch(pipeline.send_prefetch(routed))
    order = routed.attempt_order()
    body = upstream_body(parsed, state.settings.stream_upstream)
    if parsed.stream and state.settings.continue_streams:
        body = ask_token_ids(parsed, body)  # what a continuation goes on from
    headers = _request_headers(request, life.request_id, forward_auth=not state.access.any_keys)
    last: AttemptFailed | None = None
    request_faults = 0
    for attempt, instance in enumerate(order):
        if attempt:
            log.info("failing over to %s after: %s", instance, last, extra={"instance": instance})
        if priority.klass == "background" and state.prefill_gate is not None:
            try:
                await _prefill_slot(state.prefill_gate, life, instance, state.settings.priority)
            except ClientDisconnected:
                life.ended("cancelled", None)  # never sent: no instance's to report
                return Response(status_code=499)
        life.dispatch(instance, attempt, headers)
        try:
            resume = None
            if parsed.stream and state.settings.continue_streams:
                resume = _resumer(state, life, path, headers, order[attempt + 1 :] or order)
            spec = state.health.spec(instance)
            sent = priority.engine_headers(headers, spec.priority_header if spec else None)
            return await _attempt(state, life, instance, path, body, sent, resume)
        except AttemptFailed as failed:
            life.attempt_failed(instance, failed.kind, str(failed), failed.unhealthy)
            last = failed
            if _request_fault(failed):
                request_faults += 1
                if request_faults >= POISON_AFTER:
                    log.warning(
                        "%d instances failed this request with an internal error: not retried",
                        request_faults,
                    )
                    break
        except ClientDisconnected:
            life.ended("cancelled", instance)
            return Response(status_code=499)
    # every attempt failed before a byte reached the client: the end is upstream_error
    assert last is not None
    if last.response is not None:
        status, content, upstream_headers = last.response
        if _openai_error_body(content):
            keep = {
                k: v
                for k, v in upstream_headers.items()
                if k in ("retry-after", "retry-after-ms", "x-should-retry")
            }
            if status in (502, 503, 504, 429):
                keep.setdefault("x-should-retry", "true")
            elif request_faults >= POISON_AFTER:
                keep["x-should-retry"] = "false"  # the request, not the fleet: never again
            return Response(
                content, status_code=status, media_type="application/json", headers=keep
            )
    raise bad_gateway(
        f"Every instance that serves `{parsed.model}` failed ({len(order)} tried); last: {last}",
        should_retry=request_faults < POISON_AFTER,
    )


async def _prefill_slot(
    gate: PrefillGate, life: RequestLifecycle, instance: str, settings: PrioritySettings
) -> None:
    """Wait for one of `instance`'s background prefill slots (the lifecycle frees it); a
    background request that waits too long is shed like one over the in-flight limit."""
    try:
        slot = await life.watch.guard(gate.enter(instance))
    except GateTimeout as exc:
        life.ended("shed", None)
        raise background_shed(str(exc), settings) from None
    life.hold_prefill(slot)


# A 500 from two different instances says the request is at fault (an engine answering 500
# to everything fails its health checks and leaves the set): stop there, and tell the client
# not to retry (one SDK call once cost nine engine 500s).
POISON_AFTER = 2


def _request_fault(failed: AttemptFailed) -> bool:
    if not isinstance(failed, EngineServerError) or failed.response is None:
        return False
    return failed.response[0] not in (502, 503, 504)


async def _attempt(
    state: AppState,
    life: RequestLifecycle,
    instance: str,
    path: str,
    body: bytes,
    headers: dict[str, str],
    resume: Resume | None = None,
) -> Response:
    target = target_of(state.health.instance_url(instance) + path)
    attempt = life.begin(instance)
    try:
        return await _attempt_on(state, life, instance, target, body, headers, attempt, resume)
    finally:
        if not attempt.streaming:
            life.end(attempt)  # a relayed stream ends it when it ends


async def _attempt_on(
    state: AppState,
    life: RequestLifecycle,
    instance: str,
    target: Target,
    body: bytes,
    headers: dict[str, str],
    attempt: Attempt,
    resume: Resume | None,
) -> Response:
    # a streamed answer must start within first_byte_s; a whole one takes its generation
    streamed = life.parsed.stream or state.settings.stream_upstream
    head_s = life.timeouts.first_byte_s if streamed else None
    post = state.upstream.post(target, headers, body, head_s)
    try:
        resp = await life.watch.guard(post, attempt.abandoned)
    except Abandoned as exc:
        raise AttemptHung(str(exc)) from None
    except UpstreamTimeout as exc:
        # accepted and never answered: a hung engine looks so
        hung = f"no response head within {head_s:g} s" if head_s is not None else None
        raise AttemptTimedOut(f"{instance}: {type(exc).__name__}: {exc}", unhealthy=hung) from None
    except UpstreamLocalError as exc:  # our descriptors, not the engine: keep it healthy
        raise AttemptLocalFailure(f"{instance}: {exc}") from None
    except TransportError as exc:
        what = f"{type(exc).__name__}: {exc}"
        raise AttemptConnectFailed(
            f"{instance}: {what}", unhealthy=f"request failed: {what}"
        ) from None
    if resp.status_code >= 400:
        try:
            content = await life.watch.guard(resp.aread())
        except TransportError:
            content = b""
        finally:
            await resp.aclose()
        if resp.status_code >= 500 or resp.status_code == 429:  # busy or broken: next one
            busy = resp.status_code == 429
            raise (EngineBusy if busy else EngineServerError)(
                f"{instance} answered {resp.status_code}",
                (resp.status_code, content, dict(resp.headers)),
            )
        life.ended("client_error", instance)
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
            headers=life.routing_headers(instance),
        )
    attempt.response = resp
    if life.parsed.stream:
        return await stream(life, instance, resp, attempt, resume)
    if resp.headers.get("content-type", "").startswith("text/event-stream"):
        return await assemble(life, instance, resp)
    return await whole(life, instance, resp)
