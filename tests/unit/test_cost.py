"""The TTFT cost model: its parts, tier loads hidden behind the queue, bandwidth updates,
online calibration converging toward what is observed, and the reuse price and rate meter
the ttft policy uses."""

from __future__ import annotations

import pytest

from router.cost import (
    ArrivalRate,
    CostParams,
    Prediction,
    ReuseBudget,
    TtftCostModel,
    fit_prefill,
)

P = CostParams()


def _predict(model: TtftCostModel, instance: str = "a", **kw: object) -> Prediction:
    args: dict[str, object] = dict(
        prompt_tokens=10_000, cached_tokens_by_tier={}, in_flight=0, queued_prefill_tokens=0
    )
    args.update(kw)
    return model.predict(instance, **args)  # type: ignore[arg-type]


def test_uncached_prefill_follows_the_profile() -> None:
    model = TtftCostModel(P)
    pred = _predict(model)
    expected = (
        P.prefill_overhead_s
        + P.prefill_per_token_s * 10_000
        + P.prefill_attention_s * 10_000 * 5_000
    )
    assert pred.queue_wait_s == 0.0 and pred.load_s == 0.0
    assert pred.prefill_s == pytest.approx(expected)
    assert pred.ttft_s == pytest.approx(expected)
    assert set(pred.parts()) == {"queue_wait_s", "load_s", "prefill_s", "slot_wait_s"}


def test_cached_tokens_cut_prefill_and_queue_adds_wait() -> None:
    model = TtftCostModel(P)
    cold = _predict(model)
    warm = _predict(model, cached_tokens_by_tier={"hbm": 9_000})
    assert warm.prefill_s < cold.prefill_s / 5
    queued = _predict(model, cached_tokens_by_tier={"hbm": 9_000}, queued_prefill_tokens=50_000)
    assert queued.queue_wait_s > 0.0
    assert queued.ttft_s == pytest.approx(queued.queue_wait_s + queued.prefill_s)
    busy = _predict(model, cached_tokens_by_tier={"hbm": 9_000}, in_flight=30)
    assert busy.prefill_s > warm.prefill_s  # decode steps share the prefill's steps


def test_tier_loads_cost_bytes_over_bandwidth_minus_what_the_queue_hides() -> None:
    model = TtftCostModel(P)
    pred = _predict(model, cached_tokens_by_tier={"array": 8_000})
    load = 8_000 * P.kv_bytes_per_token / P.bandwidths["array"]
    assert pred.load_s == pytest.approx(load)
    l2 = _predict(model, cached_tokens_by_tier={"host": 8_000})
    assert l2.load_s == pytest.approx(8_000 * P.kv_bytes_per_token / P.bandwidths["host"])
    # a prefetch started at routing time overlaps the queue wait
    hidden = _predict(model, cached_tokens_by_tier={"array": 8_000}, queued_prefill_tokens=40_000)
    assert hidden.load_s == pytest.approx(max(0.0, load - hidden.queue_wait_s))
    # measured bandwidths replace the defaults, per instance
    model.set_bandwidths("a", {"array": P.bandwidths["array"] / 4})
    slower = _predict(model, cached_tokens_by_tier={"array": 8_000})
    assert slower.load_s == pytest.approx(4 * load)
    assert _predict(model, "b", cached_tokens_by_tier={"array": 8_000}).load_s == pytest.approx(
        load
    )


@pytest.mark.parametrize("truth", [0.01, 100.0])
def test_an_engine_100x_off_the_prior_is_tracked_within_a_dozen_requests(truth: float) -> None:
    """No cap on the speed factor: 100x slower (a CPU engine) or faster than the prior,
    predictions are within 5% after 12 outcomes of mixed sizes."""
    model = TtftCostModel(P)
    errors = []
    for i in range(40):
        cached = (i * 997) % 8_000
        pred = _predict(model, cached_tokens_by_tier={"hbm": cached})
        observed = truth * pred.compute_s
        errors.append(abs(pred.ttft_s - observed) / observed)
        model.observe(
            "a", prompt_tokens=10_000, cached_tokens=cached, ttft_s=observed, prediction=pred
        )
    assert errors[0] > 0.9  # the prior was far off
    assert max(errors[12:]) < 0.05, [round(e, 3) for e in errors]
    assert model.speed_factor("a") == pytest.approx(truth, rel=0.01)


def test_the_default_prior_is_the_generic_one_it_states() -> None:
    """llm-d-inference-sim's 8B/H100 profile: 30 ms + 250 us per token, 12 ms a step."""
    assert (P.prefill_overhead_s, P.prefill_per_token_s, P.step_base_s) == (0.030, 250e-6, 0.012)


@pytest.mark.parametrize("truth", [0.5, 2.5])
def test_calibration_converges_toward_observed(truth: float) -> None:
    model = TtftCostModel(P)
    assert model.speed_factor("a") == 1.0
    errors = []
    for i in range(120):
        cached = (i * 997) % 8_000
        pred = _predict(model, cached_tokens_by_tier={"hbm": cached}, queued_prefill_tokens=i * 50)
        observed = truth * pred.compute_s  # an instance `truth` times slower than the profile
        errors.append(abs(pred.ttft_s - observed) / observed)
        model.observe(
            "a", prompt_tokens=10_000, cached_tokens=cached, ttft_s=observed, prediction=pred
        )
    assert model.speed_factor("a") == pytest.approx(truth, rel=0.05)
    assert errors[-1] < 0.05 < errors[0]
    # an instance never observed borrows the fleet's factor; observed ones keep their own
    assert model.speed_factor("other") == pytest.approx(model.speed_factor("a"))
    for i in range(120):
        pred = _predict(model, instance="b", cached_tokens_by_tier={"hbm": (i * 331) % 8_000})
        model.observe(
            "b", prompt_tokens=10_000, cached_tokens=0, ttft_s=1.0 * pred.compute_s,
            prediction=pred,
        )  # fmt: skip
    assert model.speed_factor("b") == pytest.approx(1.0, rel=0.05)
    assert model.speed_factor("a") == pytest.approx(truth, rel=0.05)


def test_outcomes_without_prediction_only_move_running_means() -> None:
    model = TtftCostModel(P)
    for _ in range(50):
        model.observe("a", prompt_tokens=1_000, cached_tokens=900, ttft_s=3.0, prediction=None)
    snap = model.snapshot()["a"]
    assert snap["speed_factor"] == 1.0
    assert snap["uncached_fraction"] < 0.2
    assert snap["mean_context_tokens"] == pytest.approx(1_000)


def test_reuse_price_rises_over_budget_and_falls_back() -> None:
    price = ReuseBudget(budget=0.01, step=0.05, price_max=3.0)
    for _ in range(400):
        price.update(lost_tokens=500, prompt_tokens=10_000)  # 5% given up
    assert price.price == pytest.approx(3.0)  # capped
    for _ in range(3_000):
        price.update(lost_tokens=0, prompt_tokens=10_000)
    assert price.price == 0.0
    assert price.lost_share < 0.01


def test_rate_meter_measures_arrivals_per_second() -> None:
    meter = ArrivalRate(window_s=10.0)
    assert meter.rate(0.0) == 0.0
    meter.tick(0.0)
    assert meter.rate(0.0) == 0.0  # one arrival is no rate yet
    meter = ArrivalRate(window_s=10.0)
    t = 0.0
    for _ in range(400):  # 4 per second for 100 s
        meter.tick(t)
        t += 0.25
    assert meter.rate(t) == pytest.approx(4.0, rel=0.1)
    assert meter.rate(t + 60.0) < 0.1  # decays when arrivals stop


def test_reuse_allowance_is_a_token_bucket() -> None:
    budget = ReuseBudget(budget=0.01, burst_prompts=2.0)
    assert not budget.permits(1)
    for _ in range(50):
        budget.refill(10_000)  # 100 tokens of allowance each, up to 2 prompts' worth
    assert budget.allowance == 5_000
    assert budget.permits(5_000) and not budget.permits(5_001)
    budget.update(lost_tokens=5_000, prompt_tokens=10_000)
    assert not budget.permits(1)
    budget.update(lost_tokens=50_000, prompt_tokens=10_000)  # forced moves: bounded debt
    assert budget.allowance == -20_000


@pytest.mark.parametrize("truth", [0.01, 0.3, 40.0])
def test_a_join_probe_prices_the_engine_before_any_routed_request(truth: float) -> None:
    """Three cold probe prompts at `truth` x the prior's speed: the first prediction after
    them is at that speed (the prior's weight is gone), where without them it is the
    prior's."""
    model = TtftCostModel(P)
    assert model.speed_factor("a") == 1.0
    sizes = (256, 1024, 4096)
    samples = [(n, truth * _predict(model, prompt_tokens=n).compute_s) for n in sizes]
    prior_cold = _predict(model, prompt_tokens=20_000).ttft_s
    model.calibrate("a", samples)
    assert _predict(model, prompt_tokens=20_000).ttft_s == pytest.approx(
        truth * prior_cold, rel=1e-6
    )
    # the probe leaves the routed requests' running means alone
    assert model.snapshot()["a"]["samples"] == 0.0


def test_a_probed_instance_keeps_learning_from_routed_outcomes() -> None:
    model = TtftCostModel(P, forgetting=0.9)
    model.calibrate("a", [(n, 2.0 * _predict(model, prompt_tokens=n).compute_s) for n in (512,)])
    assert model.speed_factor("a") == pytest.approx(2.0)
    for _ in range(40):  # the engine got 4x slower than the probe measured
        pred = _predict(model)
        model.observe(
            "a", prompt_tokens=10_000, cached_tokens=0, ttft_s=4.0 * pred.compute_s, prediction=pred
        )
    assert model.speed_factor("a") == pytest.approx(4.0, rel=0.05)


def test_probe_samples_without_a_time_are_ignored() -> None:
    model = TtftCostModel(P)
    model.calibrate("a", [(0, 1.0), (100, 0.0)])
    assert model.speed_factor("a") == 1.0


def test_the_probe_fits_the_instance_prefill_curve_not_only_its_scale() -> None:
    """A probed engine whose prefill shape differs from the prior's (less fixed cost, more
    attention): after three sizes its long prompts are priced on its own curve, which one
    scale factor on the prior's curve cannot do."""
    truth = CostParams(
        prefill_overhead_s=0.005, prefill_per_token_s=40e-6, prefill_attention_s=3e-9
    )
    curve = TtftCostModel(truth)

    def lone(n: int) -> float:
        return _predict(curve, prompt_tokens=n).ttft_s

    fitted = fit_prefill(P, [(n, lone(n)) for n in (256, 1024, 4096)])
    assert fitted is not None
    assert fitted.prefill_overhead_s == pytest.approx(0.005, rel=1e-6)
    assert fitted.prefill_per_token_s == pytest.approx(40e-6, rel=1e-6)
    assert fitted.prefill_attention_s == pytest.approx(3e-9, rel=1e-6)
    model = TtftCostModel(P)
    model.calibrate("a", [(n, lone(n)) for n in (256, 1024, 4096)])
    assert _predict(model, prompt_tokens=30_000).ttft_s == pytest.approx(lone(30_000), rel=1e-6)
    scaled = TtftCostModel(P)  # one size only: the scale, on the prior's shape
    scaled.calibrate("a", [(4096, lone(4096))])
    assert _predict(scaled, prompt_tokens=30_000).ttft_s != pytest.approx(lone(30_000), rel=0.05)


def test_a_prefill_fit_that_cannot_hold_falls_back() -> None:
    assert fit_prefill(P, [(1000, 0.1)]) is None  # one size: no curve
    # three sizes whose curvature is negative: two terms, the prior's attention ratio
    two = fit_prefill(P, [(256, 0.010), (1024, 0.040), (4096, 0.100)])
    assert two is not None and two.prefill_attention_s >= 0.0
    ratio = P.prefill_attention_s / P.prefill_per_token_s
    assert two.prefill_attention_s == pytest.approx(ratio * two.prefill_per_token_s)
    assert fit_prefill(P, [(256, 0.5), (4096, 0.1)]) is None  # faster when longer: nothing
