"""Spans of tierd's lookup, load and save for the requests that carry a trace context.

vLLM hands the connector a request's W3C trace headers (`Request.trace_headers`) only when its
own tracing is on (`--otlp-traces-endpoint`); it then also puts the endpoint in the
environment of its engine processes, so `contracts.otel.tracing_wanted` is true here too. The
gateway's `upstream attempt` span is the parent in those headers: tierd's spans sit beside
vLLM's `llm_request` in the client's trace. Without trace headers (vLLM's tracing off, or a
request sent without one) nothing is recorded, at the cost of one attribute read.

Spans are recorded after the fact from times the connector takes anyway (`record`), so the
OpenTelemetry SDK is never on the copy path. Missing SDK: a warning, and no spans; the KV
work goes on.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any

from contracts.errors import ConfigurationError
from contracts.otel import tracer_provider, tracing_wanted

log = logging.getLogger("vllm.tierd.connector")
Carrier = dict[str, str]
EXTRA = "opentelemetry-sdk opentelemetry-exporter-otlp-proto-http (in the engine's environment)"


def now_ns() -> int:
    return time.time_ns()


class ConnectorTracing:
    """One per connector instance (scheduler or worker side)."""

    def __init__(self, side: str, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self._tracer: Any = None
        self._provider: Any = None
        if not tracing_wanted(env):
            return
        try:
            self._provider = tracer_provider(env, "tierd-connector", EXTRA)
        except ConfigurationError as exc:
            log.warning("tierd connector spans are off: %s", exc)
            return
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        self._propagator = TraceContextTextMapPropagator()
        self._tracer = self._provider.get_tracer("warmgate.tierd.connector")
        self._side = side

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def carrier_of(self, trace_headers: Mapping[str, str] | None) -> Carrier | None:
        """The headers to parent spans on (a plain dict: it travels to the workers in the
        step's metadata), or None when this request is not traced."""
        if self._tracer is None or not trace_headers:
            return None
        return dict(trace_headers)

    def record(
        self,
        name: str,
        carrier: Carrier | None,
        start_ns: int,
        end_ns: int,
        attributes: Mapping[str, Any],
        *,
        failed: bool = False,
    ) -> None:
        """One finished span under the request's trace."""
        if self._tracer is None or carrier is None:
            return
        span = self._tracer.start_span(
            name,
            context=self._propagator.extract(carrier),
            start_time=start_ns,
            attributes={"tierd.connector.side": self._side, **attributes},
        )
        if failed:
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, f"{name} failed"))
        span.end(end_time=end_ns)

    def load(
        self, carrier: Carrier | None, started_ns: int, mode: str, blocks: int, failed: int
    ) -> None:
        """A load of `blocks` that just ended, `failed` of them not loaded."""
        self.record(
            "tierd load",
            carrier,
            started_ns,
            now_ns(),
            {"tierd.load.mode": mode, "tierd.blocks": blocks, "tierd.failed_blocks": failed},
            failed=failed > 0,
        )

    def saves(
        self,
        traces: list[tuple[Carrier, int]],
        started_ns: int,
        mode: str,
        step_blocks: int,
        failed: bool,
    ) -> None:
        """Each traced request's part of a step's save that just copied its blocks out
        (the commit to tierd is one-way and follows): (carrier, its blocks) in `traces`."""
        ended = now_ns()
        for carrier, blocks in traces:
            self.record(
                "tierd save",
                carrier,
                started_ns,
                ended,
                {"tierd.save.mode": mode, "tierd.blocks": blocks, "tierd.step_blocks": step_blocks},
                failed=failed,
            )

    def shutdown(self) -> None:
        if self._provider is not None:
            self._provider.shutdown()  # exports what is left
