"""What a vLLM engine says about itself on `/metrics`, parsed by prometheus_client's
exposition-format parser (pure: no I/O here).

- `cache_config(text)` -> `EngineCacheConfig` from `vllm:cache_config_info`'s labels (block
  size, prefix-caching hash algorithm, KV capacity), or None when the page has none.
- `samples(text, names)` -> {(name, labels...): value} for the series asked for, e.g.
  `vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`,
  `vllm:prompt_tokens_by_source_total{source=...}`.
- `parse_load(text)` -> the gauges and counters the gateway's load view and accounting use
  (an `EngineLoad`), summed over vLLM's `engine` label (data-parallel ranks).

The records are engine-neutral (`gateway.engine.base`); `gateway.engine.vllm.VllmEngine` reads
pages through these functions, as the simulated engine's adapter does (it publishes the same
series).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping

from prometheus_client.parser import text_string_to_metric_families

from gateway.engine.base import EngineCacheConfig, EngineLoad, MetricNames

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = "vllm:kv_cache_usage_perc"
CACHE_CONFIG = "vllm:cache_config_info"
BY_SOURCE = "vllm:prompt_tokens_by_source_total"
CACHED_BY_SOURCE = "vllm:prompt_tokens_cached_by_source_total"
_LOAD_SERIES = (WAITING, RUNNING, KV_USAGE, BY_SOURCE, CACHED_BY_SOURCE)
NAMES = MetricNames(
    waiting=WAITING,
    running=RUNNING,
    kv_usage=KV_USAGE,
    cache_config=CACHE_CONFIG,
    prompt_tokens_by_source=BY_SOURCE,
    cached_tokens_by_source=CACHED_BY_SOURCE,
)


def _parsed(text: str, names: Iterable[str]) -> Iterator[tuple[str, dict[str, str], float]]:
    """The samples of the named series, parsed by prometheus_client's exposition parser.

    Only the lines of the wanted series are handed to it: a vLLM page is a thousand lines
    of histograms the gateway does not read, and parsing them all cost 62 ms a scrape here
    (against 0.3 ms). A page the parser refuses is parsed again line by line, and only the
    lines it refuses are skipped, as a scrape of a half-written page should be."""
    starts = tuple(f"{name}{end}" for name in names for end in ("{", " "))
    lines = [line for line in text.splitlines() if line.startswith(starts)]
    try:
        families = list(text_string_to_metric_families("\n".join(lines) + "\n"))
    except ValueError:
        families = []
        for line in lines:
            try:
                families += text_string_to_metric_families(line + "\n")
            except ValueError:
                continue
    for family in families:
        for sample in family.samples:
            yield sample.name, dict(sample.labels), float(sample.value)


def _int(labels: Mapping[str, str], key: str) -> int | None:
    try:
        value = int(labels[key])
    except (KeyError, ValueError):
        return None
    return value


def cache_config(text: str) -> EngineCacheConfig | None:
    """The engine's cache configuration from a Prometheus text page; None if not published."""
    for _name, labels, _value in _parsed(text, (CACHE_CONFIG,)):
        enabled = labels.get("enable_prefix_caching")
        return EngineCacheConfig(
            block_size=_int(labels, "block_size"),
            hash_algo=labels.get("prefix_caching_hash_algo") or None,
            prefix_caching=None if enabled is None else enabled.lower() == "true",
            num_gpu_blocks=_int(labels, "num_gpu_blocks"),
            labels=labels,
        )
    return None


def samples(text: str, names: Iterable[str]) -> list[tuple[str, dict[str, str], float]]:
    """Every sample of the named series: (name, labels, value); non-finite values dropped."""
    return [s for s in _parsed(text, set(names)) if math.isfinite(s[2])]


def parse_load(text: str) -> EngineLoad:
    """The load and prompt-token accounting of one page (an empty `EngineLoad` when the page
    has none of the series)."""
    waiting = running = kv = None
    by_source: dict[str, float] = {}
    cached: dict[str, float] = {}
    for name, labels, value in samples(text, _LOAD_SERIES):
        if name == WAITING:
            waiting = (waiting or 0.0) + value
        elif name == RUNNING:
            running = (running or 0.0) + value
        elif name == KV_USAGE:
            kv = value if kv is None else max(kv, value)
        elif name == BY_SOURCE:
            src = labels.get("source", "")
            by_source[src] = by_source.get(src, 0.0) + value
        else:
            src = labels.get("source", "")
            cached[src] = cached.get(src, 0.0) + value
    return EngineLoad(waiting, running, kv, by_source, cached)
