"""bench.simfit_report: the error and ordering report of `bench simfit` (pure)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.simfit_report import (
    RealFigures,
    RealResultsError,
    errors,
    markdown,
    ordering,
    read_real,
    relative_error,
    within,
)


def fig(*repeats: tuple[float, float, float]) -> RealFigures:
    return RealFigures(tuple({"p50": a, "p90": b, "p99": c} for a, b, c in repeats))


def sim(a: float, b: float, c: float) -> dict[str, float]:
    return {"p50": a, "p90": b, "p99": c}


def test_the_error_is_simulated_over_real_median_less_one() -> None:
    real = {"g": fig((1.0, 2.0, 4.0), (3.0, 4.0, 8.0), (2.0, 3.0, 6.0))}
    errs = errors(real, {"g": sim(2.5, 3.0, 3.0)})
    assert errs["g"]["p50"]["real"] == 2.0
    assert errs["g"]["p50"]["error"] == pytest.approx(0.25)
    assert errs["g"]["p99"]["error"] == pytest.approx(-0.5)
    assert errs["g"]["p50"]["real_spread"] == 2.0
    assert within(errs, ("p50", "p90"), 0.25)
    assert not within(errs, ("p99",), 0.25)
    with pytest.raises(RealResultsError):
        relative_error(1.0, 0.0)


def test_a_pair_put_the_wrong_way_round_is_reversed_unless_the_real_spread_ties_it() -> None:
    real = {
        "fast": fig((1.0, 1.0, 1.0), (1.2, 1.2, 1.2)),
        "slow": fig((5.0, 5.0, 5.0), (5.2, 5.2, 5.2)),
        "noisy": fig((2.0, 2.0, 2.0), (9.0, 9.0, 9.0)),  # spread 7: ties with both
    }
    good = ordering(
        real, {"fast": sim(1, 1, 1), "slow": sim(4, 4, 4), "noisy": sim(9, 9, 9)}, "p50"
    )
    assert good.same and good.real_order == ["fast", "slow", "noisy"]
    verdicts = {(p.a, p.b): p.verdict for p in good.pairs}
    assert verdicts == {
        ("fast", "slow"): "same",
        ("fast", "noisy"): "tie",
        ("slow", "noisy"): "tie",
    }
    bad = ordering(real, {"fast": sim(3, 3, 3), "slow": sim(2, 2, 2), "noisy": sim(1, 1, 1)}, "p90")
    assert not bad.same and bad.reversed_pairs == 1
    assert "reversed: fast vs slow" in markdown(errors(real, {}), [bad], {})


def test_real_results_are_read_per_repeat_and_a_bad_file_is_named(tmp_path: Path) -> None:
    for k, p50 in enumerate((1.0, 3.0)):
        (tmp_path / f"r{k}.json").write_text(
            json.dumps(
                {
                    "gateways": {
                        "g": {
                            "ttft_p50_s": p50,
                            "ttft_p90_s": 2,
                            "ttft_p99_s": 3,
                            "cached_token_ratio": 0.5,
                        }
                    }
                }
            )
        )
    real = read_real([tmp_path / "r0.json", tmp_path / "r1.json"])
    assert real["g"].median("p50") == 2.0 and real["g"].cached_ratio == (0.5, 0.5)
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(RealResultsError, match=r"bad\.json"):
        read_real([tmp_path / "bad.json"])


def test_a_repeated_run_is_read_as_its_repeats_not_their_medians(tmp_path: Path) -> None:
    def row(p50: float) -> dict[str, float]:
        return {"ttft_p50_s": p50, "ttft_p90_s": 2, "ttft_p99_s": 3, "cached_token_ratio": 0.4}

    (tmp_path / "r.json").write_text(
        json.dumps({"gateways": {"g": row(2.0)}, "repeat_rows": [{"g": row(1.0)}, {"g": row(4.0)}]})
    )
    real = read_real([tmp_path / "r.json"])
    assert [r["p50"] for r in real["g"].repeats] == [1.0, 4.0]
    assert real["g"].spread("p50") == 3.0
