"""router.accel: the C extension `router._accel` and the pure-Python `router._accel_py` give
the same results (bit for bit, against the xxhash package and a plain model) and the same
errors; under CI=true the C one is what `router.accel` loads."""

from __future__ import annotations

import gc
import os
import random
import subprocess
import sys
import tracemalloc
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any, cast

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from router import accel
from tests.unit.accel_impls import IMPLS, accel_module
from tests.unit.native_impls import in_ci

U64_MAX = (1 << 64) - 1


@pytest.fixture(params=IMPLS)
def impl(request: pytest.FixtureRequest) -> ModuleType:
    return accel_module(request.param)


def both() -> tuple[ModuleType, ModuleType]:
    return accel_module("c"), accel_module("python")


def reference_chain(data: bytes, seed: int, block: int) -> list[int]:
    """The definition: h_i = xxh3_64(block_i, seed=h_{i-1}), full blocks only."""
    out: list[int] = []
    h = seed
    for i in range(len(data) // block):
        h = xxhash.xxh3_64_intdigest(data[i * block : (i + 1) * block], h)
        out.append(h)
    return out


def reference_runs(blocks: dict[int, int], hashes: Iterable[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for h in hashes:
        v = blocks.get(h, 0)
        if not v:
            break
        if runs and runs[-1][0] == v:
            runs[-1] = (v, runs[-1][1] + 1)
        else:
            runs.append((v, 1))
    return runs


# -- hash_blocks --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "block"),
    [
        (b"", 4),  # empty
        (b"abc", 4),  # shorter than a block
        (b"abcd", 4),  # exactly one
        (b"abcdefghij", 4),  # a trailing partial block
        (bytes(range(256)) * 9, 256),  # the router's block size, xxh3's long-input path
        (b"x" * 1000, 1),
        (b"y" * 500, 240),  # xxh3's mid-size / long boundary
        (b"y" * 500, 241),
    ],
)
@pytest.mark.parametrize("seed", [0, 1, 0x9E3779B97F4A7C15, U64_MAX])
def test_hash_blocks_matches_the_definition(
    impl: ModuleType, data: bytes, block: int, seed: int
) -> None:
    assert impl.hash_blocks(data, seed, block) == reference_chain(data, seed, block)


def test_hash_blocks_takes_any_bytes_like(impl: ModuleType) -> None:
    data = bytes(range(200))
    want = reference_chain(data, 7, 64)
    assert impl.hash_blocks(bytearray(data), 7, 64) == want
    assert impl.hash_blocks(memoryview(data), 7, 64) == want
    assert impl.hash_blocks(memoryview(b"__" + data)[2:], 7, 64) == want


@settings(max_examples=300, deadline=None)
@given(
    data=st.binary(max_size=1500),
    seed=st.one_of(st.sampled_from([0, U64_MAX]), st.integers(0, U64_MAX)),
    block=st.integers(1, 300),
)
def test_hash_blocks_c_and_python_identical(data: bytes, seed: int, block: int) -> None:
    c, py = both()
    got = c.hash_blocks(data, seed, block)
    assert got == py.hash_blocks(data, seed, block) == reference_chain(data, seed, block)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("text", 0, 4), TypeError),  # str is not bytes-like
        ((None, 0, 4), TypeError),
        ((b"abcd", 1.5, 4), TypeError),
        ((b"abcd", "1", 4), TypeError),
        ((b"abcd", 0, 4.0), TypeError),
        ((b"abcd", -1, 4), OverflowError),
        ((b"abcd", 1 << 64, 4), OverflowError),
        ((b"abcd", 0, 1 << 64), OverflowError),
        ((b"abcd", 0, 0), ValueError),
        ((b"abcd", 0, -4), ValueError),
        ((b"abcd", 0), TypeError),  # wrong number of arguments
    ],
)
def test_hash_blocks_bad_arguments(
    impl: ModuleType, args: tuple[object, ...], error: type[Exception]
) -> None:
    with pytest.raises(error):
        impl.hash_blocks(*args)


# -- lookup_runs --------------------------------------------------------------------------

WIDE = [1, 2, 31, 1 << 63, U64_MAX, 1 << 64, (1 << 90) | 5, (1 << 100) - 1]


def test_lookup_runs_groups_and_stops_at_a_miss(impl: ModuleType) -> None:
    blocks = {1: 5, 2: 5, 3: 7, 4: 5, 6: 9, 7: 0}
    assert impl.lookup_runs(blocks, [1, 2, 3, 4, 5, 6]) == [(5, 2), (7, 1), (5, 1)]
    assert impl.lookup_runs(blocks, [6, 7, 6]) == [(9, 1)]  # a 0 value ends it like a miss
    assert impl.lookup_runs(blocks, [5, 1]) == []
    assert impl.lookup_runs(blocks, []) == []
    assert impl.lookup_runs({}, [1, 2]) == []
    assert impl.lookup_runs(blocks, (1, 2, 3)) == [(5, 2), (7, 1)]  # tuple
    assert impl.lookup_runs(blocks, iter([1, 2, 3])) == [(5, 2), (7, 1)]  # any iterable
    assert impl.lookup_runs(blocks, [1] * 1000) == [(5, 1000)]


def test_lookup_runs_compares_wide_values_by_equality(impl: ModuleType) -> None:
    """Equal packed values that are distinct objects (not interned) still form one run."""
    wide = (1 << 90) | 5
    copies = [int(str(wide)) for _ in range(4)]
    assert copies[0] is not copies[1]
    blocks = {10 + k: v for k, v in enumerate(copies)}
    blocks[20] = U64_MAX
    blocks[21] = 1 << 64
    assert impl.lookup_runs(blocks, [10, 11, 12, 13, 20, 21, 99]) == [
        (wide, 4),
        (U64_MAX, 1),
        (1 << 64, 1),
    ]


@settings(max_examples=300, deadline=None)
@given(
    entries=st.dictionaries(
        st.integers(0, 30), st.one_of(st.sampled_from([*WIDE, 0]), st.integers(0, 1 << 100))
    ),
    hashes=st.lists(st.integers(0, 30), max_size=40),
    copy_values=st.booleans(),
)
def test_lookup_runs_c_and_python_identical(
    entries: dict[int, int], hashes: list[int], copy_values: bool
) -> None:
    if copy_values:  # break identity: only equality says two values are the same
        entries = {h: int(str(v)) for h, v in entries.items()}
    c, py = both()
    got = c.lookup_runs(entries, hashes)
    assert got == py.lookup_runs(entries, hashes) == reference_runs(entries, hashes)
    assert sum(n for _, n in got) <= len(hashes)


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (([], [1]), TypeError),  # blocks must be a dict (or a BlockMap, in C)
        (({1: 2}.items(), [1]), TypeError),
        (({1: 2}, 5), TypeError),  # hashes must be iterable
        (({1: 2}, [1, [2]]), TypeError),  # unhashable hash
        (({1: 2},), TypeError),  # wrong number of arguments
    ],
)
def test_lookup_runs_bad_arguments(
    impl: ModuleType, args: tuple[object, ...], error: type[Exception]
) -> None:
    with pytest.raises(error):
        impl.lookup_runs(*args)


# -- BlockMap (C only; the fallback's table is a dict) -------------------------------------

# BlockMap hashes a key with murmur3's 64-bit finalizer and takes the low bits as its home
# slot. Inverting that finalizer builds keys that share a home slot at every capacity up to
# 2**20, so the tests below really exercise long probe runs, wrap-around, growth and
# backward-shift deletion (test_colliding_keys_share_a_probe_run checks that they do).
_M1, _M2 = 0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53


def _xorshift33(x: int) -> int:
    return x ^ (x >> 33)  # its own inverse, since 33 >= 64 / 2


def _unmix(h: int) -> int:
    x = _xorshift33(h)
    x = _xorshift33(x * pow(_M2, -1, 1 << 64) % (1 << 64))
    return _xorshift33(x * pow(_M1, -1, 1 << 64) % (1 << 64))


def colliding_keys(home: int, count: int) -> list[int]:
    """`count` distinct keys whose home slot is `home & mask` in any table of up to 2**20
    slots (mask = capacity - 1)."""
    return [_unmix((j << 20) | home) for j in range(1, count + 1)]


def key_pool(rng: random.Random) -> list[int]:
    """Edge keys (0, 2**64 - 1), two collision clusters (the second wraps around the end of
    the table) and random u64s."""
    return [
        0,
        U64_MAX,
        *colliding_keys(5, 40),
        *colliding_keys((1 << 20) - 1, 40),
        *(rng.getrandbits(64) for _ in range(120)),
    ]


VALUES = [1, 7, U64_MAX, 1 << 64, (1 << 90) | 5, 0]


@pytest.fixture
def block_map() -> Callable[[], Any]:
    return cast("Callable[[], Any]", accel_module("c").BlockMap)


def assert_same(m: Any, model: dict[int, int]) -> None:
    assert len(m) == len(model)
    assert sorted(m.items()) == sorted(model.items())


def test_colliding_keys_share_a_probe_run(block_map: Callable[[], Any]) -> None:
    m = block_map()
    keys = colliding_keys(5, 20)
    for k in keys:
        m[k] = 1
    assert sorted(m._slot(k) for k in keys) == list(range(5, 25))
    wrapping = colliding_keys((1 << 20) - 1, 10)  # home: the last slot
    m = block_map()
    for k in wrapping:
        m[k] = 1
    slots = sorted(m._slot(k) for k in wrapping)
    assert slots[:9] == list(range(9))  # ran over the end into slot 0 on
    assert slots[9] > 9
    assert m._slot(12345) == -1


def run_ops(m: Any, model: dict[int, int], rng: random.Random, keys: list[int], n: int) -> None:
    """n random operations on m and on a dict, comparing every answer."""
    for step in range(n):
        k = rng.choice(keys)
        op = rng.randrange(10)
        if op <= 2:
            v = int(str(rng.choice(VALUES)))  # equal values, distinct objects
            m[k] = v
            model[k] = v
        elif op == 3:
            assert m.get(k) == model.get(k)
        elif op == 4:
            assert m.get(k, -1) == model.get(k, -1)
        elif op == 5:
            assert m.pop(k, None) == model.pop(k, None)
        elif op == 6:
            if k in model:
                assert m.pop(k) == model.pop(k)
            else:
                with pytest.raises(KeyError):
                    m.pop(k)
        elif op == 7:
            assert (k in m) == (k in model)
            if k in model:
                assert m[k] == model[k]
                if rng.random() < 0.5:
                    del m[k]
                    del model[k]
            else:
                with pytest.raises(KeyError):
                    m[k]
                with pytest.raises(KeyError):
                    del m[k]
        elif op == 8:
            assert len(m) == len(model)
        elif step % 50 == 0:
            assert_same(m, model)
    assert_same(m, model)
    for k in keys:
        assert m.get(k) == model.get(k)


@pytest.mark.parametrize("seed", range(6))
def test_block_map_behaves_like_a_dict(block_map: Callable[[], Any], seed: int) -> None:
    rng = random.Random(seed)
    keys = key_pool(rng)
    m, model = block_map(), {}
    run_ops(m, model, rng, keys, 6000)
    # grow through many doublings (every key of a cluster probes from one home slot), then
    # empty it in random order: backward shift must keep every remaining key reachable
    big = [*keys, *colliding_keys(9, 300), *(rng.getrandbits(64) for _ in range(3000))]
    for k in big:
        m[k] = model[k] = k % 5 + 1
    assert_same(m, model)
    rng.shuffle(big)
    for i, k in enumerate(big):
        assert m.pop(k, None) == model.pop(k, None)
        if i % 97 == 0:
            assert_same(m, model)
    assert len(m) == 0
    assert list(m.items()) == []
    run_ops(m, model, rng, keys, 2000)  # still a working map once emptied


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["set", "pop", "get"]),
            st.one_of(
                st.sampled_from([0, U64_MAX, *colliding_keys(3, 12)]), st.integers(0, U64_MAX)
            ),
            st.sampled_from(VALUES),
        ),
        max_size=120,
    )
)
def test_block_map_matches_a_dict_model(ops: list[tuple[str, int, int]]) -> None:
    m, model = accel_module("c").BlockMap(), {}
    for op, k, v in ops:
        if op == "set":
            m[k] = model[k] = v
        elif op == "pop":
            assert m.pop(k, None) == model.pop(k, None)
        else:
            assert m.get(k) == model.get(k)
        assert len(m) == len(model)
    assert_same(m, model)
    for k in model:
        assert m[k] == model[k]


def test_block_map_items_is_an_iterator_that_notices_changes(
    block_map: Callable[[], Any],
) -> None:
    m = block_map()
    for k in range(100):
        m[k] = k + 1
    snapshot = list(m.items())  # materialized: the caller may mutate freely afterwards
    for k, v in snapshot:
        m[k] = v * 2
        if k % 2:
            del m[k]
    assert sorted(m.items()) == [(k, 2 * (k + 1)) for k in range(0, 100, 2)]
    it = m.items()
    next(it)
    for k, v in list(m.items()):
        m[k] = v + 1  # overwriting values moves nothing: the iterator goes on
    assert len(list(it)) == 49
    it = m.items()
    next(it)
    m[1000] = 1  # an entry comes: like a dict's, the iterator refuses to go on
    with pytest.raises(RuntimeError):
        next(it)
    it = m.items()
    next(it)
    m.pop(1000)
    with pytest.raises(RuntimeError):
        next(it)
    assert list(block_map().items()) == []


def test_block_map_holds_its_values_and_no_more(block_map: Callable[[], Any]) -> None:
    value = (1 << 90) | 12345  # a private object: only this test holds it
    other = (1 << 91) | 1
    base = sys.getrefcount(value)
    m = block_map()
    m[1] = value
    m[2] = value
    assert sys.getrefcount(value) == base + 2
    m[1] = other  # overwrite releases the old value
    assert sys.getrefcount(value) == base + 1
    got = m.pop(2)
    assert got is value
    del got
    assert sys.getrefcount(value) == base
    m[3] = value
    assert m.get(3) is value and m[3] is value
    assert accel_module("c").lookup_runs(m, [3, 3, 1]) == [(value, 2), (other, 1)]
    items = list(m.items())
    del items
    assert sys.getrefcount(value) == base + 1
    del m[3]
    assert sys.getrefcount(value) == base
    m[4] = value
    for k in colliding_keys(2, 50):  # growth moves references, never adds any
        m[k] = other
    assert sys.getrefcount(value) == base + 1
    base_other = sys.getrefcount(other)
    del m  # dealloc releases every value
    assert sys.getrefcount(value) == base
    assert sys.getrefcount(other) == base_other - 51


@pytest.mark.parametrize(
    ("key", "error"),
    [(-1, OverflowError), (1 << 64, OverflowError), ("1", TypeError), (1.0, TypeError)],
)
def test_block_map_rejects_bad_keys(
    block_map: Callable[[], Any], key: object, error: type[Exception]
) -> None:
    m = block_map()
    m[1] = 1
    calls: list[Callable[[], object]] = [
        lambda: m.get(key),
        lambda: m.get(key, 0),
        lambda: m.pop(key, None),
        lambda: m[key],
        lambda: m.__setitem__(key, 1),
        lambda: m.__delitem__(key),
        lambda: key in m,
        lambda: m._slot(key),
    ]
    for call in calls:
        with pytest.raises(error):
            call()
    assert len(m) == 1


def test_block_map_rejects_bad_values_and_arguments(block_map: Callable[[], Any]) -> None:
    m = block_map()
    for value in ("1", 1.0, None, True, [1]):  # exact ints only (bool is a subclass)
        with pytest.raises(TypeError):
            m[1] = value
    assert len(m) == 0
    with pytest.raises(TypeError):
        m.get()
    with pytest.raises(TypeError):
        m.pop(1, 2, 3)
    with pytest.raises(TypeError):
        block_map(5)
    with pytest.raises(TypeError):
        hash(m)


def test_block_map_memory_is_traced_and_reported(block_map: Callable[[], Any]) -> None:
    m = block_map()
    empty = sys.getsizeof(m)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        for k in range(20000):
            m[k] = 1
        traced = tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()
    size = sys.getsizeof(m)
    assert size >= empty + 16 * 20000 / 0.7  # 16-byte slots, at most 70% full
    assert size <= empty + 16 * 20000 / 0.35 + 1024
    assert traced >= size - empty  # the slot array comes from PyMem: tracemalloc sees it
    assert not gc.is_tracked(m)  # it only ever holds ints


def test_new_block_map(impl: ModuleType) -> None:
    table = impl.new_block_map()
    assert len(table) == 0
    assert type(table) is (dict if impl.IMPLEMENTATION == "python" else impl.BlockMap)
    assert impl.new_block_map() is not table


def dict_and_map(entries: dict[int, int]) -> tuple[dict[int, int], Any]:
    m = accel_module("c").BlockMap()
    for k, v in entries.items():
        m[k] = v
    return entries, m


def test_lookup_runs_on_a_block_map_groups_and_stops_at_a_miss() -> None:
    c = accel_module("c")
    _, m = dict_and_map({1: 5, 2: 5, 3: 7, 4: 5, 6: 9, 7: 0, 0: 5, U64_MAX: 5})
    assert c.lookup_runs(m, [1, 2, 3, 4, 5, 6]) == [(5, 2), (7, 1), (5, 1)]
    assert c.lookup_runs(m, [6, 7, 6]) == [(9, 1)]
    assert c.lookup_runs(m, [0, U64_MAX, 1]) == [(5, 3)]
    assert c.lookup_runs(m, []) == []
    assert c.lookup_runs(c.BlockMap(), [1, 2]) == []
    assert c.lookup_runs(m, iter([1, 2, 3])) == [(5, 2), (7, 1)]
    assert c.lookup_runs(m, (1,) * 5000) == [(5, 5000)]  # past the on-stack key buffer


def test_lookup_runs_on_a_block_map_raises_for_a_bad_key_only_if_it_gets_there() -> None:
    """Keys are converted ahead of the walk, but an error is raised only where a dict walk
    would have looked: a key after the first miss is never looked at."""
    c = accel_module("c")
    _, m = dict_and_map({1: 5, 2: 5})
    assert c.lookup_runs(m, [1, 3, -1]) == [(5, 1)]
    assert c.lookup_runs(m, [1, 3, "x"]) == [(5, 1)]
    with pytest.raises(OverflowError):
        c.lookup_runs(m, [1, 2, -1, 3])
    with pytest.raises(OverflowError):
        c.lookup_runs(m, [1, 2, 1 << 64])
    with pytest.raises(TypeError):
        c.lookup_runs(m, [1, 2, "x"])
    with pytest.raises(TypeError):
        c.lookup_runs(m, ["x"])
    with pytest.raises(TypeError):
        c.lookup_runs(m, [1] * 2000 + [None])  # past the on-stack key buffer
    assert c.lookup_runs(m, [1] * 2000 + [4, None]) == [(5, 2000)]
    with pytest.raises(TypeError):
        c.lookup_runs(m, 5)


@settings(max_examples=300, deadline=None)
@given(
    entries=st.dictionaries(
        st.one_of(st.integers(0, 30), st.sampled_from([U64_MAX, *colliding_keys(7, 8)])),
        st.one_of(st.sampled_from([*WIDE, 0]), st.integers(0, 1 << 100)),
    ),
    picks=st.lists(st.integers(0, 40), max_size=60),
    copy_values=st.booleans(),
    repeat=st.integers(1, 40),
)
def test_lookup_runs_block_map_and_dict_identical(
    entries: dict[int, int], picks: list[int], copy_values: bool, repeat: int
) -> None:
    if copy_values:  # break identity: only equality says two values are the same
        entries = {h: int(str(v)) for h, v in entries.items()}
    pool = [*sorted(entries), 31, 32]
    hashes = [pool[p % len(pool)] for p in picks for _ in range(repeat)]  # long runs too
    c, py = both()
    d, m = dict_and_map(entries)
    got = c.lookup_runs(m, hashes)
    assert got == c.lookup_runs(d, hashes) == py.lookup_runs(d, hashes)
    assert got == reference_runs(entries, hashes)


# -- which implementation runs ------------------------------------------------------------


def test_ci_loads_the_c_extension() -> None:
    """Under CI=true the build must have produced router._accel and router.accel must use
    it: a silent fallback to Python would pass every other test and lose the speed."""
    if not in_ci():
        pytest.skip("outside CI the pure-Python fallback is allowed")
    if os.environ.get("WARMGATE_NATIVE", "").lower() == "python":
        pytest.fail("WARMGATE_NATIVE=python is set in CI: the C extension goes untested")
    accel_module("c")  # fails with the import error when it was not built
    assert accel.IMPLEMENTATION == "c", accel.REASON
    assert accel.REASON == "C extension loaded"


def test_warmgate_native_python_forces_the_fallback() -> None:
    code = "from router import accel; print(accel.IMPLEMENTATION, accel.hash_blocks.__module__)"
    env = {**os.environ, "WARMGATE_NATIVE": "python"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split() == ["python", "router._accel_py"]
