"""Router: route() is a pure decision over the index and load view; the lifecycle calls
update load, predict-on-route entries, the policy's observations and the accounting."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from contracts.tiers import Tier
from router.blocks import chain_seed, hash_blocks, render_chat
from router.index import ARRAY, PrefixIndex
from router.load import LoadView
from router.policies.base import InstanceView, Outcome, Policy
from router.policies.registry import default_registry
from router.router import Router
from router.types import Decision, NoCandidateError, RouteRequest


class Clock:
    def __init__(self) -> None:
        self.t = 50.0

    def __call__(self) -> float:
        return self.t


class RecordingPolicy(Policy):
    """A real (if simple) policy: picks the candidate with most HBM blocks, records outcomes."""

    name = "recording"

    def __init__(self) -> None:
        self.seen: list[Sequence[InstanceView]] = []
        self.outcomes: list[Outcome] = []

    def choose(self, request: RouteRequest, candidates: Sequence[InstanceView]) -> Decision:
        self.seen.append(candidates)
        best = max(candidates, key=lambda v: v.matched_blocks.get(Tier.HBM, 0))
        return Decision(instance=best.id, policy=self.name, reason="most HBM")

    def observe(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)


def chat_request(text: str, session: str | None = None) -> RouteRequest:
    rendered = render_chat([{"role": "user", "content": text}])
    hashes = hash_blocks(rendered, seed=chain_seed("m"), block_chars=64)
    return RouteRequest("m", hashes, 16, len(rendered) // 4, session_key=session)


def make(policy_name: str = "prefix", clock: Clock | None = None) -> Router:
    c = clock or Clock()
    return Router(
        default_registry().create(policy_name),
        PrefixIndex(ttl_s=60.0, clock=c),
        LoadView(),
        clock=c,
    )


def test_empty_candidates_raise() -> None:
    with pytest.raises(NoCandidateError):
        make().route(chat_request("x" * 200), [])


def test_explain_is_a_dry_run_of_route() -> None:
    router = make("round_robin")
    r = chat_request("the tavern keeper " * 30)
    with pytest.raises(NoCandidateError):
        router.explain(r, [])
    explained = [router.explain(r, ["a", "b", "c"]).instance for _ in range(3)]
    assert explained == ["a", "a", "a"]  # the rotation did not move
    assert router.route(r, ["a", "b", "c"]).instance == "a"
    assert router.explain(r, ["a", "b", "c"]).instance == "b"
    # a policy without a preview is asked to choose: its choose changes nothing
    plain = Router(RecordingPolicy(), PrefixIndex(ttl_s=60.0), LoadView())
    assert plain.explain(r, ["a", "b"]).reason == "most HBM"


def test_route_is_pure_and_dispatch_predicts() -> None:
    router = make()
    r = chat_request("the world state " * 40)
    first = router.route(r, ["a", "b", "c"])
    assert router.route(r, ["a", "b", "c"]).instance == first.instance  # nothing changed
    assert len(router.index) == 0
    router.on_dispatch(r, first, first.instance)
    assert router.load.view(first.instance) == (1, r.prompt_tokens)
    assert router.index.blocks_held(first.instance) == len(r.block_hashes)
    # the same prompt again goes where its prefix now is, with its cached tokens predicted
    again = router.route(r, ["c", "b", "a"])
    assert again.instance == first.instance
    assert again.cached_tokens == len(r.block_hashes) * 16
    assert again.cached_tokens_by_tier == {"hbm": len(r.block_hashes) * 16}


def test_predictions_expire_on_the_router_clock() -> None:
    clock = Clock()
    router = make(clock=clock)
    r = chat_request("a long dialogue line " * 30)
    d = router.route(r, ["a", "b"])
    router.on_dispatch(r, d, "b")
    assert router.route(r, ["a", "b"]).instance == "b"
    clock.t += 61
    assert router.route(r, ["a", "b"]).cached_tokens == 0


def test_views_carry_load_matches_and_array() -> None:
    policy = RecordingPolicy()
    index = PrefixIndex()
    router = Router(policy, index, LoadView())
    r = chat_request("y" * 400)
    index.insert("a", r.block_hashes[:2], Tier.HOST)
    index.insert(ARRAY, r.block_hashes[:3])
    router.load.set_remote("b", 4)
    router.route(r, ["a", "b", "a"])
    views = {v.id: v for v in policy.seen[-1]}
    assert list(views) == ["a", "b"]
    assert views["a"].matched_blocks == {Tier.HOST: 2, Tier.ARRAY: 1}
    assert views["b"].matched_blocks == {Tier.ARRAY: 3}
    assert views["b"].in_flight == 4
    assert views["a"].cached_blocks_total == 2


def test_complete_feeds_policy_and_accounting() -> None:
    policy = RecordingPolicy()
    index = PrefixIndex()
    router = Router(policy, index, LoadView())
    r = chat_request("z" * 300, session="player-1")
    index.insert("a", r.block_hashes, Tier.HBM)
    d = Decision(
        instance="a",
        policy="recording",
        reason="test",
        cached_tokens=48,
        cached_tokens_by_tier={"hbm": 32, "array": 16},
    )
    router.on_dispatch(r, d, "a")
    # the prefill queue holds what is to compute: the prompt less the predicted 48 cached
    assert router.load.view("a") == (1, r.prompt_tokens - 48)
    router.on_first_token(r, d, "a", 0.2)
    assert router.load.view("a") == (1, 0)
    router.on_complete(r, d, "a", ttft_s=0.2, reported_cached_tokens=40, ok=True)
    assert router.load.view("a") == (0, 0)
    out = policy.outcomes[-1]
    assert out.predicted_cached_tokens == 48
    assert out.reported_cached_tokens == 40
    assert out.loaded_tokens_by_tier == {Tier.ARRAY: 16}
    stats = router.stats()
    assert stats["predicted_cached_tokens"] == 48
    assert stats["reported_cached_tokens"] == 40
    assert stats["routed_by_instance"] == {"a": 1}
    # a failover that failed before its first token
    router.on_dispatch(r, d, "b")
    router.on_complete(r, d, "b", ttft_s=None, reported_cached_tokens=None, ok=False)
    assert router.load.view("b") == (0, 0)
    assert router.stats()["failed"] == 1
    assert router.stats()["predicted_cached_tokens"] == 48  # a failed attempt predicts nothing
    assert router.stats()["completed"] == 2
    where = router.where("player-1")
    assert where["last_instance"] == "b"
    assert where["last_reason"] == "failover"
    assert where["instances"]["a"] == {"hbm": len(r.block_hashes) * 16}
    assert router.where("nobody")["known"] is False


def test_every_registered_policy_routes() -> None:
    names = default_registry().names()  # whatever is registered, ttft included
    assert {"round_robin", "least_load", "session", "prefix", "ttft"} <= set(names)
    for name in names:
        router = make(name)
        r = chat_request("hello " * 100, session="s")
        d = router.route(r, ["a", "b", "c"])
        assert d.instance in {"a", "b", "c"}
        assert set(d.fallbacks) == {"a", "b", "c"} - {d.instance}
        assert d.policy == name


def test_dispatch_tells_the_policy_what_the_request_computes_where() -> None:
    policy = default_registry().create("ttft", clock=lambda: 1.0)
    index = PrefixIndex()
    router = Router(policy, index, LoadView(), clock=lambda: 1.0)
    r = chat_request("z" * 3000, session="player-7")
    index.insert("a", r.block_hashes[:10], Tier.HBM)
    d = router.route(r, ["a", "b"])
    router.on_dispatch(r, d, "b")  # a fallback: nothing cached on b
    footprints = policy.footprints  # type: ignore[attr-defined]
    assert footprints.footprint("player-7") == ("b", r.prompt_tokens)
