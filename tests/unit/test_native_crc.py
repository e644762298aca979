"""CRC-32C of tierd.native: published check values (RFC 3720 B.4), the hardware and software
paths of the C extension and the pure-Python fallback against a bitwise reference."""

from __future__ import annotations

import random
from types import ModuleType

import pytest

from tests.unit.native_impls import c_extension, impl
from tierd.native import _fallback

__all__ = ["impl"]


def reference_crc32c(data: bytes, crc: int = 0) -> int:
    """Bit by bit, straight from the definition (reflected polynomial 0x82F63B78)."""
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


CHECK_VALUES = [
    (b"123456789", 0xE3069283),
    (bytes(32), 0x8A9136AA),
    (b"\xff" * 32, 0x62A8AB43),
    (bytes(range(32)), 0x46DD794E),
    (bytes(range(31, -1, -1)), 0x113FDB5C),
    (b"", 0),
]


@pytest.mark.parametrize(("data", "expect"), CHECK_VALUES)
def test_check_values(impl: ModuleType, data: bytes, expect: int) -> None:
    assert impl.crc32c(data) == expect
    assert reference_crc32c(data) == expect


def test_random_data_hw_sw_fallback_and_reference_agree() -> None:
    native = c_extension()
    rng = random.Random(5)
    blob = bytes(rng.getrandbits(8) for _ in range(5000))
    for _ in range(30):
        off = rng.randint(0, 4000)  # unaligned starts
        size = rng.randint(0, len(blob) - off)
        want = reference_crc32c(blob[off : off + size])
        assert native.crc32c(blob, off, size) == want
        assert native.crc32c(blob, off, size, software=True) == want
        assert _fallback.crc32c(blob, off, size) == want


def test_chaining_and_defaults(impl: ModuleType) -> None:
    data = bytes(range(256)) * 7
    whole = impl.crc32c(data)
    head = impl.crc32c(data, 0, 1000)
    assert impl.crc32c(data, 1000, value=head) == whole
    assert impl.crc32c(memoryview(data)[1000:], value=head) == whole
    assert impl.crc32c(data, len(data)) == 0  # empty range at the end


def test_batch(impl: ModuleType) -> None:
    rng = random.Random(9)
    blob = bytes(rng.getrandbits(8) for _ in range(3000))
    offs = [rng.randint(0, 2000) for _ in range(20)]
    sizes = [rng.randint(0, 1000) for _ in range(20)]
    got = impl.crc32c_batch(blob, offs, sizes)
    assert got == [reference_crc32c(blob[o : o + s]) for o, s in zip(offs, sizes, strict=True)]


def test_large_batch_in_parallel_matches_single() -> None:
    native = c_extension()
    blob = random.Random(3).randbytes(6 << 20)
    offs = [i * (1 << 20) + 7 for i in range(5)]
    sizes = [(1 << 20) - 3] * 5
    want = [native.crc32c(blob, o, s, software=True) for o, s in zip(offs, sizes, strict=True)]
    assert native.crc32c_batch(blob, offs, sizes, threads=2) == want


@pytest.mark.parametrize(
    ("args", "exc"),
    [((0, 101), IndexError), ((101,), IndexError), ((-1, 2), ValueError), ((0, -2), ValueError)],
)
def test_out_of_range_refused(
    impl: ModuleType, args: tuple[int, ...], exc: type[Exception]
) -> None:
    with pytest.raises(exc):
        impl.crc32c(bytes(100), *args)
    with pytest.raises((IndexError, ValueError)):
        impl.crc32c_batch(bytes(100), [50], [51])


@pytest.mark.parametrize("size", [12_287, 12_288, 12_289, 24_583, 100_003])
def test_hardware_lanes_match_software_on_long_inputs(size: int) -> None:
    """Long inputs take the 3-lane hardware loop (joined by multiplication modulo P)."""
    native = c_extension()
    blob = random.Random(size).randbytes(size + 16)
    for off in (0, 3, 13):
        want = native.crc32c(blob, off, size, software=True)
        assert native.crc32c(blob, off, size) == want
        assert native.crc32c(blob, off, size, value=0x12345678) == native.crc32c(
            blob, off, size, value=0x12345678, software=True
        )
    assert native.crc32c(blob, 0, 3000) == reference_crc32c(blob[:3000])
