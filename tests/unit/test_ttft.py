"""The ttft policy: it goes where the prompt is cached when that is cheap, replicates when
the cached instance is overloaded, respects the load cap, breaks near-ties by session
affinity, weighs tier loads by bandwidth, explains itself and learns from outcomes."""

from __future__ import annotations

import math

import pytest

from contracts.tiers import Tier
from router.cost import CostParams, TtftCostModel
from router.errors import PolicyConfigError
from router.policies.base import CalibrationSample, InstanceView, Outcome
from router.policies.registry import default_registry
from router.policies.ttft import TtftPolicy
from router.types import Decision, RouteRequest

BT = 64


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 0.5
        return self.t


def _req(blocks: int = 300, session: str | None = None) -> RouteRequest:
    return RouteRequest(
        model="m",
        block_hashes=list(range(blocks)),
        block_tokens=BT,
        prompt_tokens=blocks * BT,
        session_key=session,
    )


def _view(
    name: str,
    *,
    l1: int = 0,
    array: int = 0,
    in_flight: int = 0,
    queued: int = 0,
) -> InstanceView:
    matched = {}
    if l1:
        matched[Tier.HBM] = l1
    if array:
        matched[Tier.ARRAY] = array
    return InstanceView(
        id=name,
        in_flight=in_flight,
        queued_prefill_tokens=queued,
        matched_blocks=matched,
    )


# the scoring on its own: the guard (trust earned from outcomes, the deferral cap over
# prefix's choice) is off here and pinned in test_ttft_guard.py
UNGUARDED: dict[str, object] = {
    "trust_min_observations": 0,
    "trust_error": math.inf,
    "max_added_wait_s": math.inf,
    "guard_rule": "trust",  # the rule that these three turn off
}


def _policy(**kw: object) -> TtftPolicy:
    return TtftPolicy(clock=Clock(), **{**UNGUARDED, **kw})  # type: ignore[arg-type]


def test_registered_under_its_name() -> None:
    policy = default_registry().create("ttft", clock=Clock())
    assert policy.name == "ttft"


def test_picks_the_cached_instance_when_that_is_cheap() -> None:
    policy = _policy()
    views = [_view("a"), _view("b", l1=280, in_flight=2, queued=2_000), _view("c")]
    d = policy.choose(_req(), views)
    assert d.instance == "b"
    assert d.cached_tokens == 280 * BT
    assert d.cached_tokens_by_tier == {"hbm": 280 * BT}
    scores = {c.instance: c for c in d.candidates}
    assert set(scores) == {"a", "b", "c"}
    for c in d.candidates:
        assert c.predicted_ttft_s is not None
        assert set(c.parts) == {"queue_wait_s", "load_s", "prefill_s", "slot_wait_s"}
        assert c.predicted_ttft_s >= c.parts["prefill_s"]
    assert scores["b"].predicted_ttft_s < scores["a"].predicted_ttft_s  # type: ignore[operator]
    assert d.predicted_ttft_s == scores["b"].predicted_ttft_s
    assert set(d.fallbacks) == {"a", "c"}


def test_replicates_when_the_cached_instance_is_overloaded() -> None:
    policy = _policy()
    # b holds the prefix but has a minute of prefill queued; recomputing elsewhere wins
    views = [_view("a"), _view("b", l1=280, in_flight=6, queued=600_000)]
    d = policy.choose(_req(), views)
    assert d.instance == "a"
    scores = {c.instance: c for c in d.candidates}
    assert scores["b"].parts["queue_wait_s"] > scores["a"].parts["prefill_s"]


def test_load_cap_keeps_a_hot_prefix_from_hot_spotting() -> None:
    policy = _policy(load_cap=2.0, load_cap_min=4)
    # everyone matches the hot world prefix on b, which already holds most requests
    views = [_view("a", in_flight=2), _view("b", l1=280, in_flight=40), _view("c", in_flight=3)]
    d = policy.choose(_req(), views)
    assert d.instance in {"a", "c"}
    assert "load cap" in d.reason
    assert d.fallbacks[-1] == "b"


def test_a_request_waits_for_a_running_slot_where_every_one_is_taken() -> None:
    """At max_num_seqs sequences in flight, a request waits for running ones to finish, at
    the instance's completion rate; the cached instance's full slot table sends it away,
    and a wait that is everywhere (no free slot anywhere) is not priced."""
    now = [0.0]
    policy = TtftPolicy(clock=lambda: now[0], max_num_seqs=4, **UNGUARDED)  # type: ignore[arg-type]
    views = [_view("a", l1=280, in_flight=5), _view("b", in_flight=1)]
    d = policy.choose(_req(), views)
    parts = {c.instance: c.parts for c in d.candidates}
    assert parts["b"]["slot_wait_s"] == 0.0
    # nothing finished on a yet: a slot frees at the floor of one a rate window (30 s)
    assert parts["a"]["slot_wait_s"] == pytest.approx(2 * 30.0)
    assert d.instance == "b"
    k_before = policy.model.speed_factor("a")
    for _ in range(200):  # a finishes one every 0.5 s, for 100 s
        decided = policy.choose(_req(), views)
        now[0] += 0.5
        policy.observe(Outcome("a", _req().prompt_tokens, 280 * BT, 0.1, decision=decided))
    # a TTFT shorter than the slot wait predicted says nothing of prefill speed
    assert policy.model.speed_factor("a") == k_before
    d = policy.choose(_req(), views)
    wait = {c.instance: c.parts["slot_wait_s"] for c in d.candidates}["a"]
    assert wait == pytest.approx(2 / 2.0, rel=0.05)  # two to finish, at 2 a second
    assert d.instance == "a"  # its cache now wins over a second's wait
    # every slot taken everywhere, under the cap, or no cap (the default): nothing priced
    everywhere = [_view("a", l1=280, in_flight=5), _view("b", in_flight=4)]
    for policy_, views_ in (
        (policy, everywhere),
        (TtftPolicy(clock=Clock(), max_num_seqs=6), views),
        (TtftPolicy(clock=Clock()), views),
    ):
        assert all(c.parts["slot_wait_s"] == 0.0 for c in policy_.choose(_req(), views_).candidates)
    with pytest.raises(PolicyConfigError, match="max_num_seqs"):
        TtftPolicy(max_num_seqs=0)


def test_near_ties_follow_the_session() -> None:
    policy = _policy()
    views = [_view(name) for name in "abcd"]
    chosen = {s: policy.choose(_req(session=s), views).instance for s in map(str, range(40))}
    again = {s: policy.choose(_req(session=s), views).instance for s in map(str, range(40))}
    assert chosen == again  # the same session lands on the same instance
    assert len(set(chosen.values())) >= 3  # different sessions spread out
    # without a session key, the tie goes to the instance holding more of the prompt
    views = [_view("a"), _view("b", l1=1), _view("c")]
    assert policy.choose(_req(), views).instance == "b"


def test_array_blocks_cost_their_load_time() -> None:
    policy = _policy()
    views = [_view("a", array=280), _view("b")]
    d = policy.choose(_req(), views)
    assert d.instance == "a"  # loading 280 blocks beats recomputing them
    assert d.cached_tokens_by_tier == {"array": 280 * BT}
    load = {c.instance: c.parts["load_s"] for c in d.candidates}["a"]
    policy.set_bandwidths("a", {"array": 1e6})  # a crawling array: recompute instead
    d2 = policy.choose(_req(), views)
    assert d2.instance == "b"
    assert {c.instance: c.parts["load_s"] for c in d2.candidates}["a"] > 100 * load


def test_observed_ttfts_calibrate_the_prediction() -> None:
    policy = _policy()
    views = [_view("a", l1=100)]
    before = policy.choose(_req(), views).predicted_ttft_s
    assert before is not None
    for _ in range(60):
        d = policy.choose(_req(), views)
        policy.on_dispatch(_req(), d, "a", 0)
        policy.observe(
            Outcome(
                instance="a",
                prompt_tokens=300 * BT,
                predicted_cached_tokens=d.cached_tokens,
                ttft_s=3.0 * before,  # this instance is three times slower than its profile
                decision=d,
            )
        )
    after = policy.choose(_req(), views).predicted_ttft_s
    assert after is not None
    assert abs(after - 3.0 * before) < 0.1 * before


def test_a_saturated_fleet_keeps_the_cache_when_a_move_gains_less_than_it_adds() -> None:
    policy = _policy()
    # every queue is longer than recomputing the prompt, and a's is shorter than b's by
    # less than twice the 280 blocks it would recompute (a predicted 0.4 s faster, its
    # recompute charged once more for those behind it slower): moving would only add work
    views = [
        _view("a", in_flight=6, queued=580_000),
        _view("b", l1=280, in_flight=6, queued=600_000),
    ]
    d = policy.choose(_req(), views)
    assert d.instance == "b"
    assert "saturated" in d.reason
    scores = {c.instance: c for c in d.candidates}
    assert scores["a"].predicted_ttft_s < scores["b"].predicted_ttft_s  # type: ignore[operator]


# saturated, but far apart: b holds the prompt behind twice a's queue (a burst on b)
BURST = [
    _view("a", in_flight=6, queued=300_000),
    _view("b", l1=280, in_flight=6, queued=600_000),
]


def test_a_saturated_fleet_leaves_a_long_queue_for_a_much_shorter_one() -> None:
    d = _policy().choose(_req(), BURST)
    assert d.instance == "a"
    assert "saturated" in d.reason


def test_a_saturated_move_pays_its_recompute_for_each_arrival_expected_behind_it() -> None:
    """Saturated, b holds half the prompt behind three times a's queue. With no arrivals to
    speak of the move to a wins more than twice its recompute and is made; with a stream of
    arrivals, every one that comes to a while the request waits there is delayed by the
    recompute too (not just one), and the cache stays on b."""
    views = [
        _view("a", in_flight=6, queued=100_000),
        _view("b", l1=140, in_flight=6, queued=300_000),
    ]
    assert _policy().choose(_req(), views).instance == "a"
    policy = _policy()
    empty = [InstanceView(id="a"), InstanceView(id="b")]
    for _ in range(10):  # arrivals two a second (the test clock steps 0.5 s a reading)
        d = policy.choose(_req(blocks=1), empty)
        policy.on_dispatch(_req(blocks=1), d, d.instance, BT)
    d = policy.choose(_req(), views)
    assert d.instance == "b"
    assert "saturated" in d.reason


def test_a_hard_saturated_budget_keeps_the_cache_whatever_the_queues() -> None:
    d = _policy(saturated_budget="hard").choose(_req(), BURST)
    assert d.instance == "b"
    with pytest.raises(PolicyConfigError, match="saturated_budget"):
        _policy(saturated_budget="soft")


def _fill(policy: TtftPolicy, instance: str, tokens: int, session: str = "resident") -> None:
    request = _req(blocks=1, session=session)
    policy.on_dispatch(request, Decision(instance, "ttft", "footprint"), instance, tokens)


def test_a_new_session_avoids_an_instance_whose_hbm_its_sessions_fill() -> None:
    # a holds the shared 20-block prefix (cheaper to start there) but its active sessions
    # already fill its 10k tokens of KV: starting there evicts KV someone will come back to
    views = [_view("a", l1=20), _view("b")]
    new_session = _req(blocks=47, session="player-new")
    blind = _policy()
    _fill(blind, "a", 10_000)
    assert blind.choose(new_session, views).instance == "a"
    aware = _policy(kv_capacity_tokens=10_000)
    _fill(aware, "a", 10_000)
    decision = aware.choose(new_session, views)
    assert decision.instance == "b"
    terms = {c.instance: c.score_terms for c in decision.candidates}
    # starting on a computes 47 - 20 blocks there, all of it pushed out of a full HBM
    assert terms["a"]["kv_pushed_out_s"] == pytest.approx(
        27 * BT * CostParams().prefill_per_token_s
    )
    assert terms["b"]["kv_pushed_out_s"] == 0.0
    assert terms["b"]["score"] < terms["a"]["score"]
    stats = aware.stats()
    assert stats["active_sessions"] == 1
    assert stats["working_set_tokens"] == {"a": 10_000}  # b holds no active session's KV


def test_capacity_is_free_while_the_working_set_fits() -> None:
    views = [_view("a", l1=20), _view("b")]
    policy = _policy(kv_capacity_tokens=100_000)
    _fill(policy, "a", 10_000)
    assert policy.choose(_req(blocks=47, session="p"), views).instance == "a"


def test_per_instance_capacity_overrides_the_default() -> None:
    views = [_view("a", l1=20), _view("b")]
    policy = _policy(kv_capacity_tokens=100_000)
    policy.set_kv_capacity("a", 10_000)  # a smaller GPU
    _fill(policy, "a", 10_000)
    assert policy.choose(_req(blocks=47, session="p"), views).instance == "b"


def test_a_follow_up_stays_with_its_kv_on_a_full_instance() -> None:
    # the session's own KV is on a: staying computes a few tokens, moving recomputes all
    policy = _policy(kv_capacity_tokens=20_000)
    _fill(policy, "a", 19_000, session="p")
    views = [_view("a", l1=290), _view("b")]
    assert policy.choose(_req(blocks=300, session="p"), views).instance == "a"


def test_cold_work_goes_where_fewer_streams_would_stall() -> None:
    # a holds a tenth of the prompt but 12 requests stream there; b is idle. The 270 uncached
    # blocks (~1.3 s of prefill) stall each of a's streams for that long: b is cheaper overall
    views = [_view("a", l1=30, in_flight=12), _view("b")]
    request = _req(blocks=300, session="raid-member")
    blind = _policy(stall_weight=0.0)
    assert blind.choose(request, views).instance == "a"
    decision = _policy().choose(request, views)
    assert decision.instance == "b"
    terms = {c.instance: c.score_terms for c in decision.candidates}
    work_a = terms["a"]["predicted_ttft_s"]  # no queue: its TTFT is its own GPU work
    assert terms["a"]["streams_stalled_s"] == pytest.approx(12 * work_a)
    assert terms["b"]["streams_stalled_s"] == 0.0


def test_stall_weight_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match="stall_weight"):
        _policy(stall_weight=-1.0)


def test_a_mostly_cached_prompt_pays_no_stall() -> None:
    # its KV decides where it goes: pricing the streams there would only move it off its KV
    views = [_view("a", l1=200, in_flight=12), _view("b", array=200)]
    decision = _policy().choose(_req(blocks=300, session="follow-up"), views)
    assert decision.instance == "a"
    assert all(c.score_terms["streams_stalled_s"] == 0.0 for c in decision.candidates)


def test_a_saturated_fleet_charges_no_stall() -> None:
    # every queue is longer than the prompt's own prefill: who streams when it runs is not
    # who is in flight now
    views = [_view("a", in_flight=12, queued=200_000), _view("b", in_flight=2, queued=250_000)]
    decision = _policy().choose(_req(blocks=300, session="late"), views)
    assert "fleet saturated" in decision.reason
    assert all(c.score_terms["streams_stalled_s"] == 0.0 for c in decision.candidates)


class SteppedClock:
    """Time that moves only when the test says so (a preview must not depend on calls)."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def _decisions(with_previews: bool) -> tuple[list[tuple[str, str, float]], dict[str, object]]:
    clock = SteppedClock()
    policy = TtftPolicy(clock=clock)
    seen: list[tuple[str, str, float]] = []
    for k in range(40):
        clock.t += 0.2
        # sessions come back to where their KV is, new ones arrive cold; queues move
        views = [
            _view("a", l1=(k * 7) % 300, in_flight=k % 9, queued=(k * 3001) % 40_000),
            _view("b", l1=(k * 11) % 300, array=20, in_flight=(k + 4) % 7, queued=9_000),
            _view("c", in_flight=k % 3, queued=(k * 977) % 60_000),
        ]
        request = _req(blocks=300, session=f"player-{k % 5}")
        if with_previews:
            previewed = [policy.preview(request, views) for _ in range(3)]
        decision = policy.choose(request, views)
        if with_previews:  # the preview is the decision choose went on to make
            assert {p.instance for p in previewed} == {decision.instance}
            assert previewed[0].reason == decision.reason
        seen.append((decision.instance, decision.reason, decision.predicted_ttft_s or 0.0))
        policy.on_dispatch(request, decision, decision.instance, 1000)
        policy.observe(
            Outcome(
                instance=decision.instance,
                prompt_tokens=request.prompt_tokens,
                predicted_cached_tokens=decision.cached_tokens,
                ttft_s=0.05 + 0.01 * (k % 4),
                decision=decision,
            )
        )
    return seen, policy.stats()


def test_preview_is_a_dry_run() -> None:
    # explain asks for previews: interleaving them changes no later decision and no state
    plain, plain_stats = _decisions(with_previews=False)
    previewed, previewed_stats = _decisions(with_previews=True)
    assert previewed == plain
    assert previewed_stats == plain_stats
    assert len({instance for instance, _, _ in plain}) > 1  # the sequence does make choices


def test_commits_at_dispatch_for_the_instance_used_and_pairs_outcomes_by_decision() -> None:
    """choose() changes nothing; the dispatch commits the reuse given up on the instance the
    request actually went to (a binding's redirect here); two decisions of equal sizes on one
    instance each calibrate against their own prediction."""
    policy = _policy()
    views = [_view("a", l1=280), _view("b")]
    request = _req()
    before = (policy.reuse.price, policy.reuse.lost_share, policy.stats())
    first = policy.choose(request, views)
    assert first.instance == "a"
    assert (policy.reuse.price, policy.reuse.lost_share, policy.stats()) == before
    policy.on_dispatch(request, first, "b", request.prompt_tokens)  # redirected to b
    assert policy.reuse.lost_share > 0  # a's cache was given up, as dispatched, not as chosen
    busier = [_view("a", l1=280), _view("b", in_flight=1, queued=request.prompt_tokens)]
    again = policy.choose(request, busier)
    policy.on_dispatch(request, again, "b", request.prompt_tokens)
    preds = [d.pending.predictions["b"] for d in (first, again)]  # type: ignore[attr-defined]
    assert preds[0] != preds[1]  # b was busier at the second
    reference = TtftCostModel(policy.model.params)
    for d, pred in ((again, preds[1]), (first, preds[0])):  # finishing out of order
        policy.observe(Outcome("b", request.prompt_tokens, 0, 0.5, decision=d))
        reference.observe("b", prompt_tokens=request.prompt_tokens, cached_tokens=0, ttft_s=0.5,
                          prediction=pred)  # fmt: skip
    assert policy.model.snapshot() == reference.snapshot()


def _probe(policy: TtftPolicy, name: str, speed: float) -> None:
    """The join probe of an engine `speed` times the prior's (its TTFT / the prior's)."""
    prior = TtftCostModel()
    samples = [
        CalibrationSample(n, speed * prior.predict(
            name, prompt_tokens=n, cached_tokens_by_tier={}, in_flight=0,
            queued_prefill_tokens=0,
        ).compute_s)
        for n in (256, 1024, 4096)
    ]  # fmt: skip
    policy.calibrate(name, samples)


def test_the_join_probe_prices_a_slow_instance_slow_before_any_outcome() -> None:
    """`calibrate` with the probe's cold TTFTs: b measured 20x slower than a is predicted
    20x slower for the first routed request, where unprobed both are the prior's."""
    policy = TtftPolicy(clock=Clock())
    views = [InstanceView(id="a"), InstanceView(id="b")]

    def predicted() -> dict[str, float]:
        d = policy.preview(_req(), views)
        return {c.instance: c.predicted_ttft_s or 0.0 for c in d.candidates}

    before = predicted()
    assert before["a"] == pytest.approx(before["b"])
    for name, speed in (("a", 0.3), ("b", 6.0)):
        _probe(policy, name, speed)
    after = predicted()
    assert after["b"] == pytest.approx(20 * after["a"], rel=1e-6)
    assert after["a"] == pytest.approx(0.3 * before["a"], rel=1e-6)


def test_the_reuse_price_is_charged_in_the_recomputing_instances_calibrated_seconds() -> None:
    """The reuse price is a multiple of the recompute time on the instance that would
    recompute, as calibrated: engines probed 5x faster than the prior are charged 5x less
    for the same tokens given up than the prior's own per-token time would say, the same
    seconds their TTFTs are predicted in."""
    policy = _policy()
    prior = TtftCostModel()
    for name in ("a", "b"):
        _probe(policy, name, 0.2)
    per_token = policy.model.recompute_s_per_token("b")
    assert per_token == pytest.approx(0.2 * prior.params.prefill_per_token_s, rel=1e-6)
    policy.reuse.price = 4.0
    d = policy.preview(_req(), [_view("a", l1=280), _view("b")])
    terms = {c.instance: c.score_terms for c in d.candidates}
    assert terms["a"]["reuse_price_s"] == 0.0
    assert terms["b"]["reuse_price_s"] == pytest.approx(4.0 * per_token * 280 * BT, rel=1e-6)
