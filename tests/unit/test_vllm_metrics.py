"""gateway.engine.vllm_metrics reads engine pages with prometheus_client's exposition parser:
quoted label values are unescaped and may hold braces, a line it refuses is skipped alone,
and series of other names (a longer name with the same start) are not taken."""

from __future__ import annotations

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
