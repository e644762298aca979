"""router.accel: the C extension `router._accel` and the pure-Python `router._accel_py` give
the same results (bit for bit, against the xxhash package and a plain model) and the same
errors; under CI=true the C one is what `router.accel` loads."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable
from types import ModuleType

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
        (([], [1]), TypeError),  # blocks must be a dict
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
