"""Each policy's algorithm on hand-built candidate views: exact thresholds, tie-breaks,
fallback order and the explanation it carries."""

from __future__ import annotations

from collections import Counter

import pytest

from contracts.errors import ConfigurationError
from contracts.tiers import Tier
from router.errors import PolicyConfigError
from router.policies.base import InstanceView
from router.policies.least_load import LeastLoadPolicy
from router.policies.prefix import PrefixPolicy
from router.policies.registry import default_registry
from router.policies.round_robin import RoundRobinPolicy
from router.policies.session import SessionPolicy
from router.types import RouteRequest


def req(blocks: int = 10, session: str | None = None) -> RouteRequest:
    return RouteRequest(
        model="m",
        block_hashes=list(range(blocks)),
        block_tokens=16,
        prompt_tokens=blocks * 16 + 5,
        session_key=session,
    )


def view(
    name: str,
    in_flight: int = 0,
    queued: int = 0,
    matched: dict[Tier, int] | None = None,
    total: int = 0,
) -> InstanceView:
    return InstanceView(name, in_flight, queued, matched or {}, total)


def test_registry_names_and_unknown() -> None:
    reg = default_registry()
    assert reg.names() == ["least_load", "prefix", "round_robin", "session", "ttft"]
    assert reg.create("prefix", cache_threshold=0.5).name == "prefix"
    assert reg.create("ttft").name == "ttft"  # imported lazily by its factory
    with pytest.raises(PolicyConfigError, match="unknown policy"):
        reg.create("nope")
    # in the project's tree, and still a ValueError (pydantic reports it from settings)
    assert issubclass(PolicyConfigError, ConfigurationError)
    assert issubclass(PolicyConfigError, ValueError)
    with pytest.raises(PolicyConfigError, match="fallback"):
        reg.create("prefix", fallback="nope")


def test_round_robin_rotates_with_fallbacks() -> None:
    p = RoundRobinPolicy()
    cands = [view("a"), view("b"), view("c")]
    picks = [p.choose(req(), cands) for _ in range(4)]
    assert [d.instance for d in picks] == ["a", "b", "c", "a"]
    assert picks[1].fallbacks == ("c", "a")
    assert picks[0].policy == "round_robin"


def test_round_robin_preview_does_not_advance() -> None:
    p = RoundRobinPolicy()
    cands = [view("a"), view("b"), view("c")]
    p.choose(req(), cands)
    assert [p.preview(req(), cands).instance for _ in range(3)] == ["b", "b", "b"]
    assert p.choose(req(), cands).instance == "b"


def test_least_load_ties_by_queued_tokens_then_order() -> None:
    p = LeastLoadPolicy()
    d = p.choose(req(), [view("a", 2), view("b", 1, 500), view("c", 1, 100), view("d", 1, 100)])
    assert d.instance == "c"
    assert d.fallbacks == ("d", "b", "a")


def test_prefix_best_match_above_threshold() -> None:
    p = PrefixPolicy()
    # 4 of 10 blocks = 0.4 > 0.3
    d = p.choose(req(10), [view("a", 0), view("b", 5, matched={Tier.HBM: 4})])
    assert d.instance == "b"
    assert "best match" in d.reason
    assert d.cached_tokens == 64
    assert d.cached_tokens_by_tier == {"hbm": 64}
    assert d.fallbacks == ("a",)
    assert {c.instance for c in d.candidates} == {"a", "b"}


def test_prefix_ties_among_best_matches_by_load_or_by_order() -> None:
    hit = {Tier.HBM: 6}
    both = [view("a", 3, matched=hit), view("b", 1, matched=hit), view("c", 0)]
    assert PrefixPolicy().choose(req(10), both).instance == "b"  # smg: the less loaded
    # sglang-router 0.3.2: the same tenant of the shared node every time, however loaded
    by_order = PrefixPolicy(tie_break="order")
    assert by_order.choose(req(10), both).instance == "a"
    deeper = [view("a", 3, matched=hit), view("b", 1, matched={Tier.HBM: 7})]
    assert by_order.choose(req(10), deeper).instance == "b"  # the deeper match still wins
    with pytest.raises(PolicyConfigError, match="tie_break"):
        PrefixPolicy(tie_break="random")


def test_prefix_at_threshold_goes_least_loaded() -> None:
    p = PrefixPolicy()
    # 3 of 10 = 0.3, not > 0.3
    d = p.choose(req(10), [view("a", 2), view("b", 5, matched={Tier.HBM: 3}), view("c", 1)])
    assert d.instance == "c"
    assert "least loaded" in d.reason
    small = PrefixPolicy(fallback="smallest_tree")
    d = small.choose(req(10), [view("a", 2, total=5), view("b", 0, matched={Tier.HBM: 3}, total=9)])
    assert d.instance == "a"
    assert "smallest tree" in d.reason


def test_prefix_imbalance_needs_both_thresholds() -> None:
    p = PrefixPolicy()
    hit = {Tier.HBM: 10}
    # abs: 65 > 64 and rel: 100 > 35 * 1.5 -> imbalanced, least loaded despite the match
    d = p.choose(req(10), [view("a", 100, matched=hit), view("b", 35)])
    assert d.instance == "b"
    assert "imbalanced" in d.reason
    # abs difference exactly 64: not imbalanced -> best match
    d = p.choose(req(10), [view("a", 100, matched=hit), view("b", 36)])
    assert d.instance == "a"
    # abs 70 > 64 but rel 220 > 150 * 1.5 = 225 is false -> not imbalanced
    d = p.choose(req(10), [view("a", 220, matched=hit), view("b", 150)])
    assert d.instance == "a"
    # thresholds are parameters
    d = PrefixPolicy(balance_abs_threshold=5, balance_rel_threshold=1.1).choose(
        req(10), [view("a", 10, matched=hit), view("b", 4)]
    )
    assert d.instance == "b"


def test_prefix_ignores_array_by_default() -> None:
    p = PrefixPolicy()
    d = p.choose(req(10), [view("a", 1, matched={Tier.ARRAY: 10}), view("b", 0)])
    assert d.instance == "b"
    d = PrefixPolicy(count_tiers=list(Tier)).choose(
        req(10), [view("a", 1, matched={Tier.ARRAY: 10}), view("b", 0)]
    )
    assert d.instance == "a"
    assert d.cached_tokens_by_tier == {"array": 160}


def test_session_is_sticky_and_spreads_keys() -> None:
    p = SessionPolicy()
    cands = [view(n) for n in "abcd"]
    homes = {k: p.choose(req(session=f"player-{k}"), cands).instance for k in range(400)}
    again = {k: p.choose(req(session=f"player-{k}"), cands).instance for k in range(400)}
    assert homes == again
    spread = Counter(homes.values())
    assert set(spread) == set("abcd")
    assert min(spread.values()) > 40  # 160 vnodes each: no instance starves


def test_session_consistent_when_an_instance_leaves() -> None:
    p = SessionPolicy()
    four = [view(n) for n in "abcd"]
    three = [view(n) for n in "abc"]
    for k in range(200):
        r = req(session=f"p{k}")
        before = p.choose(r, four).instance
        after = p.choose(r, three).instance
        if before != "d":
            assert after == before


def test_session_bounded_load_skips_overloaded_home() -> None:
    p = SessionPolicy(eps=0.25)
    r = req(session="player-7")
    home = p.choose(r, [view(n) for n in "ab"]).instance
    other = "b" if home == "a" else "a"
    # 10 in flight in all -> cap = ceil(11/2 * 1.25) = 7; home at 7 would need 8 > 7
    d = p.choose(r, [view(home, 7), view(other, 3)])
    assert d.instance == other
    assert d.fallbacks == (home,)
    d = p.choose(r, [view(home, 6), view(other, 4)])  # cap 7, home at 6 + 1 fits
    assert d.instance == home


def test_session_without_key_is_least_load() -> None:
    d = SessionPolicy().choose(req(), [view("a", 3), view("b", 1)])
    assert d.instance == "b"
