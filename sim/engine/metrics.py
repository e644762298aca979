"""Prometheus metrics under vLLM's names, in a registry owned by one engine app.

Counters and histograms are updated by the scheduler as things happen; the gauges
(running, waiting, KV usage) are read from the scheduler at scrape time by a collector, so
they are never stale. Labels follow vLLM: `model_name` (and `finished_reason` on finished
requests).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

# vLLM's buckets for time to first token and request latency
TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
LATENCY_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


class _GaugeCollector(Collector):
    def __init__(self, model: str, read: Callable[[], tuple[int, int, float]]):
        self._model = model
        self._read = read

    def collect(self) -> Iterable[Metric]:
        running, waiting, usage = self._read()
        for name, doc, value in (
            (
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                running,
            ),
            ("vllm:num_requests_waiting", "Number of requests waiting to be processed.", waiting),
            ("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", usage),
        ):
            family = GaugeMetricFamily(name, doc, labels=["model_name"])
            family.add_metric([self._model], float(value))
            yield family


class _CacheConfigCollector(Collector):
    """vLLM's `vllm:cache_config_info`: the KV cache's configuration as labels (value 1),
    from which a router can learn the block size and hash algorithm."""

    def __init__(self, labels: Mapping[str, str]):
        self._labels = dict(labels)

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=list(self._labels),
        )
        family.add_metric(list(self._labels.values()), 1.0)
        yield family


class EngineMetrics:
    def __init__(
        self,
        model: str,
        read_gauges: Callable[[], tuple[int, int, float]],
        cache_config: Mapping[str, str] | None = None,
    ):
        self.registry = CollectorRegistry(auto_describe=True)
        self.model = model
        labels = ["model_name"]
        reg = self.registry
        self._prefix_queries = Counter(
            "vllm:prefix_cache_queries", "Prefix cache queries, in tokens.", labels, registry=reg
        ).labels(model)
        self._prefix_hits = Counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in tokens.", labels, registry=reg
        ).labels(model)
        self._external_queries = Counter(
            "vllm:external_prefix_cache_queries",
            "External (KV connector) prefix cache queries, in tokens.",
            labels,
            registry=reg,
        ).labels(model)
        self._external_hits = Counter(
            "vllm:external_prefix_cache_hits",
            "External (KV connector) prefix cache hits, in tokens.",
            labels,
            registry=reg,
        ).labels(model)
        self._tier_loaded = Counter(
            "warmgate_sim_tier_loaded_tokens",
            "Prompt tokens loaded from a slower tier instead of computed, by tier.",
            [*labels, "tier"],
            registry=reg,
        )
        self._prompt_tokens = Counter(
            "vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=reg
        ).labels(model)
        self._generation_tokens = Counter(
            "vllm:generation_tokens", "Number of generation tokens processed.", labels, registry=reg
        ).labels(model)
        self._success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*labels, "finished_reason"],
            registry=reg,
        )
        self._ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            labels,
            buckets=TTFT_BUCKETS,
            registry=reg,
        ).labels(model)
        self._itl = Histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            labels,
            buckets=ITL_BUCKETS,
            registry=reg,
        ).labels(model)
        self._queue = Histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=reg,
        ).labels(model)
        self._e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            labels,
            buckets=LATENCY_BUCKETS,
            registry=reg,
        ).labels(model)
        reg.register(_GaugeCollector(model, read_gauges))
        if cache_config:
            reg.register(_CacheConfigCollector(cache_config))

    def on_admit(self, prompt_tokens: int, cached_tokens: int, external_tokens: int = 0) -> None:
        self._prefix_queries.inc(prompt_tokens)
        self._prefix_hits.inc(cached_tokens)
        self._prompt_tokens.inc(prompt_tokens)
        self._external_queries.inc(prompt_tokens - cached_tokens)
        self._external_hits.inc(external_tokens)

    def on_tier_load(self, tier: str, tokens: int) -> None:
        self._tier_loaded.labels(self.model, tier).inc(tokens)

    def on_first_token(self, ttft_s: float) -> None:
        self._ttft.observe(ttft_s)

    def on_tokens(self, n: int) -> None:
        self._generation_tokens.inc(n)

    def on_inter_token(self, seconds: float) -> None:
        self._itl.observe(seconds)

    def on_queued(self, seconds: float) -> None:
        self._queue.observe(seconds)

    def on_finish(self, finish_reason: str, e2e_s: float) -> None:
        self._success.labels(self.model, finish_reason).inc()
        self._e2e.observe(e2e_s)

    def render(self, names: list[str] | None = None) -> bytes:
        """The page; with `names`, only those series (their sample names)."""
        if names is None:
            return generate_latest(self.registry)
        return generate_latest(self.registry.restricted_registry(names))
