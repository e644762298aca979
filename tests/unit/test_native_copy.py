"""copy_batch and the arenas of tierd.native, C and pure Python, against bytearray slicing on
random data: odd sizes, unaligned offsets, overlaps and out-of-range arguments refused."""

from __future__ import annotations

import random
from concurrent.futures import ThreadPoolExecutor
from types import ModuleType

import numpy as np
import pytest

from tests.unit.native_impls import c_extension, impl
from tierd.native import _fallback

__all__ = ["impl"]


def random_batch(
    rng: random.Random, dst_len: int, src_len: int, n: int, max_size: int
) -> tuple[list[int], list[int], list[int]]:
    """n non-overlapping destination slices (odd sizes, unaligned), sources anywhere."""
    sizes = [rng.randint(0, max_size) for _ in range(n)]
    cuts = sorted(rng.sample(range(dst_len - sum(sizes)), n))
    dst_offs, pos = [], 0
    for cut, size in zip(cuts, sizes, strict=True):
        dst_offs.append(pos + cut)
        pos += size
    order = list(range(n))
    rng.shuffle(order)
    src_offs = [rng.randint(0, src_len - sizes[i]) for i in range(n)]
    return [dst_offs[i] for i in order], [src_offs[i] for i in order], [sizes[i] for i in order]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_copy_batch_matches_reference(impl: ModuleType, seed: int) -> None:
    rng = random.Random(seed)
    src = bytes(rng.getrandbits(8) for _ in range(1 << 16))
    dst = impl.HostArena(50_001)
    memoryview(dst)[:] = b"\xee" * 50_001
    doffs, soffs, sizes = random_batch(rng, 50_001, len(src), 40, 997)
    expect = bytearray(b"\xee" * 50_001)
    for d, s, n in zip(doffs, soffs, sizes, strict=True):
        expect[d : d + n] = src[s : s + n]
    assert impl.copy_batch(dst, doffs, src, soffs, sizes) == sum(sizes)
    assert bytes(memoryview(dst)) == bytes(expect)


def test_large_batch_uses_threads_and_matches(impl: ModuleType) -> None:
    rng = np.random.default_rng(7)
    nbytes = 12 << 20  # above the size where the C side goes parallel
    src = impl.HostArena(nbytes)
    memoryview(src)[:] = rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes()
    dst = bytearray(nbytes)
    slice_bytes = (1 << 20) + 13  # odd size, and each slice spans two copy chunks
    n = nbytes // slice_bytes
    offs = [i * slice_bytes for i in range(n)]
    reverse = list(reversed(offs))
    impl.copy_batch(dst, offs, src, reverse, [slice_bytes] * n, threads=3)
    for d, s in zip(offs, reverse, strict=True):
        assert dst[d : d + slice_bytes] == memoryview(src)[s : s + slice_bytes]


def test_copy_into_numpy_and_memoryview_slices(impl: ModuleType) -> None:
    arr = np.zeros(100, dtype=np.uint8)
    impl.copy_batch(arr, [3, 50], b"abcdefgh", [0, 4], [4, 4])
    assert arr[3:7].tobytes() == b"abcd" and arr[50:54].tobytes() == b"efgh"
    big = bytearray(64)
    view = memoryview(big)[10:40]
    impl.copy_batch(view, [29], b"Z", [0], [1])
    assert big[39:40] == b"Z"


@pytest.mark.parametrize(
    ("doffs", "soffs", "sizes"),
    [
        ([0, 10], [0, 0], [11, 5]),  # destinations overlap
        ([5, 0], [0, 20], [3, 6]),  # overlap, given out of order
    ],
)
def test_overlapping_destinations_refused(
    impl: ModuleType, doffs: list[int], soffs: list[int], sizes: list[int]
) -> None:
    dst = bytearray(64)
    with pytest.raises(ValueError, match="overlap"):
        impl.copy_batch(dst, doffs, bytes(64), soffs, sizes)
    assert dst == bytearray(64)  # nothing moved


def test_source_overlapping_destination_in_same_memory_refused(impl: ModuleType) -> None:
    arena = impl.HostArena(4096)
    memoryview(arena)[:8] = b"12345678"
    with pytest.raises(ValueError, match="overlaps a source"):
        impl.copy_batch(arena, [4], arena, [0], [8])
    view = memoryview(arena)
    with pytest.raises(ValueError, match="overlaps a source"):
        impl.copy_batch(view[100:], [0], view, [90, 0][:1], [20])
    del view
    # Disjoint ranges of the same memory are fine; touching ends do not overlap.
    impl.copy_batch(arena, [8, 100], arena, [0, 92], [8, 8])
    assert arena.read(8, 8) == b"12345678"
    # Overlapping sources are fine: they are only read.
    impl.copy_batch(arena, [200, 300], arena, [0, 2], [8, 8])
    assert arena.read(300, 6) == b"345678"


@pytest.mark.parametrize(
    ("doffs", "soffs", "sizes", "exc"),
    [
        ([60], [0], [5], IndexError),  # past the end of dst
        ([0], [30], [3], IndexError),  # past the end of src
        ([64], [0], [1], IndexError),
        ([-1], [0], [1], ValueError),
        ([0], [0], [-4], ValueError),
        ([0, 1], [0], [1, 1], ValueError),  # lengths differ
        ([2**70], [0], [1], (IndexError, OverflowError)),
        (["a"], [0], [1], TypeError),
    ],
)
def test_bad_arguments_refused(
    impl: ModuleType,
    doffs: list[int],
    soffs: list[int],
    sizes: list[int],
    exc: type[Exception] | tuple[type[Exception], ...],
) -> None:
    dst = bytearray(64)
    with pytest.raises(exc):
        impl.copy_batch(dst, doffs, bytes(32), soffs, sizes)
    assert dst == bytearray(64)


def test_read_only_or_strided_buffers_refused(impl: ModuleType) -> None:
    with pytest.raises(TypeError, match="writable"):
        impl.copy_batch(b"immutable", [0], b"x", [0], [1])
    strided = np.zeros(20, dtype=np.uint8)[::2]
    with pytest.raises(TypeError):
        impl.copy_batch(strided, [0], b"x", [0], [1])
    with pytest.raises(TypeError):
        impl.copy_batch(bytearray(4), [0], 12345, [0], [1])
    with pytest.raises(ValueError):
        impl.copy_batch(bytearray(4), [0], b"x", [0], [1], threads=-1)


def test_empty_batch_and_zero_sizes(impl: ModuleType) -> None:
    dst = bytearray(8)
    assert impl.copy_batch(dst, [], b"", [], []) == 0
    assert impl.copy_batch(dst, [8, 8], b"ab", [2, 0], [0, 0]) == 0  # offset == len, size 0
    assert dst == bytearray(8)


def test_memcpy_single(impl: ModuleType) -> None:
    dst = impl.HostArena(100)
    impl.memcpy_single(dst, 10, b"0123456789", 2, 5)
    assert dst.read(10, 5) == b"23456"
    with pytest.raises(IndexError):
        impl.memcpy_single(dst, 99, b"0123456789", 0, 2)
    with pytest.raises(ValueError):
        impl.memcpy_single(dst, 0, dst, 1, 10)


def test_host_arena(impl: ModuleType) -> None:
    arena = impl.HostArena(10_000, pinned=True)
    assert (arena.nbytes, len(arena), arena.backend) == (10_000, 10_000, "host")
    assert isinstance(arena.pinned, bool)
    view = memoryview(arena)
    assert view.nbytes == 10_000 and not view.readonly and bytes(view[:16]) == bytes(16)
    assert np.frombuffer(arena, dtype=np.uint8).__array_interface__["data"][0] % 4096 == 0
    arena.write(9_990, b"0123456789")
    assert arena.read(9_995, 5) == b"56789"
    with pytest.raises(IndexError):
        arena.write(9_991, b"0123456789")
    with pytest.raises(IndexError):
        arena.read(9_999, 2)
    with pytest.raises(BufferError):
        arena.close()  # a view is alive: the memory must stay
    view.release()
    arena.close()
    with pytest.raises(ValueError):
        arena.read(0, 1)
    with pytest.raises(ValueError):
        impl.copy_batch(arena, [0], b"x", [0], [1])
    with pytest.raises(ValueError):
        impl.HostArena(0)


def test_c_and_fallback_agree_on_random_batches() -> None:
    native = c_extension()
    rng = random.Random(42)
    src = bytes(rng.getrandbits(8) for _ in range(20_000))
    for _ in range(5):
        doffs, soffs, sizes = random_batch(rng, 30_000, len(src), 25, 800)
        a, b = bytearray(30_000), bytearray(30_000)
        native.copy_batch(a, doffs, src, soffs, sizes)
        _fallback.copy_batch(b, doffs, src, soffs, sizes)
        assert a == b


@pytest.mark.parametrize("backend", ["cuda", "hip"])
def test_device_arena_round_trip_or_refusal(impl: ModuleType, backend: str) -> None:
    """With a device: H2D, D2D and D2H slices come back intact. Without: a clear refusal."""
    if not impl.backends()[backend]["usable"]:
        with pytest.raises(RuntimeError, match=backend):
            impl.DeviceArena(4096, backend)
        return
    rng = random.Random(8)
    src = impl.HostArena(1 << 20, pinned=True)
    memoryview(src)[:] = rng.randbytes(1 << 20)
    back = bytearray(1 << 20)
    with impl.DeviceArena(2 << 20, backend) as dev:
        doffs, soffs, sizes = random_batch(rng, 1 << 20, 1 << 20, 64, 4099)
        impl.copy_batch(dev, doffs, src, soffs, sizes)
        impl.copy_batch(dev, [(1 << 20) + d for d in doffs], dev, doffs, sizes)
        impl.copy_batch(back, doffs, dev, [(1 << 20) + d for d in doffs], sizes)
        for d, s, n in zip(doffs, soffs, sizes, strict=True):
            assert back[d : d + n] == memoryview(src)[s : s + n]
        with pytest.raises(ValueError, match="overlap"):
            impl.copy_batch(dev, [0], dev, [10], [100])
        with pytest.raises(IndexError):
            impl.copy_batch(dev, [2 << 20], src, [0], [1])
        dev.write(5, b"device")
        assert dev.read(5, 6) == b"device"


def test_concurrent_batches_from_many_threads(impl: ModuleType) -> None:
    """The GIL is released while bytes move: batches from several threads at once all land."""
    src = impl.HostArena(8 << 20)
    memoryview(src)[:] = random.Random(3).randbytes(8 << 20)
    dsts = [bytearray(8 << 20) for _ in range(4)]
    offs = [i << 20 for i in range(8)]

    def work(dst: bytearray) -> int:
        total = 0
        for _ in range(3):
            total += impl.copy_batch(dst, offs, src, list(reversed(offs)), [1 << 20] * 8)
        return total

    with ThreadPoolExecutor(max_workers=4) as pool:
        assert list(pool.map(work, dsts)) == [3 * (8 << 20)] * 4
    for dst in dsts:
        assert dst[: 1 << 20] == memoryview(src)[7 << 20 :]


def brute_force_overlap(
    doffs: list[int], soffs: list[int] | None, sizes: list[int], shift: int
) -> bool:
    """O(n^2) reference: any two destinations, or a destination and a source (`shift` bytes
    apart in the same memory), share a byte."""
    dst = [(d, d + n) for d, n in zip(doffs, sizes, strict=True) if n]
    if any(a[0] < b[1] and b[0] < a[1] for i, a in enumerate(dst) for b in dst[i + 1 :]):
        return True
    if soffs is None:
        return False
    src = [(s + shift, s + shift + n) for s, n in zip(soffs, sizes, strict=True) if n]
    return any(a[0] < b[1] and b[0] < a[1] for a in dst for b in src)


@pytest.mark.parametrize("shift", [0, 37])
def test_overlap_decisions_match_brute_force(impl: ModuleType, shift: int) -> None:
    """Random small batches within one arena: refused exactly when the reference says so."""
    rng = random.Random(100 + shift)
    arena = impl.HostArena(400)
    view = memoryview(arena)
    dst_view, src_view = view[shift:], view
    refused = accepted = 0
    for _ in range(300):
        n = rng.randint(1, 6)
        sizes = [rng.randint(0, 12) for _ in range(n)]
        doffs = [rng.randint(0, 300) for _ in range(n)]
        soffs = [rng.randint(0, 300) for _ in range(n)]
        expect = brute_force_overlap(doffs, soffs, sizes, -shift)
        try:
            impl.copy_batch(dst_view, doffs, src_view, soffs, sizes)
            accepted += 1
            assert not expect, (doffs, soffs, sizes)
        except ValueError:
            refused += 1
            assert expect, (doffs, soffs, sizes)
    assert refused > 20 and accepted > 20  # both outcomes were exercised
    del dst_view, src_view
    view.release()
