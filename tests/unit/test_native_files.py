"""Batched file I/O of tierd.native (C and pure Python) on real files: whole and partial
slices, short reads at end of file, missing files (-ENOENT), O_DIRECT with aligned and
unaligned slices, and buffered fallback where a filesystem refuses O_DIRECT."""

from __future__ import annotations

import errno
import os
import random
from pathlib import Path
from types import ModuleType

import pytest

from tests.unit.native_impls import impl

__all__ = ["impl"]


def write_files(root: Path, blobs: list[bytes]) -> list[Path]:
    paths = []
    for i, blob in enumerate(blobs):
        path = root / f"slice-{i}.bin"
        path.write_bytes(blob)
        paths.append(path)
    return paths


@pytest.mark.parametrize("direct", [False, True])
def test_read_batch_whole_files(impl: ModuleType, tmp_path: Path, direct: bool) -> None:
    rng = random.Random(11)
    sizes = [4096, 8192, 5000, 1, 0, 12_289]  # aligned and not
    blobs = [rng.randbytes(s) for s in sizes]
    paths = write_files(tmp_path, blobs)
    dst = impl.HostArena(1 << 17)
    offs = [i * 16384 for i in range(len(sizes))]
    offs[3] += 3  # an unaligned destination
    status = impl.read_batch(paths, dst, offs, sizes, direct=direct, threads=4)
    assert status == sizes
    for off, blob in zip(offs, blobs, strict=True):
        assert dst.read(off, len(blob)) == blob


@pytest.mark.parametrize("direct", [False, True])
def test_partial_reads_at_offsets_and_short_reads(
    impl: ModuleType, tmp_path: Path, direct: bool
) -> None:
    blob = random.Random(2).randbytes(10_000)
    (path,) = write_files(tmp_path, [blob])
    dst = bytearray(b"\xaa" * 30_000)
    file_offs = [0, 4097, 9_990, 12_000, 8192]
    sizes = [100, 3000, 100, 50, 4096]
    offs = [0, 1000, 5000, 6000, 20_000]
    status = impl.read_batch([path] * 5, dst, offs, sizes, file_offs, direct=direct)
    assert status == [100, 3000, 10, 0, 10_000 - 8192]  # short reads past the end
    assert dst[0:100] == blob[0:100]
    assert dst[1000:4000] == blob[4097:7097]
    assert dst[5000:5010] == blob[9990:]
    assert dst[5010:5100] == b"\xaa" * 90  # bytes past end of file are left untouched
    assert dst[20_000 : 20_000 + 1808] == blob[8192:]


def test_missing_files_and_directories_report_errno(impl: ModuleType, tmp_path: Path) -> None:
    (good,) = write_files(tmp_path, [b"hello"])
    dst = bytearray(64)
    paths = [tmp_path / "missing", good, tmp_path, str(tmp_path / "no" / "such")]
    status = impl.read_batch(paths, dst, [0, 10, 20, 30], [5, 5, 5, 5])
    assert status[0] == -errno.ENOENT and status[1] == 5 and status[3] == -errno.ENOENT
    assert status[2] == -errno.EISDIR
    assert dst[10:15] == b"hello"


@pytest.mark.parametrize("direct", [False, True])
def test_write_batch_then_read_back(impl: ModuleType, tmp_path: Path, direct: bool) -> None:
    rng = random.Random(4)
    src = impl.HostArena(1 << 16)
    memoryview(src)[:] = rng.randbytes(1 << 16)
    sizes = [8192, 4096 + 17, 33, 0]
    offs = [0, 8192 + 5, 30_000, 40_000]  # aligned, unaligned source
    paths = [tmp_path / f"w{i}" for i in range(4)]
    (tmp_path / "w0").write_bytes(b"x" * 20_000)  # truncated to the new size
    status = impl.write_batch(paths, src, offs, sizes, direct=direct, fsync=True)
    assert status == sizes
    for path, off, size in zip(paths, offs, sizes, strict=True):
        assert path.read_bytes() == src.read(off, size)


def test_write_at_file_offsets_keeps_the_rest(impl: ModuleType, tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"." * 20)
    status = impl.write_batch([path, path], b"ABCDEFGH", [0, 4], [2, 4], [3, 30])
    assert status == [2, 4]
    data = path.read_bytes()
    assert data[:20] == b"...AB" + b"." * 15 and data[30:34] == b"EFGH" and len(data) == 34


def test_write_errors_report_errno(impl: ModuleType, tmp_path: Path) -> None:
    status = impl.write_batch([tmp_path / "no" / "dir" / "f"], b"data", [0], [4])
    assert status == [-errno.ENOENT]


def test_file_batch_argument_checks(impl: ModuleType, tmp_path: Path) -> None:
    (path,) = write_files(tmp_path, [b"0123456789"])
    with pytest.raises(IndexError):
        impl.read_batch([path], bytearray(8), [0], [9])
    with pytest.raises(ValueError, match="overlap"):
        impl.read_batch([path, path], bytearray(8), [0, 2], [4, 4])
    with pytest.raises(ValueError):
        impl.read_batch([path], bytearray(8), [0, 1], [1, 1])
    with pytest.raises(ValueError):
        impl.read_batch([path], bytearray(8), [0], [4], [-1])
    with pytest.raises(TypeError):
        impl.read_batch([path], b"readonly", [0], [4])
    with pytest.raises(TypeError):
        impl.read_batch([123], bytearray(8), [0], [4])


def test_probe_direct_and_direct_reads_where_refused(impl: ModuleType, tmp_path: Path) -> None:
    ok, why = impl.probe_direct(tmp_path)
    assert isinstance(ok, bool) and (ok or why)
    shm = Path("/dev/shm")
    roots = [tmp_path] + ([shm] if shm.is_dir() and os.access(shm, os.W_OK) else [])
    for root in roots:
        d = root / f"wg-native-test-{os.getpid()}" if root == shm else root / "sub"
        d.mkdir()
        try:
            ok, why = impl.probe_direct(d)
            blob = random.Random(1).randbytes(9000)
            paths = write_files(d, [blob])
            dst = impl.HostArena(16384)
            # Where O_DIRECT is refused the read still succeeds, buffered.
            assert impl.read_batch(paths, dst, [0], [9000], direct=True) == [9000]
            assert dst.read(0, 9000) == blob
        finally:
            for p in d.iterdir():
                p.unlink()
            d.rmdir()


def test_drop_page_cache(impl: ModuleType, tmp_path: Path) -> None:
    paths = write_files(tmp_path, [b"a" * 5000, b"b"])
    assert impl.drop_page_cache([*paths, tmp_path / "missing"]) == [0, 0, -errno.ENOENT]
