"""OpenTelemetry traces of proxied requests, configured by the standard `OTEL_*` variables.

On as `contracts.otel` reads the variables; it needs the `otel` extra
(`pip install 'warmgate[otel]'`). Off, `Tracing` hands out one do-nothing `RequestTrace` and
the SDK is never imported.

The proxy calls it at few points, each request through one `RequestTrace`:
- `begin(scope_headers)` when the request arrives (the client's W3C `traceparent` is continued);
- `decided(routed, path)` opens the `request` span (from arrival) and records `decide` with its
  attributes: policy, chosen instance, predicted TTFT and cached tokens, candidates;
- `attempt(instance, n, headers)` opens an `upstream attempt` span and puts its `traceparent`
  in the engine's headers, so the engine's own spans join the trace; a failed attempt
  (`attempt_failed`) ends with its kind and the next one is a failover;
- `first_token(ttft_s)` is an event on the attempt; `finish(outcome, ok)` ends both spans.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol

from contracts.otel import tracer_provider, tracing_wanted


class _Decision(Protocol):  # router.types.Decision, as far as the span reads it
    @property
    def instance(self) -> str: ...
    @property
    def policy(self) -> str: ...
    @property
    def reason(self) -> str: ...
    @property
    def cached_tokens(self) -> int: ...
    @property
    def predicted_ttft_s(self) -> float | None: ...


class Routed(Protocol):  # gateway.pipeline.decide.Routed, as far as the span reads it
    @property
    def decision(self) -> _Decision: ...
    @property
    def candidates(self) -> Sequence[str]: ...
    @property
    def binding(self) -> str | None: ...


_TRACE_HEADERS = {b"traceparent": "traceparent", b"tracestate": "tracestate"}


class RequestTrace:
    """One request's spans; this base class records nothing (tracing off)."""

    __slots__ = ()

    def decided(self, routed: Routed, path: str) -> None:
        pass

    def attempt(self, instance: str, attempt: int, headers: dict[str, str]) -> None:
        pass

    def first_token(self, ttft_s: float) -> None:
        pass

    def attempt_failed(self, kind: str, message: str) -> None:
        pass

    def finish(self, outcome: str, *, ok: bool) -> None:
        pass


class Tracing:
    """The app's tracer (built with the app state): `enabled` only with the SDK configured."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        # `env` decides on or off (os.environ by default); the SDK reads its own from os.environ
        env = os.environ if env is None else env
        self._off = RequestTrace()
        self._sdk: _Sdk | None = _Sdk(env) if tracing_wanted(env) else None
        self.enabled = self._sdk is not None

    def begin(self, scope_headers: Iterable[tuple[bytes, bytes]]) -> RequestTrace:
        """The trace of a request that just arrived (its raw ASGI headers)."""
        if self._sdk is None:
            return self._off
        return self._sdk.begin(scope_headers)

    async def aclose(self) -> None:
        """Export what is left and stop (the SDK's shutdown blocks: off the loop)."""
        if self._sdk is not None:
            await asyncio.to_thread(self._sdk.shutdown)


class _Sdk:
    """The OpenTelemetry SDK's side, imported only when tracing is on."""

    def __init__(self, env: Mapping[str, str]) -> None:
        self.provider = tracer_provider(env, "warmgate", "'warmgate[otel]'")
        from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self.tracer = self.provider.get_tracer("warmgate.gateway")
        self.propagator = TraceContextTextMapPropagator()
        self.in_context = set_span_in_context
        self.server, self.client = SpanKind.SERVER, SpanKind.CLIENT
        self._status, self._failed = Status, StatusCode.ERROR

    def begin(self, scope_headers: Iterable[tuple[bytes, bytes]]) -> RequestTrace:
        carrier = {}
        for name, value in scope_headers:
            key = _TRACE_HEADERS.get(name)
            if key is not None:
                carrier[key] = value.decode("latin-1")
        parent = self.propagator.extract(carrier) if carrier else None
        return _LiveTrace(self, parent, time.time_ns())

    def error(self, message: str) -> Any:
        return self._status(self._failed, message)

    def shutdown(self) -> None:
        self.provider.shutdown()


class _LiveTrace(RequestTrace):
    __slots__ = ("_attempt", "_parent", "_request", "_sdk", "_started_ns")

    def __init__(self, sdk: _Sdk, parent: Any, started_ns: int) -> None:
        self._sdk = sdk
        self._parent = parent
        self._started_ns = started_ns
        self._request: Any = None
        self._attempt: Any = None

    def decided(self, routed: Routed, path: str) -> None:
        sdk = self._sdk
        tracer = sdk.tracer
        self._request = tracer.start_span(
            f"POST {path}",
            context=self._parent,
            kind=sdk.server,
            start_time=self._started_ns,
            attributes={"http.request.method": "POST", "http.route": path},
        )
        d = routed.decision
        attributes: dict[str, Any] = {
            "warmgate.policy": d.policy,
            "warmgate.instance": d.instance,
            "warmgate.reason": d.reason,
            "warmgate.predicted_cached_tokens": d.cached_tokens,
            "warmgate.candidates": list(routed.candidates),
        }
        if d.predicted_ttft_s is not None:
            attributes["warmgate.predicted_ttft_s"] = d.predicted_ttft_s
        if routed.binding is not None:
            attributes["warmgate.binding"] = routed.binding
        decide = tracer.start_span(
            "decide",
            context=sdk.in_context(self._request),
            start_time=self._started_ns,
            attributes=attributes,
        )
        decide.end()

    def attempt(self, instance: str, attempt: int, headers: dict[str, str]) -> None:
        sdk = self._sdk
        if self._request is None:
            return
        self._end_attempt(None)
        self._attempt = sdk.tracer.start_span(
            "upstream attempt",
            context=sdk.in_context(self._request),
            kind=sdk.client,
            attributes={
                "warmgate.instance": instance,
                "warmgate.attempt": attempt,
                "warmgate.failover": attempt > 0,
            },
        )
        headers.pop("tracestate", None)
        sdk.propagator.inject(headers, context=sdk.in_context(self._attempt))

    def first_token(self, ttft_s: float) -> None:
        if self._attempt is not None:
            self._attempt.add_event("first token", {"warmgate.ttft_s": ttft_s})

    def attempt_failed(self, kind: str, message: str) -> None:
        self._end_attempt((kind, message))

    def _end_attempt(self, error: tuple[str, str] | None) -> None:
        span, self._attempt = self._attempt, None
        if span is None:
            return
        if error is not None:
            span.set_attribute("warmgate.error_kind", error[0])
            span.set_status(self._sdk.error(error[1]))
        span.end()

    def finish(self, outcome: str, *, ok: bool) -> None:
        request, self._request = self._request, None
        if request is None:
            return
        self._end_attempt(None if ok else (outcome, outcome))
        request.set_attribute("warmgate.outcome", outcome)
        if not ok:
            request.set_status(self._sdk.error(outcome))
        request.end()
