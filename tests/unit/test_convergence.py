"""bench.convergence's request plan and its summary of predicted against observed TTFT."""

from __future__ import annotations

from bench.convergence import request_plan, summarize_rows


def test_plan_is_seeded_and_warm_requests_extend_earlier_ones() -> None:
    plan = request_plan(30, [100, 400], 0.5, seed=3)
    assert plan == request_plan(30, [100, 400], 0.5, seed=3)
    assert plan != request_plan(30, [100, 400], 0.5, seed=4)
    warm = 0
    for i, messages in enumerate(plan):
        earlier = [p for p in plan[:i] if messages[: len(p)] == p and len(messages) > len(p)]
        warm += bool(earlier)
        assert messages[-1]["role"] == "user"
    assert 5 <= warm <= 25  # about half, drawn


def test_summary_finds_where_the_error_settles() -> None:
    errs = [0.9, 0.8, 0.7, 0.5, 0.3, 0.2, 0.1, 0.1, 0.05, 0.1, 0.1, 0.2]
    rows = [{"rel_err": e, "k_after": float(i)} for i, e in enumerate(errs)]
    s = summarize_rows(rows, window=4)
    assert [w["requests"] for w in s["windows"]] == ["1-4", "5-8", "9-12"]
    assert s["windows"][0]["median_rel_err"] == 0.75
    assert s["windows"][-1]["k_after"] == 11.0
    # the trailing 4-request median: 0.25 at request 7 (not under), 0.15 at 8, under after it
    assert s["settled_after_requests"] == 8
    never = summarize_rows([{"rel_err": 0.9, "k_after": None}] * 6, window=3)
    assert never["settled_after_requests"] is None
