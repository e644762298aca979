"""One proxied request's bookkeeping: the router's lifecycle hooks (`on_first_token`,
`on_complete`), Prometheus metrics, admin stats and the request's log line. `complete()` is
idempotent, so every exit path (done, failed, cancelled) may call it safely."""

from __future__ import annotations

import logging
import time
from typing import Any

from gateway.observe.tracing import RequestTrace
from gateway.pipeline.parse import ParsedRequest
from gateway.state import AppState
from gateway.upstream.sse import SseRelay, cached_tokens, prompt_tokens
from router.types import Decision, RouteRequest

log = logging.getLogger("warmgate.request")


class RequestAccounting:
    """Accounting for one request across its attempts."""

    def __init__(
        self,
        state: AppState,
        parsed: ParsedRequest,
        route_request: RouteRequest,
        decision: Decision,
        started: float,
        request_id: str,
        trace: RequestTrace | None = None,
    ) -> None:
        self.state = state
        self.trace = trace if trace is not None else RequestTrace()  # its spans, when traced
        self.parsed = parsed
        self.rr = route_request
        self.decision = decision
        self.started = started
        # TTFT is timed from here: the request's arrival for the first attempt, the failure
        # of the previous one after a failover (an instance is judged on its own time only)
        self.attempt_started = started
        self.request_id = request_id
        self.ttft_s: float | None = None
        self.done = False

    def predicted_for(self, instance: str) -> int:
        """Cached tokens the router predicted on `instance` (all tiers)."""
        if instance == self.decision.instance:
            return self.decision.cached_tokens
        for score in self.decision.candidates:
            if score.instance == instance:
                return sum(score.cached_tokens_by_tier.values())
        return 0

    def routing_headers(self, instance: str) -> dict[str, str]:
        return {
            "x-warmgate-instance": instance,
            "x-warmgate-cached-tokens": str(self.predicted_for(instance)),
            "x-warmgate-policy": self.decision.policy,
        }

    def inspect(self, instance: str, relay: SseRelay, chunk: bytes) -> list[bytes]:
        """Feed upstream bytes to the relay; note TTFT at the first content chunk."""
        pieces = relay.feed(chunk)
        if relay.saw_content and self.ttft_s is None:
            self.ttft_s = time.monotonic() - self.attempt_started
            self.state.router.on_first_token(self.rr, self.decision, instance, self.ttft_s)
            self.trace.first_token(self.ttft_s)
        return pieces

    def attempt_failed(self, instance: str, kind: str, message: str) -> None:
        """An attempt failed before the client got a byte (a fallback may follow)."""
        self.state.router.on_complete(
            self.rr,
            self.decision,
            instance,
            ttft_s=self.ttft_s,  # set when it failed after its first token (assembled answers)
            reported_cached_tokens=None,
            ok=False,
        )
        self.trace.attempt_failed(kind, message)
        self.ttft_s = None  # the next attempt measures its own, from now
        self.attempt_started = time.monotonic()
        self.state.metrics.upstream_errors.labels(instance, kind).inc()
        log.warning(
            "attempt on %s failed (%s): %s",
            instance,
            kind,
            message,
            extra={"instance": instance, "kind": kind},
        )

    def midstream_error(self, instance: str, kind: str) -> None:
        self.state.metrics.upstream_errors.labels(instance, kind).inc()

    def complete(
        self, instance: str, outcome: str, *, ok: bool, usage: dict[str, Any] | None = None
    ) -> None:
        """The request ended on `instance` with `outcome` (ok, client_error, upstream_error,
        cancelled). Only the first call counts."""
        if self.done:
            return
        self.done = True
        self.trace.finish(outcome, ok=ok)
        reported = cached_tokens(usage)
        self.state.router.on_complete(
            self.rr,
            self.decision,
            instance,
            ttft_s=self.ttft_s,
            reported_cached_tokens=reported,
            ok=ok,
        )
        predicted = self.predicted_for(instance) if ok else 0
        self._record(outcome, predicted, reported, prompt_tokens(usage), instance)

    def finish_failed(self) -> None:
        """Every attempt failed before a byte reached the client."""
        if self.done:
            return
        self.done = True
        self.trace.finish("upstream_error", ok=False)
        self._record("upstream_error", 0, None, None, None)

    def _record(
        self,
        outcome: str,
        predicted: int,
        reported: int | None,
        reported_prompt: int | None,
        instance: str | None,
    ) -> None:
        m = self.state.metrics
        duration = time.monotonic() - self.started
        m.in_flight.dec()
        m.requests.labels(outcome).inc()
        m.duration.observe(duration)
        if self.ttft_s is not None:
            m.ttft.observe(self.ttft_s)
        if predicted:
            m.predicted_cached_tokens.inc(predicted)
        if reported:
            m.reported_cached_tokens.inc(reported)
        if reported_prompt:
            m.prompt_tokens.inc(reported_prompt)
        self.state.stats.record(
            outcome,
            duration_s=duration,
            ttft_s=self.ttft_s,
            predicted_cached=predicted,
            reported_cached=reported,
            reported_prompt=reported_prompt,
        )
        if not log.isEnabledFor(logging.INFO):
            return  # spare building the record's fields
        log.info(
            "%s %s -> %s %s",
            self.parsed.kind,
            self.parsed.model,
            instance,
            outcome,
            extra={
                "request_id": self.request_id,
                "instance": instance,
                "outcome": outcome,
                "stream": self.parsed.stream,
                "session_key": self.parsed.session_key,
                "policy": self.decision.policy,
                "reason": self.decision.reason,
                "ttft_s": self.ttft_s,
                "duration_s": round(duration, 6),
                "predicted_cached_tokens": predicted,
                "reported_cached_tokens": reported,
            },
        )
