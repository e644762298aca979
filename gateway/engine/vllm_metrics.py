"""What a vLLM engine says about itself on `/metrics`: the few series the gateway reads,
parsed from the Prometheus text format (pure: no I/O here).

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
import re
from collections.abc import Iterable, Iterator, Mapping
from urllib.parse import urlencode

from gateway.engine.base import EngineCacheConfig, EngineLoad, MetricNames

WAITING = "vllm:num_requests_waiting"
RUNNING = "vllm:num_requests_running"
KV_USAGE = "vllm:kv_cache_usage_perc"
CACHE_CONFIG = "vllm:cache_config_info"
BY_SOURCE = "vllm:prompt_tokens_by_source_total"
CACHED_BY_SOURCE = "vllm:prompt_tokens_cached_by_source_total"
LOAD_SERIES = (WAITING, RUNNING, KV_USAGE, BY_SOURCE, CACHED_BY_SOURCE)
NAMES = MetricNames(
    waiting=WAITING,
    running=RUNNING,
    kv_usage=KV_USAGE,
    cache_config=CACHE_CONFIG,
    prompt_tokens_by_source=BY_SOURCE,
    cached_tokens_by_source=CACHED_BY_SOURCE,
)


def _parsed(text: str, names: Iterable[str]) -> Iterator[tuple[str, dict[str, str], float]]:
    """The samples of the named series: `name{label="value",...} value [timestamp]` lines.

    Only the lines of the wanted series are read: a vLLM page is a thousand lines of
    histograms the gateway does not read (prometheus_client's parser over all of them cost
    62 ms a scrape here, over the wanted dozen 0.4 ms, this 0.05 ms). A line that is not a
    well-formed sample (a half-written page) is skipped, as the parser would refuse it."""
    starts = tuple(f"{name}{end}" for name in names for end in ("{", " "))
    for line in text.split("\n"):  # not splitlines(): a label value may hold \x1e or \x85
        line = line.removesuffix("\r")
        if line.startswith(starts) and (sample := _sample(line)) is not None:
            yield sample


# one label pair; the value's escapes (\\, \", \n) are undone by _unescape
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*(,|(?=\}))')
_ESCAPES = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    return re.sub(r"\\[\\\"n]", lambda m: _ESCAPES[m.group(0)], value)


def _sample(line: str) -> tuple[str, dict[str, str], float] | None:
    """One sample line, or None when it is not a well-formed one."""
    brace = line.find("{")
    labels: dict[str, str] = {}
    if brace < 0:
        name, _, rest = line.partition(" ")
    else:
        name, pos = line[:brace], brace + 1
        while line.startswith(" ", pos):
            pos += 1
        while not line.startswith("}", pos):
            m = _LABEL.match(line, pos)
            if m is None:
                return None
            labels[m.group(1)] = _unescape(m.group(2))
            pos = m.end()
            while line.startswith(" ", pos):
                pos += 1
        rest = line[pos + 1 :]
    fields = rest.split()
    if not 1 <= len(fields) <= 2:  # the value, and perhaps a timestamp
        return None
    try:
        value = float(fields[0])
    except ValueError:
        return None
    return name.strip(), labels, value


def restricted(path: str, names: Iterable[str]) -> str:
    """`path` asking for the named series alone: prometheus_client's `name[]` parameters.
    A server that ignores them sends its whole page."""
    return f"{path}?{urlencode([('name[]', name) for name in names])}"


# vLLM 0.32 serves `/metrics` twice: the exact path through prometheus-fastapi-instrumentator
# (the whole page, `name[]` ignored), anything below it through prometheus_client's own app
# (`name[]` honoured). The load scrape every 2 s asks the second for its series: 1.9 kB and
# 0.7-0.9 ms of the API server's CPU, on the engine's core, against 55 kB and 7-8 ms.
LOAD_PATH = restricted("/metrics/", LOAD_SERIES)


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
    for name, labels, value in samples(text, LOAD_SERIES):
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
