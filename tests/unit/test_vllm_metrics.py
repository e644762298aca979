"""gateway.engine.vllm_metrics reads the series it needs from engine pages: quoted label values
are unescaped and may hold braces, a malformed line is skipped alone, series of other names (a
longer name with the same start) are not taken, and whatever prometheus_client writes it reads
back as prometheus_client's own parser does."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gateway.engine.base import EngineLoad
from gateway.engine.vllm_metrics import cache_config, parse_load, samples

PAGE = r"""# HELP vllm:num_requests_waiting Requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="a}b \"q\""} 2.0
vllm:num_requests_waiting{engine="1",model_name="a}b \"q\""} 3.0
vllm:num_requests_waiting_extra{engine="0"} 100.0
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{engine="0",source="local_compute"} 90.0
vllm:prompt_tokens_by_source_total{engine="0",source="local_cache_hit"} NaN
vllm:kv_cache_usage_perc{engine="0"} 0.5
vllm:cache_config_info{block_size="16",enable_prefix_caching="True",num_gpu_blocks="10",\
prefix_caching_hash_algo="xxhash_cbor"} 1.0
""".replace("\\\n", "")


def test_labels_are_unescaped_and_may_hold_braces() -> None:
    found = samples(PAGE, ["vllm:num_requests_waiting"])
    assert [(labels["model_name"], value) for _, labels, value in found] == [
        ('a}b "q"', 2.0),
        ('a}b "q"', 3.0),
    ]


def test_the_load_sums_ranks_and_drops_what_is_not_finite() -> None:
    load = parse_load(PAGE)
    assert (load.waiting, load.kv_usage) == (5.0, 0.5)
    assert load.prompt_tokens_by_source == {"local_compute": 90.0}
    config = cache_config(PAGE)
    assert config is not None and config.kv_capacity_tokens == 160
    assert config.hash_algo == "xxhash_cbor" and config.prefix_caching is True


def test_a_line_the_parser_refuses_is_skipped_alone() -> None:
    torn = PAGE.replace(
        'vllm:kv_cache_usage_perc{engine="0"} 0.5', 'vllm:kv_cache_usage_perc{engine="0'
    )
    load = parse_load(torn)
    assert (load.waiting, load.kv_usage) == (5.0, None)
    assert cache_config(torn) is not None
    assert cache_config("") is None and parse_load("garbage{") == EngineLoad()


_VALUES = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(10**12), 10**12)


@settings(max_examples=200, deadline=None)
@given(
    rows=st.lists(
        st.tuples(st.text(max_size=12), st.text(max_size=12), _VALUES),
        min_size=1,
        max_size=5,
        unique_by=lambda r: (r[0], r[1]),
    )
)
def test_what_prometheus_client_writes_reads_back_as_its_parser_reads_it(
    rows: list[tuple[str, str, float]],
) -> None:
    registry = CollectorRegistry()
    gauge = Gauge("vllm:num_requests_waiting", "w", ["engine", "model_name"], registry=registry)
    for engine, model, value in rows:
        gauge.labels(engine, model).set(value)
    page = generate_latest(registry).decode()

    def key(name: str, labels: dict[str, str], value: float) -> tuple[object, ...]:
        return name, sorted(labels.items()), "nan" if math.isnan(value) else value

    ours = sorted(key(*s) for s in samples(page, ["vllm:num_requests_waiting"]))
    theirs = sorted(
        key(s.name, s.labels, s.value)
        for family in text_string_to_metric_families(page)
        for s in family.samples
        if math.isfinite(s.value)
    )
    assert ours == theirs
