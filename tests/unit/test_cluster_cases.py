"""bench.cluster_cases: the issue-24 case set runs under a label and two labels compare, on
real `warmgate bench cluster` files (a one-minute game trace, so it takes seconds)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from bench import cluster_cases
from bench.cluster_cases import GAME, Case, compare, pick, ratios, summary

TINY = (Case("t", "tiny", (*GAME, "--seeds", "7-8", "--players", "12", "--minutes", "1")),)


def test_two_labels_run_and_compare_on_real_simulator_files(tmp_path: Path) -> None:
    assert cluster_cases.run(TINY, "a", tmp_path, [], jobs=1) == 0
    hard = ['ttft={"saturated_budget": "hard"}']
    assert cluster_cases.run(TINY, "b", tmp_path, hard, jobs=1) == 0
    for label in ("a", "b"):
        result = json.loads((tmp_path / f"t-{label}.json").read_text())
        assert sorted(result["per_seed"]) == ["7", "8"]
    b = json.loads((tmp_path / "t-b.json").read_text())
    assert b["config"]["policy_params"] == {"ttft": {"saturated_budget": "hard"}}
    table = compare(tmp_path, ["a", "b"], TINY)
    assert "| tiny (2) | a |" in table and "| tiny (2) | b |" in table
    assert table.count("\n| t | ") == 1
    # each case's median floor / prefix at p99 (a minute of 12 players queues nowhere: 1.00)
    assert re.search(r"\(1\.00; floor 1\.00\)", table)


def test_ratios_are_ttft_over_prefix_per_seed_and_the_counts_follow_the_targets() -> None:
    def pols(t: float, p: float) -> dict[str, dict[str, float]]:
        def one(x: float) -> dict[str, float]:
            return {"ttft_p50_s": x, "ttft_p90_s": 2 * x, "ttft_p99_s": 4 * x}

        return {"ttft": one(t), "prefix": one(p)}

    result = {"per_seed": {"1": {"policies": pols(1.1, 1.0)}, "2": {"policies": pols(0.5, 1.0)}}}
    rows = ratios(result)
    assert [r.seed for r in rows] == ["1", "2"]
    assert (rows[0].p50, rows[0].p90, rows[0].p99) == pytest.approx((1.1, 1.1, 1.1))
    s = summary(rows)
    assert s["p50_over_1"] == 1 and s["p99_over_0.8"] == 1 and s["p99_over_1"] == 1
    assert s["p50_geomean"] == pytest.approx((1.1 * 0.5) ** 0.5)
    assert ratios({"policies": pols(2.0, 1.0)})[0].seed == "-"  # a trace without seeds
    assert s["floor_p99_over_0.8"] == 0  # files from before the floor count none
    result["per_seed"]["1"]["ttft_floor"] = {"ttft_p99_s": 3.6}  # prefix's p99 is 4.0
    result["per_seed"]["2"]["ttft_floor"] = {"ttft_p99_s": 1.0}
    rows = ratios(result)
    assert [r.floor_p99 for r in rows] == pytest.approx([0.9, 0.25])
    assert summary(rows)["floor_p99_over_0.8"] == 1


def test_an_unknown_case_is_named_in_the_error() -> None:
    with pytest.raises(ValueError, match="unknown cases \\['zz'\\]"):
        pick("g,zz")
    assert [c.name for c in pick("g,m2")] == ["g", "m2"]
