"""What a request picked by the endpoint picker did, reported to the router, metrics, stats
and its trace as the proxy's own requests are (gateway/pipeline/accounting.py): Envoy carries
the bytes, and shows the picker the response's headers and body on the same ext_proc stream.

The router's hooks keep calibration and the policies' learning going: `on_dispatch` at the
pick, `on_first_token` at the first token the picker sees in an event stream, `on_complete`
with the cached tokens the engine reported. When Envoy served the request from a fallback
(it names the endpoint that served), the first pick is closed as a failed attempt and the
fallback dispatched, as the proxy's failover does. `complete` counts once."""

from __future__ import annotations

import logging
import time
from typing import Any

from gateway.observe.metrics import GatewayMetrics
from gateway.observe.stats import GatewayStats
from gateway.observe.tracing import RequestTrace
from gateway.pipeline.parse import ParsedRequest
from gateway.upstream.sse import cached_tokens, prompt_tokens
from router.router import Router
from router.types import Decision, RouteRequest

log = logging.getLogger("warmgate.epp")


class PickOutcome:
    """One picked request, from the pick to the end of its response."""

    def __init__(
        self,
        router: Router,
        metrics: GatewayMetrics,
        stats: GatewayStats,
        trace: RequestTrace,
        parsed: ParsedRequest,
        rr: RouteRequest,
        decision: Decision,
        request_id: str,
        started: float,
    ) -> None:
        self.router, self.metrics, self.stats, self.trace = router, metrics, stats, trace
        self.parsed, self.rr, self.decision = parsed, rr, decision
        self.request_id = request_id
        self.started = started
        self.attempt_started = started
        self.instance = decision.instance
        self.attempts = 1
        self.ttft_s: float | None = None
        self.done = False
        router.on_dispatch(rr, decision, self.instance)
        metrics.in_flight.inc()

    def predicted_for(self, instance: str) -> int:
        if instance == self.decision.instance:
            return self.decision.cached_tokens
        for score in self.decision.candidates:
            if score.instance == instance:
                return sum(score.cached_tokens_by_tier.values())
        return 0

    def served_by(self, instance: str) -> None:
        """Envoy says `instance` served the request: a fallback when it is not the pick."""
        if instance == self.instance or self.done:
            return
        failed, self.instance = self.instance, instance
        message = f"the data plane served the request from {instance} instead"
        self.router.on_complete(
            self.rr, self.decision, failed, ttft_s=None, reported_cached_tokens=None, ok=False
        )
        self.trace.attempt_failed("failover", message)
        self.metrics.upstream_errors.labels(failed, "failover").inc()
        self.metrics.failovers.inc()
        log.info("%s: %s", failed, message, extra={"instance": failed})
        self.router.on_dispatch(self.rr, self.decision, instance)
        self.trace.attempt(instance, self.attempts, {})
        self.attempts += 1
        self.attempt_started = time.monotonic()

    def first_token(self) -> None:
        if self.ttft_s is None and not self.done:
            self.ttft_s = time.monotonic() - self.attempt_started
            self.router.on_first_token(self.rr, self.decision, self.instance, self.ttft_s)
            self.trace.first_token(self.ttft_s)

    def complete(self, outcome: str, *, ok: bool, usage: dict[str, Any] | None = None) -> None:
        """The response ended (ok, client_error, upstream_error, cancelled); once."""
        if self.done:
            return
        self.done = True
        self.trace.finish(outcome, ok=ok)
        reported = cached_tokens(usage)
        self.router.on_complete(
            self.rr,
            self.decision,
            self.instance,
            ttft_s=self.ttft_s,
            reported_cached_tokens=reported,
            ok=ok,
        )
        predicted = self.predicted_for(self.instance) if ok else 0
        duration = time.monotonic() - self.started
        m = self.metrics
        m.in_flight.dec()
        m.requests.labels(outcome).inc()
        m.duration.observe(duration)
        if self.ttft_s is not None:
            m.ttft.observe(self.ttft_s)
        if predicted:
            m.predicted_cached_tokens.inc(predicted)
        if reported:
            m.reported_cached_tokens.inc(reported)
        reported_prompt = prompt_tokens(usage)
        if reported_prompt:
            m.prompt_tokens.inc(reported_prompt)
        self.stats.record(
            outcome,
            duration_s=duration,
            ttft_s=self.ttft_s,
            predicted_cached=predicted,
            reported_cached=reported,
            reported_prompt=reported_prompt,
        )
        log.info(
            "epp %s %s -> %s %s",
            self.parsed.kind,
            self.parsed.model,
            self.instance,
            outcome,
            extra={
                "request_id": self.request_id,
                "instance": self.instance,
                "outcome": outcome,
                "session_key": self.parsed.session_key,
                "policy": self.decision.policy,
                "ttft_s": self.ttft_s,
                "predicted_cached_tokens": predicted,
                "reported_cached_tokens": reported,
            },
        )
