"""PrefixIndex: leading runs by tier, the shared array, TTL'd predictions, capacity bounds,
removal, and (hypothesis) never a longer match than what was inserted. Every test runs
twice: with the block table a C BlockMap walked in C, and a dict walked in pure Python."""

from __future__ import annotations

from collections.abc import Iterator
from types import ModuleType

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from contracts.tiers import Tier
from router.index import ARRAY, PrefixIndex
from tests.unit.accel_impls import IMPLS, use_accel


@pytest.fixture(scope="module", params=IMPLS, autouse=True)
def accel_impl(request: pytest.FixtureRequest) -> Iterator[ModuleType]:
    yield from use_accel(request.param)


def test_block_table_follows_the_implementation(accel_impl: ModuleType) -> None:
    """The C implementation gives the index a BlockMap, the Python one a dict: every test
    here runs once on each table."""
    table = PrefixIndex()._blocks
    want = dict if accel_impl.IMPLEMENTATION == "python" else accel_impl.BlockMap
    assert type(table) is want


class FakeClockless:
    """Not a fake of our code: a plain settable time source."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_leading_run_by_tier_and_break_on_gap() -> None:
    idx = PrefixIndex()
    idx.insert("a", [1, 2, 3], Tier.HBM)
    idx.insert("a", [4, 5], Tier.HOST)
    idx.insert("a", [7], Tier.HBM)  # after a gap at 6: not part of the leading run
    idx.insert("b", [1], Tier.SNAPSHOT)
    m = idx.match([1, 2, 3, 4, 5, 6, 7], ["a", "b", "c"])
    assert m == {"a": {Tier.HBM: 3, Tier.HOST: 2}, "b": {Tier.SNAPSHOT: 1}, "c": {}}
    assert len(idx) == 7
    assert idx.blocks_held("a") == 6
    assert idx.blocks_held("b") == 1


def test_best_tier_wins_when_held_twice() -> None:
    idx = PrefixIndex()
    idx.insert("a", [1, 2], Tier.HOST)
    idx.insert("a", [1], Tier.HBM)
    assert idx.match([1, 2], ["a"]) == {"a": {Tier.HBM: 1, Tier.HOST: 1}}
    idx.remove("a", [1], Tier.HBM)
    assert idx.match([1, 2], ["a"]) == {"a": {Tier.HOST: 2}}
    assert len(idx) == 2


def test_array_counts_for_every_instance_unless_held_better() -> None:
    idx = PrefixIndex()
    idx.insert(ARRAY, [1, 2, 3])
    idx.insert("a", [1], Tier.HBM)
    idx.insert("b", [1, 2, 3, 4], Tier.SNAPSHOT)
    m = idx.match([1, 2, 3, 4], ["a", "b", "c"])
    assert m["a"] == {Tier.HBM: 1, Tier.ARRAY: 2}
    assert m["b"] == {Tier.ARRAY: 3, Tier.SNAPSHOT: 1}
    assert m["c"] == {Tier.ARRAY: 3}  # never seen before, still reads the array
    assert ARRAY not in idx.instances()


def test_wide_packed_values_over_many_instances() -> None:
    """20 instances: packed values are 100-bit ints, runs change value mid-chain."""
    idx = PrefixIndex()
    names = [f"i{k:02d}" for k in range(20)]
    chain = list(range(100, 160))
    for k, name in enumerate(names):  # instance k holds the first 60 - 2k blocks
        idx.insert(name, chain[: 60 - 2 * k], Tier.HBM if k % 2 else Tier.HOST)
    idx.insert(ARRAY, chain[:10])
    assert max(v for _, v in idx._blocks.items()).bit_length() > 64
    m = idx.match(chain, names)
    for k, name in enumerate(names):
        own = Tier.HBM if k % 2 else Tier.HOST
        want = {own: 60 - 2 * k}
        assert m[name] == want
    idx.remove(names[19], chain[:5])  # the last instance now reads them from the array
    assert idx.match(chain, names[19:])[names[19]] == {Tier.ARRAY: 5, Tier.HBM: 17}


def test_predictions_expire_after_ttl() -> None:
    clock = FakeClockless()
    idx = PrefixIndex(ttl_s=10.0, clock=clock)
    idx.insert("a", [1, 2, 3], Tier.HBM, predicted=True)
    clock.t += 9.0
    assert idx.match([1, 2, 3], ["a"]) == {"a": {Tier.HBM: 3}}
    clock.t += 1.0
    assert idx.match([1, 2, 3], ["a"]) == {"a": {}}
    assert len(idx) == 0
    assert idx.distinct_blocks() == 0


def test_refresh_extends_a_prediction() -> None:
    clock = FakeClockless()
    idx = PrefixIndex(ttl_s=10.0, clock=clock)
    idx.insert("a", [1, 2, 3], predicted=True)
    clock.t += 6.0
    idx.insert("a", [1, 2], predicted=True)  # block 3 not refreshed
    clock.t += 6.0
    assert idx.match([1, 2, 3], ["a"]) == {"a": {Tier.HBM: 2}}
    assert idx.predicted_held("a") == 2


def test_events_do_not_expire_and_survive_prediction_expiry() -> None:
    clock = FakeClockless()
    idx = PrefixIndex(ttl_s=10.0, clock=clock)
    idx.insert("a", [1, 2], Tier.HBM)
    idx.insert("a", [1, 2, 3], predicted=True)
    clock.t += 100.0
    idx.expire()
    assert idx.match([1, 2, 3], ["a"]) == {"a": {Tier.HBM: 2}}
    assert len(idx) == 2


def test_capacity_evicts_least_recent_chain_tail_first() -> None:
    clock = FakeClockless()
    idx = PrefixIndex(capacity_blocks=5, clock=clock)
    idx.insert("a", [1, 2, 3], predicted=True)
    clock.t += 1
    idx.insert("a", [10, 11, 12], predicted=True)
    assert idx.predicted_held("a") == 5
    # the older chain lost its tail, its head still matches
    assert idx.match([1, 2, 3], ["a"]) == {"a": {Tier.HBM: 2}}
    assert idx.match([10, 11, 12], ["a"]) == {"a": {Tier.HBM: 3}}
    # another instance has its own bound
    idx.insert("b", [1, 2, 3, 4, 5], predicted=True)
    assert idx.predicted_held("b") == 5
    assert len(idx) == 10


def test_remove_drops_prediction_and_clear_instance() -> None:
    idx = PrefixIndex()
    idx.insert("a", [1, 2, 3], predicted=True)
    idx.insert("b", [1, 2, 3], Tier.HOST)
    idx.remove("a", [2], Tier.HBM)
    assert idx.match([1, 2, 3], ["a", "b"]) == {"a": {Tier.HBM: 1}, "b": {Tier.HOST: 3}}
    idx.remove("b", [3])
    idx.clear_instance("a")
    assert idx.match([1, 2, 3], ["a", "b"]) == {"a": {}, "b": {Tier.HOST: 2}}
    assert len(idx) == 2
    assert idx.blocks_held("a") == 0
    idx.remove("nobody", [1])  # unknown instance: nothing happens


def test_clear_instance_of_some_tiers_keeps_the_others() -> None:
    """An engine and its tierd publish for one instance: clearing the engine's HBM (and
    its predictions) leaves the tierd's host blocks, and the counts stay right."""
    idx = PrefixIndex()
    idx.insert("a", [1, 2, 3], Tier.HBM)
    idx.insert("a", [1, 2, 3, 4], Tier.HOST)
    idx.insert("a", [5], predicted=True)
    idx.insert("a", [6], Tier.SNAPSHOT)
    idx.clear_instance("a", [Tier.HBM])
    assert idx.match([1, 2, 3, 4], ["a"]) == {"a": {Tier.HOST: 4}}
    assert idx.predicted_held("a") == 0
    assert idx.blocks_held("a") == len(idx) == 5
    idx.clear_instance("a", [Tier.HOST, Tier.SNAPSHOT])
    assert idx.match([1, 2, 3, 4], ["a"]) == {"a": {}}
    assert idx.blocks_held("a") == len(idx) == 0


tier_st = st.sampled_from(list(Tier))
inst_st = st.sampled_from(["a", "b", "c", ARRAY])
op_st = st.tuples(
    st.sampled_from(["insert", "predict", "remove", "clear"]),
    inst_st,
    st.lists(st.integers(0, 12), max_size=8),
    tier_st,
    st.booleans(),
)


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(op_st, max_size=30), query=st.lists(st.integers(0, 12), max_size=12))
def test_never_reports_more_than_inserted(
    ops: list[tuple[str, str, list[int], Tier, bool]], query: list[int]
) -> None:
    """Against a plain model of what is held: the reported run is exactly the model's."""
    idx = PrefixIndex(capacity_blocks=1 << 20)
    model: dict[str, dict[int, set[Tier]]] = {}
    for op, inst, hashes, tier, whole in ops:
        held = model.setdefault(inst, {})
        if op == "insert":
            idx.insert(inst, hashes, tier)
            for h in hashes:
                held.setdefault(h, set()).add(tier)
        elif op == "predict":
            idx.insert(inst, hashes, Tier.HBM, predicted=True)
            for h in hashes:
                held.setdefault(h, set()).add(Tier.HBM)
        elif op == "remove":
            idx.remove(inst, hashes, None if whole else tier)
            for h in hashes:
                tiers = held.get(h, set())
                if whole:
                    tiers.clear()
                else:
                    tiers.discard(tier)
                if not tiers:
                    held.pop(h, None)
        else:
            idx.clear_instance(inst)
            held.clear()
    names = ["a", "b", "c"]
    got = idx.match(query, names)
    array = model.get(ARRAY, {})
    for name in names:
        held = model.get(name, {})
        want: dict[Tier, int] = {}
        for h in query:
            tiers = set(held.get(h, set()))
            if h in array:
                tiers.add(Tier.ARRAY)
            if not tiers:
                break
            best = min(tiers)
            want[best] = want.get(best, 0) + 1
        assert got[name] == want
    assert len(idx) == sum(len(h) for h in model.values())


timed_op_st = st.tuples(
    st.sampled_from(["event", "predict", "remove", "advance"]),
    st.sampled_from(["a", "b"]),
    st.lists(st.integers(0, 10), max_size=6),
    st.integers(0, 7),
)


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(timed_op_st, max_size=30), query=st.lists(st.integers(0, 10), max_size=10))
def test_predictions_match_a_model_with_expiry(
    ops: list[tuple[str, str, list[int], int]], query: list[int]
) -> None:
    """Unbounded capacity: a block matches iff an event stored it or its latest prediction
    has not expired, and it was not removed since."""
    clock = FakeClockless()
    idx = PrefixIndex(ttl_s=5.0, clock=clock)
    durable: dict[str, set[int]] = {"a": set(), "b": set()}
    expiry: dict[str, dict[int, float]] = {"a": {}, "b": {}}
    for op, inst, hashes, dt in ops:
        if op == "event":
            idx.insert(inst, hashes, Tier.HBM)
            durable[inst].update(hashes)
        elif op == "predict":
            idx.insert(inst, hashes, Tier.HBM, predicted=True)
            for h in hashes:
                expiry[inst][h] = clock.t + 5.0
        elif op == "remove":
            idx.remove(inst, hashes, Tier.HBM)
            for h in hashes:
                durable[inst].discard(h)
                expiry[inst].pop(h, None)
        else:
            clock.t += dt
    got = idx.match(query, ["a", "b"])
    for inst in ("a", "b"):
        run = 0
        for h in query:
            if h in durable[inst] or expiry[inst].get(h, 0.0) > clock.t:
                run += 1
            else:
                break
        assert got[inst] == ({Tier.HBM: run} if run else {})


@settings(max_examples=200, deadline=None)
@given(
    chains=st.lists(st.lists(st.integers(0, 40), min_size=1, max_size=8), max_size=12),
    capacity=st.integers(1, 10),
    query=st.lists(st.integers(0, 40), max_size=8),
)
def test_capacity_bound_holds_and_never_overreports(
    chains: list[list[int]], capacity: int, query: list[int]
) -> None:
    idx = PrefixIndex(capacity_blocks=capacity)
    inserted: set[int] = set()
    for chain in chains:
        idx.insert("a", chain, predicted=True)
        inserted.update(chain)
        assert idx.predicted_held("a") <= capacity
        assert idx.blocks_held("a") == idx.predicted_held("a") == len(idx)
    run = idx.match(query, ["a"])["a"].get(Tier.HBM, 0)
    longest = 0
    for h in query:
        if h not in inserted:
            break
        longest += 1
    assert run <= longest
    if chains:  # the most recent chain always survives up to the capacity
        last = list(dict.fromkeys(chains[-1]))
        assert idx.match(last, ["a"])["a"].get(Tier.HBM, 0) == min(len(last), capacity)


def test_live_predictions_give_a_full_collection_nothing_to_walk() -> None:
    """Every routed request leaves a batch alive for a TTL: as tuples of atoms the GC stops
    tracking them, so a full collection costs the same however many are alive (as an object
    and an array each they were 540k tracked objects at 450 requests/s and 600 s)."""
    import gc
    import random

    index = PrefixIndex(ttl_s=1e9)
    rng = random.Random(3)
    gc.collect()
    before = len(gc.get_objects())
    for i in range(20_000):
        chain = [rng.getrandbits(64) for _ in range(4)]
        index.insert(f"i{i % 3}", chain, Tier.HBM, predicted=True, now=float(i))
    gc.collect()
    assert len(gc.get_objects()) - before < 100
    assert index.match(chain, ["i1"], now=1.0)["i1"] == {Tier.HBM: 4}  # the last, on i1
