"""The back half of one proxied request, owned by one object (issue 20, step 2).

A `RequestLifecycle` is made once the request is routed and owns every effect of what
follows: attempts in flight per instance (`Inflight`, so a hung engine's are failed at
once), the router's hooks (`on_dispatch`, `on_first_token`, `on_complete`), the
instances' health (a failed connection, a hung head, a served answer), the request's
trace, metrics, admin stats and log line (gateway/pipeline/accounting.py), and the
client's side (`watch`: one task noticing a disconnect for the whole request). The proxy,
the relay and the continuation report events to it and touch none of those themselves.

Events only change what the request's end will be (`ended`); the end is reported by
`close()`, which its one owner calls once: the proxy for an answer it returns whole (or an
exception), the streamed response's cleanup for a stream. Until something else is said,
the end is "cancelled" on the instance of the attempt under way.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from starlette.types import Receive

from gateway.observe.tracing import RequestTrace
from gateway.pipeline.accounting import Ended, record
from gateway.pipeline.parse import ParsedRequest
from gateway.pipeline.prefill_gate import Slot
from gateway.state import AppState
from gateway.upstream.disconnect import ClientWatch
from gateway.upstream.inflight import Attempt
from gateway.upstream.sse import SseRelay, cached_tokens, prompt_tokens
from router.types import Decision, RouteRequest

log = logging.getLogger("warmgate.proxy")


class RequestLifecycle:
    """One request across its attempts and continuations, from routed to reported."""

    def __init__(
        self,
        state: AppState,
        receive: Receive,
        parsed: ParsedRequest,
        route_request: RouteRequest,
        decision: Decision,
        started: float,
        request_id: str,
        trace: RequestTrace,
    ) -> None:
        # the parts it acts on, not the whole state
        self._router = state.router
        self._health = state.health
        self._inflight = state.inflight
        self._metrics = state.metrics
        self._stats = state.stats
        self.timeouts = state.settings.timeouts
        self.watch = ClientWatch(receive)
        self.trace = trace
        self.parsed = parsed
        self.rr = route_request
        self.decision = decision
        self.started = started
        # TTFT is timed from here: the request's arrival for the first attempt, the failure
        # of the previous one after a failover (an instance is judged on its own time only)
        self.attempt_started = started
        self.request_id = request_id
        self.ttft_s: float | None = None
        # what close() reports, as the events left it
        self._outcome = "cancelled"
        self._instance: str | None = None
        self._usage: dict[str, Any] | None = None
        # a background request's prefill slot (gateway/pipeline/prefill_gate.py): freed at
        # its first token, when its attempt fails, or at the end
        self._prefill: Slot | None = None
        self._attempt: Attempt | None = None  # the latest begun: prefilling until its token
        self._metrics.in_flight.inc()

    # -- attempts -------------------------------------------------------------------------

    def dispatch(self, instance: str, attempt: int, headers: dict[str, str]) -> None:
        """Attempt number `attempt` (0: the decision's) goes to `instance`."""
        if attempt:
            self._metrics.failovers.inc()
            self._stats.failovers += 1
        self._router.on_dispatch(self.rr, self.decision, instance)
        self.trace.attempt(instance, attempt, headers)
        self._outcome, self._instance = "cancelled", instance  # until it says otherwise

    def hold_prefill(self, slot: Slot) -> None:
        """The attempt about to be sent holds `slot` until its first token."""
        self._prefill = slot

    def _prefill_done(self) -> None:
        if self._prefill is not None:
            self._prefill.release()
            self._prefill = None

    def begin(self, instance: str) -> Attempt:
        """A request is about to be sent to `instance` (an attempt or a continuation)."""
        self._attempt = self._inflight.begin(instance)
        return self._attempt

    def end(self, attempt: Attempt) -> None:
        """Its response is closed (safe to say twice)."""
        self._inflight.end(attempt)

    def inspect(self, instance: str, relay: SseRelay, chunk: bytes) -> list[bytes]:
        """Feed upstream bytes to the relay; note TTFT at the first content chunk."""
        pieces = relay.feed(chunk)
        attempt = self._attempt
        if attempt is not None and attempt.prefilling and relay.saw_content:
            self._inflight.prefilled(attempt)  # a continuation's too: warms may go on
        if self.ttft_s is None and relay.saw_content:
            self.ttft_s = time.monotonic() - self.attempt_started
            self._prefill_done()
            self._router.on_first_token(self.rr, self.decision, instance, self.ttft_s)
            self.trace.first_token(self.ttft_s)
        return pieces

    def attempt_failed(
        self, instance: str, kind: str, message: str, unhealthy: str | None = None
    ) -> None:
        """An attempt failed before the client got a byte (a fallback may follow);
        `unhealthy`: the engine's fault, for its health."""
        self._prefill_done()
        if unhealthy is not None:
            self._health.record_failure(instance, unhealthy)
        self._router.on_complete(
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
        self._instance = None  # reported to the router: the end is no longer its
        self._outcome = "upstream_error"
        self._metrics.upstream_errors.labels(instance, kind).inc()
        log.warning(
            "attempt on %s failed (%s): %s",
            instance,
            kind,
            message,
            extra={"instance": instance, "kind": kind},
        )

    def midstream_error(self, instance: str, kind: str) -> None:
        self._metrics.upstream_errors.labels(instance, kind).inc()

    def served(self, instance: str) -> None:
        """`instance` answered in full: good for its health."""
        self._health.record_served(instance)

    # -- continuations --------------------------------------------------------------------

    def candidates(self) -> list[str]:
        """Healthy instances serving the request's model."""
        return self._health.candidates_for(self.parsed.model)

    def continuation(self, result: str, mode: str | None = None) -> None:
        """A continuation `result`: continued (by `mode`), failed, impossible."""
        self._metrics.continuations.labels(result).inc()
        if mode is not None:
            self._metrics.continuation_modes.labels(mode).inc()

    # -- the end --------------------------------------------------------------------------

    def ended(
        self, outcome: str, instance: str | None, usage: dict[str, Any] | None = None
    ) -> None:
        """The request's end, as far as known: `outcome` (ok, client_error,
        upstream_error, cancelled, shed) on `instance`."""
        self._outcome, self._instance, self._usage = outcome, instance, usage

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

    def close(self) -> None:
        """Report the end: trace, router, metrics, stats, log. Called once, by the owner
        of the response (see the module's docstring)."""
        self.watch.stop()
        self._prefill_done()
        outcome, instance, usage = self._outcome, self._instance, self._usage
        ok = outcome == "ok"
        self.trace.finish(outcome, ok=ok)
        reported = cached_tokens(usage)
        if instance is not None:
            self._router.on_complete(
                self.rr,
                self.decision,
                instance,
                ttft_s=self.ttft_s,
                reported_cached_tokens=reported,
                ok=ok,
            )
        end = Ended(
            outcome,
            instance,
            time.monotonic() - self.started,
            self.ttft_s,
            self.predicted_for(instance) if ok and instance is not None else 0,
            reported,
            prompt_tokens(usage),
        )
        record(self._metrics, self._stats, self.parsed, self.decision, self.request_id, end)
