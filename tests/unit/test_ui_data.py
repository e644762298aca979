"""The operator page's data pieces: hot sessions/prefixes decay and stay bounded; engine
gauges are read from a Prometheus page as vLLM writes it."""

from __future__ import annotations

from gateway.admin.ui.engines import engine_entry, engine_figures, engine_sums
from gateway.admin.ui.hot import HotTracker
from gateway.engine.vllm import VLLM
from gateway.fleet.engine_load import EngineLoads, Veto
from router.types import CandidateScore, Decision, RouteRequest


def _rr(session: str, first: int, n: int = 5) -> RouteRequest:
    return RouteRequest("m", [first + i for i in range(n)], 16, 16 * n, session_key=session)


def test_hot_sessions_rank_by_recent_heat_and_stay_bounded() -> None:
    now = [0.0]
    hot = HotTracker(half_life_s=10.0, prefix_tokens=32, max_keys=4, clock=lambda: now[0])
    decision = Decision("a", "ttft", "r", 32, {"hbm": 32})
    for _ in range(5):
        hot.observe(_rr("old", 100), decision, "a")
    now[0] = 60.0  # six half-lives later: five old requests weigh less than one new
    hot.observe(_rr("new", 100), decision, "a")
    top = hot.top()
    assert [r["key"] for r in top["sessions"]] == ["new", "old"]
    assert top["prefixes"][0]["requests"] == 6 and top["prefixes"][0]["sessions"] == 2
    assert hot.predicted_by_tier == {"hbm": 6 * 32}
    for k in range(10):
        hot.observe(_rr(f"p{k}", 1000 * (k + 1)), decision, "a")
    assert len(hot.sessions) <= 4 and len(hot.prefixes) <= 4


def test_predicted_tiers_follow_the_instance_actually_used() -> None:
    hot = HotTracker()
    cand = CandidateScore("b", {"array": 64}, 0)
    decision = Decision("a", "ttft", "r", 32, {"hbm": 32}, candidates=(cand,))
    hot.observe(_rr("s", 1), decision, "b")  # a failover to b
    assert hot.predicted_by_tier == {"array": 64}


def test_engine_gauges() -> None:
    text = """# HELP vllm:kv_cache_usage_perc KV-cache usage.
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.5
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 1.0
vllm:num_requests_waiting{engine="0",model_name="m"} 2.0
vllm:prompt_tokens_total{engine="0",model_name="m"} 99.0
vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="device"} 64.0
vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="disk"} 32.0
"""
    assert engine_figures(VLLM.load(text)) == {
        "kv_usage": 0.5,
        "running": 4.0,
        "waiting": 2.0,
        "cached_by_source": {"device": 64.0, "disk": 32.0},
    }
    assert engine_figures(VLLM.load("")) == {}


def test_the_page_shows_the_routing_scrapes_last_good_figures_and_why_the_latest_failed() -> None:
    page = (
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5\n'
        'vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 9\n'
    )
    loads = EngineLoads(Veto())
    assert engine_entry(loads, "a") == {}  # not scraped yet
    assert engine_entry(None, "a") == {}  # engine_metrics off
    loads.update("a", VLLM.load(page))
    loads.update("b", VLLM.load(page))
    entry = engine_entry(loads, "a")
    assert entry["kv_usage"] == 0.5 and entry["error"] is None and entry["scraped_at"] > 0
    loads.update("a", None, "/metrics: ConnectError: refused")
    entry = engine_entry(loads, "a")
    assert entry["kv_usage"] == 0.5 and entry["error"] == "/metrics: ConnectError: refused"
    assert loads.overloaded("a") is None and "a" not in loads.loads  # routing forgets it
    assert engine_sums(loads, "prompt_by_source") == {"local_compute": 18.0}
    loads.forget("a")
    assert engine_entry(loads, "a") == {}
    assert engine_entry(loads, "c") == {}
    loads.update("c", None, "/metrics: 404")
    assert engine_entry(loads, "c") == {"error": "/metrics: 404"}


def test_hot_tables_stay_within_the_default_bound_for_any_number_of_keys() -> None:
    """Distinct sessions and prefixes without end (players come and go) fill each table
    to 2,000 keys at most (the page shows 10): the soak's gateway RSS reaches its steady
    state within minutes."""
    now = [0.0]
    hot = HotTracker(clock=lambda: now[0])
    decision = Decision("a", "ttft", "r", 32, {"hbm": 32})
    for k in range(6007):
        now[0] += 0.01
        hot.observe(_rr(f"player-{k}", 1000 * (k + 1), n=20), decision, "a")
    assert 0 < len(hot.sessions) <= 2_000 and 0 < len(hot.prefixes) <= 2_000
    assert hot.top(1)["sessions"][0]["key"] == "player-6006"  # the newest kept
