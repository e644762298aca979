"""What an ended request leaves behind: Prometheus metrics, admin stats and its log line.
Called once per request, by its lifecycle's close (gateway/pipeline/lifecycle.py)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from gateway.observe.metrics import GatewayMetrics
from gateway.observe.stats import GatewayStats
from gateway.pipeline.parse import ParsedRequest
from router.types import Decision

log = logging.getLogger("warmgate.request")


@dataclass(slots=True)
class Ended:
    """One request's end, as accounted."""

    outcome: str  # ok, client_error, upstream_error, cancelled, shed (a background wait)
    instance: str | None  # where it ended; None when every attempt failed
    duration_s: float
    ttft_s: float | None
    predicted: int  # cached tokens predicted on `instance` (0 unless ok)
    reported: int | None  # cached tokens the engine reported
    reported_prompt: int | None  # prompt tokens the engine reported


def record(
    metrics: GatewayMetrics,
    stats: GatewayStats,
    parsed: ParsedRequest,
    decision: Decision,
    request_id: str,
    end: Ended,
) -> None:
    m = metrics
    m.in_flight.dec()
    m.requests.labels(end.outcome).inc()
    m.duration.observe(end.duration_s)
    if end.ttft_s is not None:
        m.ttft.observe(end.ttft_s)
    if end.predicted:
        m.predicted_cached_tokens.inc(end.predicted)
    if end.reported:
        m.reported_cached_tokens.inc(end.reported)
    if end.reported_prompt:
        m.prompt_tokens.inc(end.reported_prompt)
    stats.record(
        end.outcome,
        duration_s=end.duration_s,
        ttft_s=end.ttft_s,
        predicted_cached=end.predicted,
        reported_cached=end.reported,
        reported_prompt=end.reported_prompt,
    )
    if not log.isEnabledFor(logging.INFO):
        return  # spare building the record's fields
    log.info(
        "%s %s -> %s %s",
        parsed.kind,
        parsed.model,
        end.instance,
        end.outcome,
        extra={
            "request_id": request_id,
            "instance": end.instance,
            "outcome": end.outcome,
            "stream": parsed.stream,
            "session_key": parsed.session_key,
            "policy": decision.policy,
            "reason": decision.reason,
            "ttft_s": end.ttft_s,
            "duration_s": round(end.duration_s, 6),
            "predicted_cached_tokens": end.predicted,
            "reported_cached_tokens": end.reported,
        },
    )
