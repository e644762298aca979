"""gateway.fleet.probe_plan: a join-probe prompt predicted to run past the budget is not sent."""

from __future__ import annotations

from gateway.fleet.probe_plan import MARGIN, fits, predicted_s
from router.policies.base import CalibrationSample


def test_before_any_sample_everything_is_sent() -> None:
    assert predicted_s([], 4096) is None
    assert fits([], 4096, elapsed_s=9.9, budget_s=10.0)


def test_the_largest_sample_scaled_linearly_with_the_margin_predicts() -> None:
    samples = [CalibrationSample(256, 0.5), CalibrationSample(1024, 2.0)]
    assert predicted_s(samples, 4096) == 2.0 * 4 * MARGIN
    assert not fits(samples, 4096, elapsed_s=2.6, budget_s=10.0)  # 2.6 + 12 > 10
    assert fits(samples, 4096, elapsed_s=2.6, budget_s=20.0)
    assert fits(samples, 512, elapsed_s=2.6, budget_s=10.0)  # 2.6 + 1.5


def test_a_sample_without_tokens_predicts_nothing() -> None:
    assert predicted_s([CalibrationSample(0, 1.0)], 100) is None
