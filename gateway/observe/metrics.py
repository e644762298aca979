"""Prometheus metrics of one gateway app, on a registry of its own (two apps in one process
never share counters). Prefix `warmgate_`, base units, bounded labels only."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from gateway.observe.gc_pauses import GcPauses

# Seconds: from a few ms (warm, short prompt) to a minute (cold 100k-token prefill in a queue).
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 60)
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)


class GatewayMetrics:
    """Every metric the gateway exports."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.requests = Counter(
            "warmgate_requests",
            "Completion requests finished, by outcome "
            "(ok, client_error, upstream_error, unavailable, cancelled).",
            ["outcome"],
            registry=r,
        )
        self.ttft = Histogram(
            "warmgate_ttft_seconds",
            "Time from request arrival to the first content chunk (streamed requests).",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            "warmgate_request_duration_seconds",
            "Time from request arrival to the end of the response.",
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.upstream_errors = Counter(
            "warmgate_upstream_errors",
            "Failed upstream attempts, by instance and kind "
            "(connect, timeout, status_5xx, read, midstream).",
            ["instance", "kind"],
            registry=r,
        )
        self.continuations = Counter(
            "warmgate_continuations_total",
            "Streams continued on another instance after their engine failed mid-stream, "
            "by outcome (continued, impossible, failed).",
            ["outcome"],
            registry=r,
        )
        self.continuation_modes = Counter(
            "warmgate_continuation",
            "Streams continued, by how the next instance was asked to go on: token_ids (the "
            "prompt's and the sent tokens' ids) or text (the engine gave no ids, or the next "
            "instance refused a token-id prompt).",
            ["mode"],
            registry=r,
        )
        self.failovers = Counter(
            "warmgate_failovers",
            "Requests retried on a fallback instance after a failure before the first byte.",
            registry=r,
        )
        self.decisions = Counter(
            "warmgate_routing_decisions",
            "Routing decisions, by chosen instance and policy.",
            ["instance", "policy"],
            registry=r,
        )
        self.predicted_cached_tokens = Counter(
            "warmgate_predicted_cached_tokens",
            "Cached prompt tokens the router predicted on the instance that served the request.",
            registry=r,
        )
        self.reported_cached_tokens = Counter(
            "warmgate_reported_cached_tokens",
            "Cached prompt tokens the engines reported (usage.prompt_tokens_details).",
            registry=r,
        )
        self.prompt_tokens = Counter(
            "warmgate_prompt_tokens",
            "Prompt tokens the engines reported (usage.prompt_tokens).",
            registry=r,
        )
        self.instance_healthy = Gauge(
            "warmgate_instance_healthy",
            "1 when the instance is in the candidate set, else 0.",
            ["instance"],
            registry=r,
        )
        self.in_flight = Gauge(
            "warmgate_in_flight_requests",
            "Requests this gateway is proxying right now.",
            registry=r,
        )
        self.precise_tokenized = Counter(
            "warmgate_precise_tokenized",
            "Requests precise mode had tokens for, by source (local: the gateway's tokenizer; "
            "engine: an engine's /tokenize round trip; ids: the prompt was token ids).",
            ["source"],
            registry=r,
        )
        self.precise_fallbacks = Counter(
            "warmgate_precise_fallbacks",
            "Requests routed in approximate mode because precise mode could not tokenize them.",
            registry=r,
        )
        self.prefetch_hints = Counter(
            "warmgate_prefetch_hints",
            "Prefetch hints sent to tierd, by result (sent, failed).",
            ["result"],
            registry=r,
        )

        # read at scrape time, on the event loop that serves the scrape (a soak's leak check)
        self.event_loop_tasks = Gauge(
            "warmgate_event_loop_tasks", "asyncio tasks alive on the gateway's loop.", registry=r
        )
        self.event_loop_tasks.set_function(_task_count)
        self.gc_pauses = GcPauses(r)  # installed by the app's lifespan, for its lifetime

    def render(self) -> bytes:
        return generate_latest(self.registry)


def _task_count() -> float:
    try:
        return float(len(asyncio.all_tasks()))
    except RuntimeError:  # no running loop (a scrape from another thread)
        return float("nan")
