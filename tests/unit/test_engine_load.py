"""gateway.fleet.engine_load: the engines' own load, the overload veto and their accounting."""

from __future__ import annotations

from gateway.engine.base import EngineLoad
from gateway.engine.vllm import VLLM
from gateway.fleet.engine_load import EngineLoads, Veto

PAGE = """
vllm:num_requests_running{engine="0",model_name="m"} 1.0
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 900.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_cache_hit"} 300.0
vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="device"} 300.0
"""


def test_the_page_parses() -> None:
    load = VLLM.load(PAGE)
    assert (load.waiting, load.running, load.kv_usage) == (3.0, 1.0, 0.25)
    assert load.prompt_tokens_by_source == {"local_compute": 900.0, "local_cache_hit": 300.0}
    assert load.cached_tokens_by_source == {"device": 300.0}


def test_an_overloaded_engine_is_vetoed_unless_all_are() -> None:
    loads = EngineLoads(Veto(waiting=3, kv_usage=0.9))
    loads.update("a", VLLM.load(PAGE))
    loads.update("b", EngineLoad(waiting=0.0, kv_usage=0.95))
    loads.update("c", EngineLoad(waiting=2.0, kv_usage=0.5))
    assert loads.overloaded("a") == "3 requests waiting (veto at 3)"
    assert loads.overloaded("b") == "KV cache 95% full (veto at 90%)"
    assert loads.filter(["a", "b", "c", "unknown"]) == ["c", "unknown"]
    assert loads.filter(["a", "b"]) == ["a", "b"]  # all overloaded: nothing vetoed
    loads.update("a", None)  # a failed scrape forgets: no stale veto
    assert loads.overloaded("a") is None


def test_reported_accounting_sums_the_engines() -> None:
    loads = EngineLoads(Veto())
    loads.update("a", VLLM.load(PAGE))
    loads.update("b", VLLM.load(PAGE))
    out = loads.reported()
    assert out["prompt_tokens_by_source"] == {"local_compute": 1800.0, "local_cache_hit": 600.0}
    assert out["cached_share"] == 0.25
