"""The ttft policy's guard (issue 24): while its own prediction error is high, or before it
has enough outcomes, it sends a request where `prefix` would; once the error is low it
makes its own choice; and it never adds more than `max_added_wait_s` of predicted wait over
prefix's choice (no unbounded deferral)."""

from __future__ import annotations

import math

import pytest

from contracts.tiers import Tier
from router.errors import PolicyConfigError
from router.policies.base import InstanceView, Outcome
from router.policies.prefix import PrefixPolicy
from router.policies.ttft import TtftPolicy
from router.policies.ttft_guard import GuardRule, UnearnedBand
from router.policies.ttft_records import Pending
from router.types import RouteRequest

BT = 64


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 0.5
        return self.t


def _req(blocks: int = 300) -> RouteRequest:
    return RouteRequest(
        model="m", block_hashes=list(range(blocks)), block_tokens=BT, prompt_tokens=blocks * BT
    )


def _view(name: str, *, l1: int = 0, in_flight: int = 0, queued: int = 0) -> InstanceView:
    return InstanceView(
        id=name,
        in_flight=in_flight,
        queued_prefill_tokens=queued,
        matched_blocks={Tier.HBM: l1} if l1 else {},
    )


# b holds the prompt but has a minute of prefill queued: prefix keeps the cache (b), ttft's
# scoring recomputes on the idle a
QUEUED = [_view("a"), _view("b", l1=280, in_flight=6, queued=600_000)]


def _observe(policy: TtftPolicy, times: int, *, off_by: float) -> None:
    """`times` outcomes on each instance, each `off_by` x what the policy predicted there."""
    for _ in range(times):
        d = policy.choose(_req(), QUEUED)
        assert isinstance(d.pending, Pending)
        for instance in ("a", "b"):
            policy.observe(
                Outcome(
                    instance=instance,
                    prompt_tokens=_req().prompt_tokens,
                    predicted_cached_tokens=d.pending.cached[instance],
                    ttft_s=d.pending.predictions[instance].ttft_s * off_by,
                    decision=d,
                )
            )


def test_the_scenario_splits_prefix_and_the_scoring() -> None:
    assert PrefixPolicy().choose(_req(), QUEUED).instance == "b"
    free = TtftPolicy(
        clock=Clock(), guard_rule="trust", trust_min_observations=0, max_added_wait_s=math.inf
    )
    assert free.choose(_req(), QUEUED).instance == "a"


@pytest.mark.parametrize("rule", ["trust", "robust"])
def test_follows_prefix_before_it_has_enough_outcomes(rule: GuardRule) -> None:
    policy = TtftPolicy(clock=Clock(), trust_min_observations=20, guard_rule=rule)
    assert policy.trust("a") == 0.0
    d = policy.choose(_req(), QUEUED)
    assert d.instance == "b"
    assert "guarded" in d.reason
    _observe(policy, 19, off_by=1.0)
    assert policy.trust("a") == 0.0  # one short
    assert policy.choose(_req(), QUEUED).instance == "b"


# b holds the prompt with 100k tokens of prefill queued: about 25 s predicted there against
# 5 s on the idle a, a gain of 5x, inside the robust rule's prior bands (e^2, about 7.4x)
MODEST = [_view("a"), _view("b", l1=280, in_flight=6, queued=100_000)]


def test_a_prior_band_follows_prefix_at_first_and_narrows_with_outcomes() -> None:
    policy = TtftPolicy(clock=Clock(), trust_min_observations=20, unearned_band="prior")
    assert policy.guard.band("a") == pytest.approx(1.0)  # the prior, nothing observed
    d = policy.choose(_req(), MODEST)
    assert d.instance == "b" and "guarded" in d.reason
    for _ in range(10):  # exact predictions, on both instances
        d = policy.choose(_req(), MODEST)
        assert isinstance(d.pending, Pending)
        for instance in ("a", "b"):
            predicted = d.pending.predictions[instance].ttft_s
            policy.observe(
                Outcome(
                    instance=instance,
                    prompt_tokens=_req().prompt_tokens,
                    predicted_cached_tokens=d.pending.cached[instance],
                    ttft_s=predicted,
                    decision=d,
                )
            )
    assert policy.guard.band("a") == pytest.approx(0.5)  # half way from the prior to 0
    assert policy.choose(_req(), MODEST).instance == "a"


@pytest.mark.parametrize("unearned", ["none", "prior"])
def test_an_instance_prefix_never_picks_can_be_chosen_only_with_a_prior_band(
    unearned: UnearnedBand,
) -> None:
    # prefix sends everything to b, so a never gets an outcome of its own; without a prior
    # band it stays unchoosable for good (two real engines with tierd: 106 of 129 on one)
    policy = TtftPolicy(clock=Clock(), trust_min_observations=20, unearned_band=unearned)
    for _ in range(30):
        d = policy.choose(_req(), QUEUED)
        assert isinstance(d.pending, Pending)
        policy.observe(
            Outcome(
                instance="b",
                prompt_tokens=_req().prompt_tokens,
                predicted_cached_tokens=d.pending.cached["b"],
                ttft_s=d.pending.predictions["b"].ttft_s * math.exp(0.2),
                decision=d,
            )
        )
    assert policy.guard.observed.get("a", 0) == 0
    assert policy.guard.band("b") == pytest.approx(0.2, abs=0.01)
    if unearned == "none":
        assert policy.guard.band("a") is None
        assert policy.choose(_req(), QUEUED).instance == "b"  # 151 s predicted against 5
        return
    # a borrows b's earned error as its band: 0.2, not the prior's 1.0
    assert policy.guard.band("a") == pytest.approx(policy.guard.band("b"))
    assert policy.choose(_req(), MODEST).instance == "a"
    assert policy.choose(_req(), QUEUED).instance == "a"


def test_a_fixed_band_never_borrows_another_instances_error() -> None:
    policy = TtftPolicy(clock=Clock(), trust_min_observations=20, unearned_band="fixed")
    assert policy.choose(_req(), MODEST).instance == "b"  # 5x: inside both priors' e^2
    for _ in range(20):
        policy.guard.record("b", observed_s=1.0, predicted_s=math.exp(-0.2))
    assert policy.guard.band("b") == pytest.approx(0.2)
    assert policy.guard.band("a") == pytest.approx(1.0)  # the prior, not b's 0.2
    borrowing = TtftPolicy(clock=Clock(), trust_min_observations=20, unearned_band="prior")
    for _ in range(20):
        borrowing.guard.record("b", observed_s=1.0, predicted_s=math.exp(-0.2))
    assert borrowing.guard.band("a") == pytest.approx(0.2)


def test_a_bad_prior_band_setting_is_refused() -> None:
    with pytest.raises(PolicyConfigError, match="prior_error"):
        TtftPolicy(prior_error=-0.1)
    with pytest.raises(PolicyConfigError, match="unearned_band"):
        TtftPolicy(unearned_band="always")  # type: ignore[arg-type]


@pytest.mark.parametrize("rule", ["trust", "robust"])
def test_switches_to_its_own_choice_once_its_error_is_low(rule: GuardRule) -> None:
    policy = TtftPolicy(clock=Clock(), trust_min_observations=20, guard_rule=rule)
    _observe(policy, 20, off_by=1.0)
    assert policy.trust("a") > 0.5 and policy.trust("b") > 0.5
    assert policy.choose(_req(), QUEUED).instance == "a"
    assert policy.stats()["guarded_decisions"] == 20  # the 20 decisions before it earned trust


def test_follows_prefix_while_its_error_is_high() -> None:
    policy = TtftPolicy(
        clock=Clock(), guard_rule="trust", trust_min_observations=20, trust_error=0.3
    )
    _observe(policy, 40, off_by=2.0)  # |log 2| = 0.69 > 0.3
    assert policy.trust("a") == 0.0
    assert policy.choose(_req(), QUEUED).instance == "b"


# a holds a third of the prompt (prefix's pick) with 12 streams there; the scoring sends it
# to the idle b for the streams it would stall, at ~1.6 s more predicted TTFT than a
STALLS = [_view("a", l1=100, in_flight=12), _view("b")]


def test_the_deferral_cap_bounds_the_wait_added_over_prefix() -> None:
    assert PrefixPolicy().choose(_req(), STALLS).instance == "a"
    trusted = {"trust_min_observations": 0, "guard_rule": "trust"}
    wide = TtftPolicy(clock=Clock(), max_added_wait_s=3.0, **trusted)  # type: ignore[arg-type]
    d = wide.choose(_req(), STALLS)
    assert d.instance == "b"
    assert isinstance(d.pending, Pending)
    added = d.pending.predictions["b"].ttft_s - d.pending.predictions["a"].ttft_s
    assert 1.0 < added < 3.0
    capped = TtftPolicy(clock=Clock(), max_added_wait_s=1.0, **trusted)  # type: ignore[arg-type]
    d = capped.choose(_req(), STALLS)
    assert d.instance == "a"
    assert "guarded" in d.reason


def test_the_robust_rule_never_adds_wait_to_the_request_itself() -> None:
    """The default rule: the scoring's b is 1-3 s slower for the request than prefix's a
    (it spares a's 12 streams); with exact predictions b is robustly better, but a
    deviation may add at most `robust_added_wait_s` (0) to the request's own TTFT."""
    trusted = {"trust_min_observations": 0}
    policy = TtftPolicy(clock=Clock(), **trusted)  # type: ignore[arg-type]
    assert policy.guard.rule == "robust"
    d = policy.choose(_req(), STALLS)
    assert d.instance == "a" and "guarded" in d.reason
    allowed = TtftPolicy(clock=Clock(), robust_added_wait_s=3.0, **trusted)  # type: ignore[arg-type]
    assert allowed.choose(_req(), STALLS).instance == "b"
    with pytest.raises(ValueError):
        TtftPolicy(robust_added_wait_s=-0.1)


def test_the_guard_is_typed_and_checked() -> None:
    with pytest.raises(ValueError):
        TtftPolicy(trust_error=0.0)
    with pytest.raises(ValueError):
        TtftPolicy(error_alpha=0.0)
    with pytest.raises(ValueError):
        TtftPolicy(max_added_wait_s=-1.0)


# b holds the prompt with 30k tokens queued (about 8 s predicted), a is idle and cold (about
# 5 s): the scoring prefers a by a margin that a prediction error of 0.3 can undo
CLOSE = [_view("a"), _view("b", l1=280, in_flight=6, queued=30_000)]


@pytest.mark.parametrize(("off_by", "expected"), [(1.0, "a"), (1.35, "b"), (0.74, "b")])
def test_the_robust_rule_deviates_only_when_the_error_band_cannot_undo_the_gain(
    off_by: float, expected: str
) -> None:
    """`guard_rule="robust"`: the policy leaves prefix's choice P for C only when C's score,
    its predicted TTFT made worse by C's error (x e^err), still beats P's score with P's
    made better (x e^-err); with exact predictions it takes a, with an error of 0.3 (either
    sign) it keeps prefix's b."""
    assert PrefixPolicy().choose(_req(), CLOSE).instance == "b"
    policy = TtftPolicy(clock=Clock(), guard_rule="robust", trust_min_observations=20)
    assert policy.choose(_req(), CLOSE).instance == "b"  # too few outcomes yet
    _observe(policy, 40, off_by=off_by)
    assert policy.choose(_req(), CLOSE).instance == expected


@pytest.mark.parametrize(("own_gain", "expected"), [(True, "a"), (False, "b")])
def test_a_robust_gain_of_the_request_itself_stands_against_a_price(
    own_gain: bool, expected: str
) -> None:
    """Predictions off by 0.3 on both: a is predicted 23 s, prefix's b 47 s, so even a's
    late end (x e^0.3) beats b's early end (x e^-0.3). a's score also carries about 5 s of KV it
    would push out of a full HBM, a price the error band does not widen: the score test
    alone keeps b; with `own_gain` (the default) a robust gain for the request and a
    lower score are enough."""
    views = [_view("a"), _view("b", l1=280, in_flight=6, queued=35_000)]
    assert PrefixPolicy().choose(_req(), views).instance == "b"
    policy = TtftPolicy(clock=Clock(), trust_min_observations=20, robust_own_gain=own_gain)
    _observe(policy, 40, off_by=1.35)
    # a's sessions hold 5,000 tokens; this prompt's 19,200 overflow 20,200 by 4,000, priced
    # at a's calibrated speed (the seconds its TTFT is predicted in)
    policy.set_kv_capacity("a", 20_200)
    policy.footprints.record("resident", "a", 5000, 1e9)
    d = policy.choose(_req(), views)
    assert d.instance == expected
    scores = {c.instance: c.score_terms for c in d.candidates}
    assert scores["a"]["kv_pushed_out_s"] > 4.0
    assert scores["a"]["score"] < scores["b"]["score"]
